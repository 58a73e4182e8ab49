"""The transformer architectures beyond BERT's family on candle, through the clients people use, against references
computed apart from inferd: the tiny models of tests/data/architectures (hub folders: config.json, tokenizer.json,
modules.json, 1_Pooling, config_sentence_transformers.json), whose last hidden states for each text, run alone, were
computed in float64 by transformers (MPNet, ModernBERT, Qwen3 with and without a sliding window: tests/data/architectures/make_native.py) or by the
numpy reference of tests/python/reference_arch.py (NomicBERT, GTE: make_remote.py).

Per token through TEI's /embed_all; pooled (each folder's own pooling: mean, CLS or last token) and normalised through
TEI's /embed, OpenAI's client and tritonclient over HTTP and gRPC; every pooling mode by model.toml; prompts by name
and by default; a text's vector alone and inside a mixed batch of 64; ModernBERT's and MPNet's classifiers; the real
all-mpnet-base-v2 from its PyPI wheels against the numpy reference; and folders inferd cannot run refused with the
reason while the others serve."""

import concurrent.futures
import json
import shutil
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tei_client import HttpClient
from tokenizers import Tokenizer

import reference_arch
from conftest import ROOT, post, start_inferd

FIXTURES = ROOT / "tests" / "data" / "architectures"
NATIVE = json.loads((FIXTURES / "references.json").read_text())
REMOTE = json.loads((FIXTURES / "references_remote.json").read_text())
TEXTS = NATIVE["texts"]
EMBEDDERS = ["mpnet", "modernbert", "qwen3", "qwen3-sliding", "nomic", "gte"]
# Each folder's pooling (1_Pooling/config.json) and normalisation (modules.json), as its README says.
POOLING = {"mpnet": "mean", "modernbert": "mean", "qwen3": "last_token", "qwen3-sliding": "last_token", "nomic": "mean",
           "gte": "cls"}


def states(name, key="hidden"):
    """Each text's reference states `[tokens, hidden]` (float64)."""
    if name in NATIVE["fixtures"]:
        return [np.array(NATIVE["fixtures"][name][t][key]) for t in TEXTS]
    return [np.array(h) for h in REMOTE[name][key]]


def pool(hidden, mode):
    """sentence-transformers' pooling of one text's states (every token real)."""
    n = len(hidden)
    return {
        "mean": lambda: hidden.mean(0),
        "cls": lambda: hidden[0],
        "last_token": lambda: hidden[-1],
        "max": lambda: hidden.max(0),
        "mean_sqrt_len": lambda: hidden.sum(0) / np.sqrt(n),
        "weighted_mean": lambda: (hidden * np.arange(1, n + 1)[:, None]).sum(0) / (n * (n + 1) / 2),
    }[mode]()


def unit(v):
    return v / np.linalg.norm(v)


