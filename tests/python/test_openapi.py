"""The OpenAPI document at /openapi.json is valid OpenAPI, and every operation it lists is routed by the server."""

import json
import re
import urllib.error
import urllib.request

from openapi_spec_validator import validate


def fetch(url, method="GET", body=None):
    request = urllib.request.Request(url, method=method, data=body)
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_document_is_valid_openapi(server_url):
    status, body = fetch(f"http://{server_url}/openapi.json")
    assert status == 200
    document = json.loads(body)
    validate(document)
    assert document["openapi"].startswith("3.")
    assert "api_key" in document["components"]["securitySchemes"]


def test_every_documented_operation_is_routed(server_url):
    document = json.loads(fetch(f"http://{server_url}/openapi.json")[1])
    operations = [(path, method) for path, item in document["paths"].items() for method in item]
    assert len(operations) >= 18
    for path, method in operations:
        concrete = re.sub(r"\{version\}", "1", re.sub(r"\{(model|name)\}", "digits", path))
        body = b"{}" if method == "post" else None
        status, answer = fetch(f"http://{server_url}{concrete}", method.upper(), body)
        # The router's fallback says "no such route"; 405 means the method is not routed. Anything else is the
        # route itself answering (a 400 for the empty body included).
        assert status != 405, (method, path)
        if status == 404:
            assert b"no such route" not in answer, (method, path)


def test_swagger_ui_is_served_from_the_binary(server_url):
    status, page = fetch(f"http://{server_url}/docs/")
    assert status == 200
    assert b"swagger-ui" in page
    status, _ = fetch(f"http://{server_url}/docs/swagger-ui-bundle.js")
    assert status == 200
