"""CLIP and SigLIP served from their hub folders (tests/data/clip: tiny models made by make_clip.py, `[candle]
architecture = "clip"`), through the clients people use, against transformers' answers (photos.json, made by
make_photos.py with each model's own image processor on scikit-image's photos, and its zero-shot pipeline):
pictures through `/models/{m}/predict` (raw and in forms), the openai client (`modality: "image"`, data URLs and
base64) and tritonclient (the optional `BYTES` input `image`, over HTTP and gRPC), texts through TEI's /embed, the
openai client and tritonclient (the optional input `text`), zero-shot labels through huggingface_hub's
InferenceClient; and the bad input: texts past the model's 16 positions cut or refused as `truncate` says, pictures
sent to a text model, bombs and truncated files, with memory flat."""

import base64
import concurrent.futures
import json
import shutil

import numpy as np
import openai
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from huggingface_hub import InferenceClient

from conftest import ROOT, launch_inferd, post
from test_architectures import cosines
from test_images import BAD, photo, rss_kib

FIXTURES = ROOT / "tests" / "data" / "clip"
REFS = json.loads((FIXTURES / "photos.json").read_text())
MODELS = ["clip", "siglip"]
TYPES = {"png": "image/png", "jpg": "image/jpeg"}


def data_url(name):
    return f"data:{TYPES[name.rsplit('.', 1)[1]]};base64,{base64.b64encode(photo(name)).decode()}"


@pytest.fixture(scope="module")
def inferd(tmp_path_factory):
    """Both models, and a text-only embedder (the tiny MPNet) that takes no pictures: (process, address, gRPC
    address)."""
    root = tmp_path_factory.mktemp("clip")
    for name in MODELS:
        shutil.copytree(FIXTURES / name, root / name)
    shutil.copytree(ROOT / "tests" / "data" / "architectures" / "mpnet", root / "mpnet")
    proc, address, grpc = launch_inferd(root, "--default-embed-model", "clip", grpc=True)
    try:
        yield proc, address, grpc
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, "inferd exits 0 on SIGTERM"


@pytest.fixture
def server(inferd):
    return inferd[1]


@pytest.mark.parametrize("model", MODELS)
def test_pictures_embed_as_transformers_does(server, model):
    for name, want in REFS[model]["photos"].items():
        r = requests.post(f"http://{server}/models/{model}/predict", data=photo(name),
                          headers={"Content-Type": TYPES[name.rsplit(".", 1)[1]]})
        assert r.status_code == 200, r.text
        [picture] = r.json()["predictions"]
        got = picture["outputs"]["embedding"]
        assert cosines(got, want) >= 0.9999, (model, name, cosines(got, want))
        assert abs(np.linalg.norm(got) - 1.0) < 1e-5, "unit length by default"
    # A body of application/octet-stream is a picture too, for a model that takes them.
    r = requests.post(f"http://{server}/models/{model}/predict", data=photo("rocket.jpg"),
                      headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert cosines(r.json()["predictions"][0]["outputs"]["embedding"], REFS[model]["photos"]["rocket.jpg"]) >= 0.9999
    # Several pictures in one form: each its own vector, in order.
    names = list(REFS[model]["photos"])
    files = [("file", (n, photo(n), TYPES[n.rsplit(".", 1)[1]])) for n in names]
    r = requests.post(f"http://{server}/models/{model}/predict", files=files)
    assert r.status_code == 200, r.text
    got = [p["outputs"]["embedding"] for p in r.json()["predictions"]]
    want = [REFS[model]["photos"][n] for n in names]
    assert (cosines(got, want) >= 0.9999).all(), cosines(got, want)


@pytest.mark.parametrize("model", MODELS)
def test_texts_embed_as_transformers_does_and_long_ones_are_cut_or_refused(server, model):
    texts = list(REFS[model]["texts"])
    want = [REFS[model]["texts"][t] for t in texts]
    # Some are longer than the model's 16 positions with the tiny tokenizer: cut, as the processor cuts them.
    status, got = post(f"http://{server}/models/{model}/embed", {"inputs": texts, "truncate": True})
    assert status == 200, got
    assert (cosines(got, want) >= 0.9999).all(), cosines(got, want)
    status, body = post(f"http://{server}/models/{model}/embed", {"inputs": texts, "truncate": False})
    assert status in (400, 413) and "16" in body["error"], body
    # Triton's client: the texts as BYTES.
    client = httpclient.InferenceServerClient(server)
    text = httpclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([texts[0].encode()], dtype=object))
    result = client.infer(model, [text]).as_numpy("embedding")
    assert cosines(result[0], want[0]) >= 0.9999
    # A text tower gives one vector a text, not one a token.
    status, body = post(f"http://{server}/models/{model}/embed_all", {"inputs": texts[:1]})
    assert status == 400 and "projected vector only" in body["error"], body