def cosines(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The fixtures as one repository, and a copy of MPNet per other pooling mode (model.toml's `pooling`)."""
    root = tmp_path_factory.mktemp("architectures")
    for name in EMBEDDERS + ["qwen3-query", "modernbert-classifier", "mpnet-classifier"]:
        shutil.copytree(FIXTURES / name, root / name)
    for mode in ["max", "mean_sqrt_len", "weighted_mean", "cls", "last_token"]:
        folder = root / f"mpnet-{mode}"
        shutil.copytree(FIXTURES / "mpnet", folder)
        (folder / "model.toml").write_text(f'backend = "candle"\ntask = "embed"\npooling = "{mode}"\n')
    return root


@pytest.fixture(scope="module")
def server(repository):
    with start_inferd(repository, "--default-embed-model", "mpnet", grpc=True) as addresses:
        yield addresses


@pytest.mark.parametrize("name", EMBEDDERS)
def test_each_token_matches_the_reference_through_embed_all(server, name):
    status, got = post(f"http://{server[0]}/models/{name}/embed_all", {"inputs": TEXTS})
    assert status == 200, got
    for text, tokens, want in zip(TEXTS, got, states(name)):
        assert np.shape(tokens) == want.shape, text
        assert cosines(tokens, want).min() >= 0.99999, (name, text)


@pytest.mark.parametrize("name", EMBEDDERS)
def test_pooled_vectors_match_the_reference_through_every_client(server, name):
    http_address, grpc_address = server
    want = np.array([unit(pool(h, POOLING[name])) for h in states(name)])
    status, tei = post(f"http://{http_address}/models/{name}/embed", {"inputs": TEXTS})
    assert status == 200, tei
    assert cosines(tei, want).min() >= 0.99999
    assert np.allclose(np.linalg.norm(tei, axis=1), 1, atol=1e-5), "modules.json's Normalize"
    client = openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="unused", max_retries=0)
    answer = client.embeddings.create(model=name, input=TEXTS)
    assert cosines([d.embedding for d in answer.data], want).min() >= 0.99999
    text = np.array([t.encode() for t in TEXTS], dtype=object)
    over_http = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
    over_http.set_data_from_numpy(text)
    v2 = httpclient.InferenceServerClient(http_address).infer(name, [over_http]).as_numpy("embedding")
    assert cosines(v2, want).min() >= 0.99999
    over_grpc = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
    over_grpc.set_data_from_numpy(text)
    grpc = grpcclient.InferenceServerClient(grpc_address).infer(name, [over_grpc]).as_numpy("embedding")
    np.testing.assert_allclose(grpc, v2, atol=1e-6)


@pytest.mark.parametrize("mode", ["max", "mean_sqrt_len", "weighted_mean", "cls", "last_token"])
def test_every_pooling_mode(server, mode):
    # Not normalised (TEI's normalize is true unless asked): the vectors themselves.
    status, got = post(f"http://{server[0]}/models/mpnet-{mode}/embed", {"inputs": TEXTS, "normalize": False})
    assert status == 200, got
    want = [pool(h, mode) for h in states("mpnet")]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", EMBEDDERS)
def test_a_text_alone_and_in_a_mixed_batch_of_64_agree(server, name):
    """64 texts at once, each as long as it is, the batcher padding them together; then each text alone."""
    texts = [TEXTS[i % len(TEXTS)] * (1 + i % 3) for i in range(64)]
    status, batched = post(f"http://{server[0]}/models/{name}/embed_all", {"inputs": texts, "truncate": True})
    assert status == 200, batched

    def alone(text):
        status, got = post(f"http://{server[0]}/models/{name}/embed_all", {"inputs": [text], "truncate": True})
        assert status == 200, got
        return got[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool_:
        singles = list(pool_.map(alone, texts))
    for text, b, s in zip(texts, batched, singles):
        assert np.abs(np.array(b) - np.array(s)).max() <= 1e-5, text


def test_prompts_by_name_and_by_default(server):
    http_address = server[0]
    prompt = NATIVE["query_prompt"]
    query = states("qwen3", "query_hidden")
    plain = states("qwen3")
    status, got = post(f"http://{http_address}/models/qwen3/embed", {"inputs": TEXTS, "prompt_name": "query"})
    assert status == 200, got
    assert cosines(got, [unit(h[-1]) for h in query]).min() >= 0.99999
    # Without a name, qwen3 takes no prompt (its default_prompt_name is null); qwen3-query's default is "query".
    status, got = post(f"http://{http_address}/models/qwen3/embed", {"inputs": TEXTS})
    assert cosines(got, [unit(h[-1]) for h in plain]).min() >= 0.99999
    status, got = post(f"http://{http_address}/models/qwen3-query/embed", {"inputs": TEXTS})
    assert status == 200, got
    assert cosines(got, [unit(h[-1]) for h in query]).min() >= 0.99999
    # The empty "document" prompt is a prompt too: it changes nothing.
    status, got = post(f"http://{http_address}/models/qwen3-query/embed", {"inputs": TEXTS, "prompt_name": "document"})
    assert cosines(got, [unit(h[-1]) for h in plain]).min() >= 0.99999
    # /tokenize shows the prompted text's tokens, as they are embedded.
    status, tokens = post(f"http://{http_address}/models/qwen3/tokenize", {"inputs": TEXTS[0], "prompt_name": "query"})
    assert status == 200, tokens
    assert [t["id"] for t in tokens[0]] == NATIVE["fixtures"]["qwen3"][TEXTS[0]]["query_ids"]
    assert prompt.split()[0] in "".join(t["text"] for t in tokens[0])


def test_an_unknown_prompt_is_a_400_naming_the_known_ones(server):
    status, error = post(f"http://{server[0]}/models/qwen3/embed", {"inputs": TEXTS[:1], "prompt_name": "passage"})
    assert status == 400, error
    assert 'prompt_name `passage` is not one of this model\'s prompts. Available prompts: ["document", "query"]' in \
        error["error"], error
    # tei-client reads the names from that message (it asks /tokenize for a prompt no model has).
    assert HttpClient(f"http://{server[0]}/models/qwen3").prompt_names() == ["document", "query"]
    assert HttpClient(f"http://{server[0]}/models/gte").prompt_names() == []
    # A model without prompts says so.
    status, error = post(f"http://{server[0]}/models/gte/embed", {"inputs": TEXTS[:1], "prompt_name": "query"})
    assert status == 400 and "this model has no prompts" in error["error"], error


@pytest.mark.parametrize("name", ["modernbert-classifier", "mpnet-classifier"])
def test_classifiers_match_transformers(server, name):
    status, answer = post(f"http://{server[0]}/models/{name}/predict",
                          {"inputs": [[t] for t in TEXTS], "raw_scores": True})
    assert status == 200, answer
    labels = ["negative", "neutral", "positive"]
    got = [[next(s["score"] for s in row if s["label"] == label) for label in labels] for row in answer]
    want = [NATIVE["fixtures"][name][t]["logits"] for t in TEXTS]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_folders_inferd_cannot_run_fail_with_the_reason_while_the_others_serve(tmp_path):
    shutil.copytree(FIXTURES / "gte", tmp_path / "gte")
    for name, change in [
        ("t5", lambda c: c.update(model_type="t5", architectures=["T5EncoderModel"])),
        ("yarn", lambda c: c.update(rope_scaling={"type": "yarn", "factor": 4.0})),
        ("heads", lambda c: c.update(num_attention_heads=5)),
    ]:
        shutil.copytree(FIXTURES / "gte", tmp_path / name)
        config = json.loads((tmp_path / name / "config.json").read_text())
        change(config)
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    with start_inferd(tmp_path) as address:
        # /health answers 503 while a model failed; its body still lists each model.
        try:
            with urllib.request.urlopen(f"http://{address}/health") as r:
                health = json.loads(r.read())
        except urllib.error.HTTPError as e:
            health = json.loads(e.read())
        models = {m["name"]: m for m in health["models"]}
        assert models["gte"]["state"] == "ready", models["gte"]
        reasons = {name: json.dumps(models[name]) for name in ("t5", "yarn", "heads")}
        assert "T5EncoderModel" in reasons["t5"] and "MPNet (mpnet)" in reasons["t5"], reasons["t5"]
        assert "rope_scaling: rope type `yarn`" in reasons["yarn"], reasons["yarn"]
        assert "num_attention_heads: 5 heads do not divide hidden_size 32" in reasons["heads"], reasons["heads"]
        status, got = post(f"http://{address}/models/gte/embed", {"inputs": TEXTS[:2]})
        assert status == 200, got


def test_the_numpy_mpnet_reference_matches_transformers():
    """The reference the real MPNet weights are checked against, itself checked on the tiny model."""
    for text in TEXTS:
        fixture = NATIVE["fixtures"]["mpnet"][text]
        got = reference_arch.forward(FIXTURES / "mpnet", fixture["ids"])
        np.testing.assert_allclose(got, fixture["hidden"], atol=1e-7)


def test_all_mpnet_base_v2_real_weights(tmp_path):
    """sentence-transformers' all-mpnet-base-v2 as its hub folder ships (scripts/fetch-test-models.sh): TEI's and
    OpenAI's embeddings against the float64 reference, and its sense (paraphrases closer than unrelated texts)."""
    folder = ROOT / "tests" / "data" / "third-party" / "all-mpnet-base-v2"
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "Dynamic batching groups concurrent requests so that the accelerator stays busy."]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    want = np.array([unit(reference_arch.forward(folder, tokenizer.encode(t).ids).mean(0)) for t in texts])
    (tmp_path / "all-mpnet-base-v2").symlink_to(folder)
    with start_inferd(tmp_path) as address:
        status, got = post(f"http://{address}/models/all-mpnet-base-v2/embed", {"inputs": texts})
        assert status == 200, got
        client = openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused", max_retries=0)
        openai_got = [d.embedding for d in client.embeddings.create(model="all-mpnet-base-v2", input=texts).data]
    assert np.shape(got) == (len(texts), 768)
    assert cosines(got, want).min() >= 0.99999
    assert cosines(openai_got, want).min() >= 0.99999
    similarity = np.array(got) @ np.array(got).T
    assert similarity[0, 1] > 0.6 > similarity[0, 2] and similarity[0, 1] > similarity[0, 3], similarity
