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


def strict(schema):
    """The schema, with objects that list their properties closed to others: a served field the document does
    not describe then fails validation, as a missing or mistyped one does."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def documented_schema(document, method, path, status):
    """The JSON schema the document gives for `status` of the operation that routes `path`, with the
    document's components, or None when that answer has no JSON body."""
    for template, item in document["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path) and method in item:
            responses = item[method]["responses"]
            assert str(status) in responses, f"{method} {path} answered {status}, which the document does not list"
            content = responses[str(status)].get("content", {})
            if "application/json" not in content:
                return template, None
            schema = dict(content["application/json"]["schema"])
            schema["components"] = document["components"]
            return template, strict(schema)
    raise AssertionError(f"{method} {path} is not in the document")


def test_every_answer_matches_its_documented_schema(server_url):
    """Real answers, successes and errors, of every documented operation, against the published schema."""
    from jsonschema import Draft202012Validator

    document = json.loads(fetch(f"http://{server_url}/openapi.json")[1])
    pixels = [float(i % 17) for i in range(64)]
    v2 = json.dumps({"id": "a", "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": pixels}]})
    predict = json.dumps({"input": [pixels]})
    cases = [
        ("get", "/health", None, 200),
        ("get", "/health/live", None, 200),
        ("get", "/health/ready", None, 200),
        ("get", "/metrics", None, 200),
        ("get", "/v2", None, 200),
        ("get", "/v2/health/live", None, 200),
        ("get", "/v2/health/ready", None, 200),
        ("post", "/v2/repository/index", b"", 200),
        ("post", "/v2/repository/index", b"{\"ready\": 3}", 400),
        # This server runs with --model-control none: model control says so (test_third_party.py loads and unloads).
        ("post", "/v2/repository/models/digits/load", b"", 400),
        ("post", "/v2/repository/models/digits/unload", b"", 400),
        ("get", "/v2/models/digits", None, 200),
        ("get", "/v2/models/nope", None, 404),
        ("get", "/v2/models/digits/versions/1", None, 200),
        ("get", "/v2/models/digits/versions/2", None, 404),
        ("get", "/v2/models/digits/ready", None, 200),
        ("get", "/v2/models/nope/ready", None, 404),
        ("get", "/v2/models/digits/versions/1/ready", None, 200),
        ("get", "/v2/models/digits/versions/2/ready", None, 404),
        ("get", "/v2/models/digits/config", None, 200),
        ("get", "/v2/models/nope/config", None, 404),
        ("get", "/v2/models/digits/versions/1/config", None, 200),
        ("get", "/v2/models/digits/versions/2/config", None, 404),
        ("get", "/v2/models/stats", None, 200),
        ("get", "/v2/models/digits/stats", None, 200),
        ("get", "/v2/models/nope/stats", None, 404),
        ("get", "/v2/models/digits/versions/1/stats", None, 200),
        ("get", "/v2/models/digits/versions/2/stats", None, 404),
        ("post", "/v2/models/digits/infer", v2.encode(), 200),
        ("post", "/v2/models/digits/infer", b"{\"inputs\": []}", 400),
        ("post", "/v2/models/nope/infer", v2.encode(), 404),
        ("post", "/v2/models/digits/versions/1/infer", v2.encode(), 200),
        ("post", "/v2/models/digits/versions/2/infer", v2.encode(), 404),
        ("post", "/models/digits/predict", predict.encode(), 200),
        ("post", "/models/digits/predict", b"{\"input\": [[1]]}", 400),
        ("post", "/models/nope/predict", predict.encode(), 404),
        # The bundled repository has several models and no default: /predict serves the default classifier, whose
        # TEI body this is not.
        ("post", "/predict", predict.encode(), 400),
        ("post", "/embed", b"{\"inputs\": \"a sentence\"}", 200),
        ("post", "/embed", b"{\"inputs\": []}", 400),
        ("post", "/models/minilm-int8/embed", b"{\"inputs\": [\"a\", \"b c\"]}", 200),
        ("post", "/models/minilm-int8/embed", b"{\"inputs\": [\"\"]}", 400),
        ("post", "/models/nope/embed", b"{\"inputs\": \"a\"}", 404),
        ("post", "/embed_all", b"{\"inputs\": [\"a\", \"b c\"]}", 200),
        ("post", "/models/minilm-int8/embed_all", b"{\"inputs\": \"a\"}", 200),
        ("post", "/models/minilm-int8/embed_all", b"{\"inputs\": []}", 400),
        ("post", "/v1/embeddings", b"{\"model\": \"minilm\", \"input\": [[101, 7592, 102]]}", 200),
        ("post", "/v1/embeddings", b"{\"model\": \"minilm\", \"input\": \"a\", \"encoding_format\": \"base64\"}", 200),
        ("post", "/v1/embeddings", b"{\"model\": \"minilm\", \"input\": \"a\", \"dimensions\": 3}", 200),
        ("post", "/v1/embeddings", b"{\"model\": \"minilm\", \"input\": \"a\", \"dimensions\": 3000}", 400),
        ("post", "/embeddings", b"{\"input\": \"a\"}", 200),
        ("post", "/embed_sparse", b"{\"inputs\": [\"a\", \"b c\"]}", 200),
        ("post", "/models/minilm/embed_sparse", b"{\"inputs\": \"a\"}", 400),
        ("post", "/models/ner", b"{\"inputs\": \"Angela lives in Paris\"}", 200),
        ("post", "/invocations", predict.encode(), 400),
        ("post", "/vertex", b"{\"instances\": []}", 400),
        ("get", "/ping", None, 200),
        ("get", "/", None, 200),
        ("post", "/v1/embeddings", b"{\"model\": \"nope\", \"input\": \"a\"}", 404),
        ("get", "/v1/models", None, 200),
        ("get", "/info", None, 200),
        ("get", "/models/classifier/info", None, 200),
        ("post", "/", b"{\"inputs\": \"a\"}", 200),
        ("post", "/models/reranker", b"{\"query\": \"q\", \"texts\": [\"a\"]}", 200),
        ("post", "/rerank", b"{\"query\": \"q\", \"texts\": [\"a\", \"b\"], \"return_text\": true}", 200),
        ("post", "/rerank", b"{\"query\": \"\", \"texts\": [\"a\"]}", 400),
        ("post", "/models/reranker/rerank", b"{\"query\": \"q\", \"texts\": [\"a\"]}", 200),
        ("post", "/tokenize", b"{\"inputs\": \"a b\"}", 200),
        ("post", "/models/classifier/tokenize", b"{\"inputs\": [\"a\"]}", 200),
        ("post", "/decode", b"{\"ids\": [101, 102]}", 200),
        ("post", "/models/minilm/decode", b"{\"ids\": [[101], [102]]}", 200),
        ("post", "/similarity", b"{\"inputs\": {\"source_sentence\": \"a\", \"sentences\": [\"b\"]}}", 200),
        ("post", "/models/minilm/similarity", b"{\"inputs\": {\"source_sentence\": \"a\", \"sentences\": []}}", 400),
        ("post", "/v1/rerank", b"{\"query\": \"q\", \"documents\": [\"a\"], \"return_documents\": true}", 200),
        ("post", "/v2/rerank", b"{\"model\": \"reranker\", \"query\": \"q\", \"documents\": [\"a\"]}", 200),
        ("post", "/v2/rerank", b"{\"query\": \"q\", \"documents\": []}", 400),
        # Shared memory is off on this server (no --allow-client-shm): test_shared_memory.py registers regions.
        ("get", "/v2/systemsharedmemory/status", None, 200),
        ("get", "/v2/systemsharedmemory/region/r/status", None, 400),
        ("post", "/v2/systemsharedmemory/region/r/register", b"{\"key\": \"/r\", \"byte_size\": 8}", 400),
        ("post", "/v2/systemsharedmemory/region/r/unregister", b"", 200),
        ("post", "/v2/systemsharedmemory/unregister", b"", 200),
        ("get", "/v2/cudasharedmemory/status", None, 200),
        ("get", "/v2/cudasharedmemory/region/r/status", None, 400),
        ("post", "/v2/cudasharedmemory/region/r/register", b"{}", 400),
        ("post", "/v2/cudasharedmemory/region/r/unregister", b"", 200),
        ("post", "/v2/cudasharedmemory/unregister", b"", 200),
        ("get", "/v2/logging", None, 200),
        ("post", "/v2/logging", b"{\"log_verbose_level\": 0}", 200),
        ("post", "/v2/logging", b"{\"log_file\": \"inferd.log\"}", 400),
        ("get", "/v2/trace/setting", None, 200),
        ("post", "/v2/trace/setting", b"{\"trace_rate\": \"1000\"}", 200),
        ("post", "/v2/trace/setting", b"{\"trace_rate\": \"0\"}", 400),
        ("get", "/v2/models/digits/trace/setting", None, 200),
        ("get", "/v2/models/nope/trace/setting", None, 404),
        ("post", "/v2/models/digits/trace/setting", b"{\"trace_rate\": null}", 200),
        ("post", "/v2/models/nope/trace/setting", b"{}", 404),
    ]
    covered = set()
    for method, path, body, want in cases:
        status, answer = fetch(f"http://{server_url}{path}", method.upper(), body)
        assert status == want, (method, path, status, answer[:200])
        template, schema = documented_schema(document, method, path, status)
        covered.add((template, method))
        if schema is not None:
            errors = list(Draft202012Validator(schema).iter_errors(json.loads(answer)))
            assert not errors, (method, path, status, [e.message for e in errors][:3])
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert documented <= covered, f"operations without a checked answer: {sorted(documented - covered)}"