@pytest.mark.parametrize("model", MODELS)
def test_the_openai_client_embeds_pictures_and_texts(server, model):
    client = openai.OpenAI(base_url=f"http://{server}/v1", api_key="unused")
    names = list(REFS[model]["photos"])
    # The client asks for base64 vectors unless told otherwise; data URLs and bare base64 both come.
    inputs = [data_url(n) if i % 2 else base64.b64encode(photo(n)).decode() for i, n in enumerate(names)]
    pictures = client.embeddings.create(model=model, input=inputs, extra_body={"modality": "image"})
    got = [d.embedding for d in sorted(pictures.data, key=lambda d: d.index)]
    want = [REFS[model]["photos"][n] for n in names]
    assert (cosines(got, want) >= 0.9999).all(), cosines(got, want)
    texts = list(REFS[model]["texts"])
    answer = client.embeddings.create(model=model, input=texts, encoding_format="float")
    got = [d.embedding for d in sorted(answer.data, key=lambda d: d.index)]
    assert (cosines(got, [REFS[model]["texts"][t] for t in texts]) >= 0.9999).all()
    # Fewer dimensions: the first, renormalised.
    short = client.embeddings.create(model=model, input=inputs[:1], dimensions=8, extra_body={"modality": "image"})
    assert len(short.data[0].embedding) == 8
    assert cosines(short.data[0].embedding, want[0][:8]) >= 0.9999
    # A web address is not fetched; a picture to a model that embeds only text is refused.
    with pytest.raises(openai.BadRequestError, match="fetches nothing"):
        client.embeddings.create(model=model, input=["https://example.com/cat.png"], extra_body={"modality": "image"})
    with pytest.raises(openai.BadRequestError, match="takes no pictures"):
        client.embeddings.create(model="mpnet", input=inputs[:1], extra_body={"modality": "image"})
    with pytest.raises(openai.BadRequestError, match="base64|not a picture"):
        client.embeddings.create(model=model, input=["a photo of a cat"], extra_body={"modality": "image"})
    with pytest.raises(openai.BadRequestError, match="modality"):
        client.embeddings.create(model=model, input=texts, extra_body={"modality": "audio"})


@pytest.mark.parametrize("model", MODELS)
def test_tritonclient_embeds_pictures_over_http_and_grpc(inferd, model):
    _, server, grpc = inferd
    names = list(REFS[model]["photos"])
    want = [REFS[model]["photos"][n] for n in names]
    files = np.array([photo(n) for n in names], dtype=object)
    # Both inputs are optional: a request sends one.
    config = httpclient.InferenceServerClient(server).get_model_config(model)
    assert {i["name"]: i["optional"] for i in config["input"]} == {"text": True, "image": True}, config
    grpc_config = grpcclient.InferenceServerClient(grpc).get_model_config(model).config
    assert {i.name: i.optional for i in grpc_config.input} == {"text": True, "image": True}, grpc_config
    # HTTP with the binary extension (the files as they are), and in JSON (each file in base64, as JSON strings
    # cannot hold a file's bytes).
    client = httpclient.InferenceServerClient(server)
    for binary in (True, False):
        image = httpclient.InferInput("image", [len(names)], "BYTES")
        if binary:
            image.set_data_from_numpy(files)
        else:
            image.set_data_from_numpy(np.array([base64.b64encode(f) for f in files], dtype=object), binary_data=False)
        got = client.infer(model, [image]).as_numpy("embedding")
        assert (cosines(got, want) >= 0.9999).all(), (binary, cosines(got, want))
    # gRPC.
    image = grpcclient.InferInput("image", [len(names)], "BYTES")
    image.set_data_from_numpy(files)
    got = grpcclient.InferenceServerClient(grpc).infer(model, [image]).as_numpy("embedding")
    assert (cosines(got, want) >= 0.9999).all(), cosines(got, want)
    # Texts and pictures together, or neither: refused by name.
    text = httpclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a photo of a cat"], dtype=object))
    image = httpclient.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(files[:1])
    with pytest.raises(InferenceServerException, match="send one of the two"):
        client.infer(model, [text, image])
    status, body = post(f"http://{server}/v2/models/{model}/infer", {"inputs": []})
    assert status == 400 and "`text` (texts) or `image`" in body["error"], body
    # A file that is no picture.
    image = grpcclient.InferInput("image", [1], "BYTES")
    image.set_data_from_numpy(np.array([b"not a picture"], dtype=object))
    with pytest.raises(InferenceServerException, match="not a picture"):
        grpcclient.InferenceServerClient(grpc).infer(model, [image])


