"""Text embeddings against an independent reference and through the clients people use unchanged: OpenAI's
`openai`, Triton's `tritonclient` (BYTES, JSON and binary), TEI's JSON shapes and inferd's own /predict.

The reference is all-MiniLM-L6-v2 in float64 numpy (tests/python/reference.py) from the same safetensors file, fed by
the same tokenizer.json (truncated at 256 tokens, unpadded), mean-pooled and normalised as sentence-transformers does."""

import base64
import pathlib

import numpy as np
import openai
import pytest
import tritonclient.http as httpclient
from tokenizers import Tokenizer

from conftest import post
from reference import Reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "minilm"
MAX_SEQ_LEN = 256

SENTENCES = [
    "Hello, world!",
    "GPUs",
    "The quick brown fox jumps over the lazy dog.",
    "Inference servers batch concurrent requests to keep the accelerator busy.",
    "naïve café résumé — déjà vu",
    "Zürich, Genève & Lugano: three Swiss cities.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "emoji 🚀🔥 and symbols ©®™ ∑∫√",
    "???!!!...;;;",
    "   leading and trailing spaces   ",
    "UPPER CASE AND lower case AND MiXeD CaSe",
    "Numbers: 3.14159, 2.71828, 1e-12, 42, -7.",
    "https://example.com/path?query=value&other=1#fragment",
    "def embed(texts): return model.encode(texts, normalize_embeddings=True)",
    "A",
    "unbelievably",
    "The cat sat on the mat.\nThe dog sat on the log.\tTabs too.",
    "Sentence embeddings map text to vectors whose cosine similarity reflects meaning. " * 3,
    "word " * 300,  # longer than 256 tokens: cut at 256
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "¿Dónde está la biblioteca? Está al lado del parque.",
]


def tokenizer():
    t = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    t.no_padding()
    t.enable_truncation(MAX_SEQ_LEN)
    return t


@pytest.fixture(scope="module")
def reference():
    bert, tok = Reference(MODEL), tokenizer()
    encodings = [tok.encode(s) for s in SENTENCES]
    vectors = np.stack([bert.embed(np.array(e.ids), np.array(e.type_ids)) for e in encodings])
    return vectors, [len(e.ids) for e in encodings]



def cosines(got, want):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def test_the_reference_tokenizes_as_sentence_transformers():
    lengths = [len(e.ids) for e in tokenizer().encode_batch(SENTENCES)]
    assert max(lengths) == MAX_SEQ_LEN and min(lengths) == 3
    assert len(SENTENCES) >= 20


def test_candle_agrees_with_the_float64_reference(server_url, reference):
    want, _ = reference
    status, got = post(f"http://{server_url}/models/minilm/embed", {"inputs": SENTENCES})
    assert status == 200, got
    c = cosines(got, want)
    assert c.min() >= 0.9999, dict(zip(SENTENCES, c))
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_the_int8_onnx_export_agrees_with_the_reference(server_url, reference):
    want, _ = reference
    status, got = post(f"http://{server_url}/models/minilm-int8/embed", {"inputs": SENTENCES})
    assert status == 200, got
    c = cosines(got, want)
    assert c.min() >= 0.99, dict(zip(SENTENCES, c))


def test_tei_shapes_and_the_default_text_model(server_url, reference):
    want, _ = reference
    status, one = post(f"http://{server_url}/embed", {"inputs": SENTENCES[0]})
    assert status == 200 and np.asarray(one).shape == (1, 384)
    assert cosines(one, want[:1]).min() >= 0.9999
    status, raw = post(f"http://{server_url}/embed", {"inputs": SENTENCES[:2], "normalize": False})
    assert status == 200 and np.asarray(raw).shape == (2, 384)
    assert abs(np.linalg.norm(raw[0]) - 1.0) > 0.01
    assert cosines(raw, want[:2]).min() >= 0.9999
    status, error = post(f"http://{server_url}/embed", {"inputs": SENTENCES[19], "truncate": False})
    assert status == 400 and error["error_type"] == "Validation", error
    assert "at most 256" in error["error"]


def test_predict_takes_texts(server_url, reference):
    want, _ = reference
    status, got = post(f"http://{server_url}/models/minilm/predict", {"input": SENTENCES[:5]})
    assert status == 200, got
    assert cosines(got["prediction"], want[:5]).min() >= 0.9999


@pytest.fixture(scope="module")
def openai_client(server_url):
    return openai.OpenAI(base_url=f"http://{server_url}/v1", api_key="unused", max_retries=0)


def test_the_openai_client_works_unchanged(openai_client, reference):
    want, lengths = reference
    # The client asks for base64 unless told otherwise, and decodes it itself.
    response = openai_client.embeddings.create(model="minilm", input=SENTENCES)
    assert response.model == "minilm" and response.object == "list"
    assert [d.index for d in response.data] == list(range(len(SENTENCES)))
    assert cosines([d.embedding for d in response.data], want).min() >= 0.9999
    assert response.usage.prompt_tokens == sum(lengths) == response.usage.total_tokens

    floats = openai_client.embeddings.create(model="minilm-int8", input="Hello, world!", encoding_format="float",
                                             dimensions=384)
    assert len(floats.data) == 1 and cosines([floats.data[0].embedding], want[:1]).min() >= 0.99

    ids = tokenizer().encode(SENTENCES[2]).ids
    by_ids = openai_client.embeddings.create(model="minilm", input=[ids])
    assert cosines([by_ids.data[0].embedding], want[2:3]).min() >= 0.9999
    assert by_ids.usage.prompt_tokens == len(ids)

    models = [m.id for m in openai_client.models.list()]
    assert models == ["minilm", "minilm-int8"]


def test_the_openai_client_sees_openai_errors(openai_client):
    with pytest.raises(openai.NotFoundError) as e:
        openai_client.embeddings.create(model="nope", input="a")
    assert "nope" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.embeddings.create(model="minilm", input="a", dimensions=640)
    assert "384" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.embeddings.create(model="digits", input="a")
    assert "does not embed text" in e.value.body["message"]


def test_the_raw_openai_base64_is_little_endian_float32(server_url, reference):
    want, _ = reference
    status, got = post(f"http://{server_url}/v1/embeddings",
                       {"model": "minilm", "input": SENTENCES[3], "encoding_format": "base64"})
    assert status == 200, got
    vector = np.frombuffer(base64.b64decode(got["data"][0]["embedding"]), dtype="<f4")
    assert cosines([vector], want[3:4]).min() >= 0.9999


@pytest.mark.parametrize("binary_in,binary_out", [(False, False), (True, True), (True, False), (False, True)])
def test_tritonclient_sends_texts_as_bytes(server_url, reference, binary_in, binary_out):
    want, _ = reference
    client = httpclient.InferenceServerClient(server_url)
    metadata = client.get_model_metadata("minilm")
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    texts = np.array(SENTENCES[:6], dtype=object)
    inp = httpclient.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(texts, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("embedding", binary_data=binary_out)
    result = client.infer("minilm", [inp], outputs=[out])
    got = result.as_numpy("embedding")
    assert got.shape == (6, 384) and got.dtype == np.float32
    assert cosines(got, want[:6]).min() >= 0.9999


def test_tritonclient_invalid_utf8_is_a_clear_error(server_url):
    client = httpclient.InferenceServerClient(server_url)
    inp = httpclient.InferInput("text", [2], "BYTES")
    inp.set_data_from_numpy(np.array([b"fine", b"\xff\xfe"], dtype=object), binary_data=True)
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as e:
        client.infer("minilm", [inp])
    assert "not UTF-8" in str(e.value)