def ranked_alike(got, want, tolerance=1e-3):
    """Equal scores per label, and the same order wherever the reference's scores differ by more than `tolerance`."""
    scores = {g["label"]: g["score"] for g in got}
    assert sorted(scores) == sorted(w["label"] for w in want)
    for w in want:
        assert abs(scores[w["label"]] - w["score"]) < tolerance, (got, want)
    order = [g["label"] for g in got]
    for a, b in zip(want, want[1:]):
        if a["score"] - b["score"] > tolerance:
            assert order.index(a["label"]) < order.index(b["label"]), (got, want)


@pytest.mark.parametrize("model", MODELS)
def test_huggingface_hub_classifies_pictures_zero_shot(server, model):
    client = InferenceClient(model=f"http://{server}/models/{model}")
    labels = REFS["labels"]
    for template in REFS["templates"]:
        for name, want in REFS[model]["zero_shot"][template].items():
            # The client's default sentence is the server's: it sends none.
            extra = {} if template == "This is a photo of {}." else {"hypothesis_template": template}
            got = client.zero_shot_image_classification(photo(name), candidate_labels=labels, **extra)
            ranked_alike([{"label": g.label, "score": g.score} for g in got], want)
    # The Inference API's older form: the labels joined by commas.
    picture = base64.b64encode(photo("rocket.jpg")).decode()
    status, got = post(f"http://{server}/models/{model}", {"inputs": picture, "parameters": {
        "candidate_labels": ", ".join(labels), "hypothesis_template": "a {}"}})
    assert status == 200, got
    ranked_alike(got, REFS[model]["zero_shot"]["a {}"]["rocket.jpg"])
    # The default model answers at the root.
    if model == "clip":
        got = InferenceClient(model=f"http://{server}").zero_shot_image_classification(
            photo("chelsea.png"), candidate_labels=labels, hypothesis_template="a {}")
        ranked_alike([{"label": g.label, "score": g.score} for g in got], REFS[model]["zero_shot"]["a {}"]["chelsea.png"])


def test_bad_input_gets_a_400_and_leaves_memory_flat(inferd):
    proc, server, _ = inferd
    url = f"http://{server}/models/clip/predict"
    for name, data, message in BAD:
        r = requests.post(url, data=data, headers={"Content-Type": "image/png"})
        assert r.status_code == 400 and message in r.json()["error"], (name, r.text)
    # Zero-shot: no labels, a template without its place, a body that is not a picture; a model without towers.
    picture = base64.b64encode(photo("chelsea.png")).decode()
    for body, message in [
        ({"inputs": picture, "parameters": {"candidate_labels": []}}, "at least one label"),
        ({"inputs": picture, "parameters": {"candidate_labels": ["cat"], "hypothesis_template": "cat"}}, "{}"),
        ({"inputs": "not base64!", "parameters": {"candidate_labels": ["cat"]}}, "base64"),
        ({"inputs": base64.b64encode(BAD[1][1]).decode(), "parameters": {"candidate_labels": ["cat"]}}, "end"),
    ]:
        status, answer = post(f"http://{server}/models/clip", body)
        assert status == 400 and message in answer["error"], (body["parameters"], answer)

    def bad_round(_):
        for _, data, _ in BAD:
            assert requests.post(url, data=data, headers={"Content-Type": "image/png"}).status_code == 400

    bad_round(0)
    before = rss_kib(proc.pid)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(bad_round, range(40)))
    grown = rss_kib(proc.pid) - before
    assert grown < 30 * 1024, f"resident memory grew by {grown} KiB over 240 bad pictures"
    # Still serving.
    r = requests.post(url, data=photo("astronaut.png"), headers={"Content-Type": "image/png"})
    assert r.status_code == 200, r.text
