"""Rerankers and classifiers through the clients people already use against TEI and Cohere (tei-client,
huggingface_hub, cohere) and Triton's, every score checked against tests/python/reference.py, a float64 numpy model
fed by the same tokenizer. The models are the bundled reranker (XLM-RoBERTa family, candle), the classifier (BERT,
candle) and the reranker's ONNX export (tests/data/models/reranker-onnx), all made at set-up from fixed-seed
weights by models/make_text_heads.py."""

import concurrent.futures
import pathlib

import cohere
import numpy as np
import pytest
import tritonclient.http as httpclient
from huggingface_hub import InferenceClient
from tei_client import HttpClient
from tei_client.models import TruncationDirection
from tokenizers import Tokenizer

from conftest import ROOT, post, start_inferd
from reference import Reference, sigmoid, softmax

MODELS = ROOT / "models"
MAX_ROWS = 32
QUERY = "what is dynamic batching in an inference server"
PASSAGES = [
    "Dynamic batching groups concurrent requests into one batch so the GPU runs them together.",
    "The weather in Lisbon is mild in winter.",
    "An inference server answers prediction requests over HTTP.",
    "Batching by tokens keeps padding waste low when texts differ in length, " * 6,
    "cats",
]


@pytest.fixture(scope="module")
def server():
    with start_inferd(MODELS, "--default-embed-model", "minilm", "--max-rows", str(MAX_ROWS)) as address:
        yield address


@pytest.fixture(scope="module")
def onnx_server():
    with start_inferd(ROOT / "tests" / "data" / "models" / "reranker-onnx") as address:
        yield address



def tokenizer_of(folder):
    """The folder's tokenizer, neither padding nor truncating (a hub tokenizer.json may do either)."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def encode_pairs(folder, pairs):
    tokenizer = tokenizer_of(folder)
    encodings = [tokenizer.encode(a, b) for a, b in pairs]
    return [e.ids for e in encodings], [e.type_ids for e in encodings]


def encode_texts(folder, texts):
    tokenizer = tokenizer_of(folder)
    encodings = [tokenizer.encode(t) for t in texts]
    return [e.ids for e in encodings], [e.type_ids for e in encodings]


def reference_rerank_logits(folder, query, texts):
    return Reference(folder).logits(*encode_pairs(folder, [(query, t) for t in texts]))[:, 0]


def assert_close(got, want, tolerance=1e-4):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    cosine = got.ravel() @ want.ravel() / (np.linalg.norm(got) * np.linalg.norm(want))
    assert cosine >= 0.9999, (cosine, got, want)
    assert np.max(np.abs(got - want)) < tolerance, (got, want)


def scores_by_index(ranks):
    return [r["score"] for r in sorted(ranks, key=lambda r: r["index"])]


def test_candle_reranker_agrees_with_the_float64_reference(server):
    status, ranks = post(f"http://{server}/rerank", {"query": QUERY, "texts": PASSAGES, "raw_scores": True})
    assert status == 200, ranks
    want = reference_rerank_logits(MODELS / "reranker", QUERY, PASSAGES)
    assert_close(scores_by_index(ranks), want)
    assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
    # Without raw_scores: the sigmoid of each logit, and return_text echoes each text at its index.
    status, ranks = post(f"http://{server}/rerank", {"query": QUERY, "texts": PASSAGES, "return_text": True})
    assert status == 200, ranks
    assert_close(scores_by_index(ranks), sigmoid(want))
    assert all(r["text"] == PASSAGES[r["index"]] for r in ranks)


def test_the_onnx_reranker_agrees_with_the_reference(onnx_server):
    status, ranks = post(f"http://{onnx_server}/rerank", {"query": QUERY, "texts": PASSAGES, "raw_scores": True})
    assert status == 200, ranks
    # The graph holds the candle reranker's weights; FP32 ONNX Runtime against float64, the same tolerance.
    assert_close(scores_by_index(ranks), reference_rerank_logits(MODELS / "reranker", QUERY, PASSAGES))


def test_candle_classifier_agrees_with_the_reference_for_texts_and_pairs(server):
    folder = MODELS / "classifier"
    labels = ["negative", "neutral", "positive"]
    texts = ["I like this server", "It crashed twice", "fine"]
    status, answer = post(f"http://{server}/models/classifier/predict",
                          {"inputs": [[t] for t in texts], "raw_scores": True})
    assert status == 200, answer
    want = Reference(folder).logits(*encode_texts(folder, texts))
    got = [[next(s["score"] for s in row if s["label"] == label) for label in labels] for row in answer]
    assert_close(got, want)
    # A pair, with its segment ids; softmax scores, best first.
    pair = ("A man is eating.", "Somebody eats.")
    status, answer = post(f"http://{server}/predict", {"inputs": list(pair)})
    assert status == 200, answer
    want = softmax(Reference(folder).logits(*encode_pairs(folder, [pair]))[0])
    assert [s["label"] for s in answer] == [labels[i] for i in np.argsort(-want)]
    assert_close([s["score"] for s in answer], np.sort(want)[::-1])


def test_candle_distilbert_classifier_agrees_with_the_reference():
    """DistilBERT: its own config keys and tensor names, no token types, the pre_classifier (ReLU) head."""
    folder = ROOT / "tests" / "data" / "models" / "distilbert-classifier"
    texts = ["I like this server", "It crashed twice", "a cat sits on the mat", "ok"]
    pairs = [("A man is eating.", "Somebody eats."), ("rain", "The weather in Lisbon is mild in winter.")]
    reference = Reference(folder)
    with start_inferd(folder) as address:
        classifier = HttpClient(f"http://{address}")
        got = [{p.label: p.score for p in result.scores} for result in classifier.classify(texts, raw_scores=True)]
        want = reference.logits(*encode_texts(folder, texts))
        assert_close([[row["NEGATIVE"], row["POSITIVE"]] for row in got], want)
        assert len({max(row, key=row.get) for row in got}) == 2, "each label wins for some text"
        status, answer = post(f"http://{address}/predict", {"inputs": [list(p) for p in pairs]})
        assert status == 200, answer
        want = softmax(reference.logits(*encode_pairs(folder, pairs)))
        assert_close([[next(s["score"] for s in row if s["label"] == label) for label in ("NEGATIVE", "POSITIVE")]
                      for row in answer], want)


def test_tei_client_works_unchanged(server):
    ranker = HttpClient(f"http://{server}/models/reranker")
    ranks = ranker.rerank(QUERY, PASSAGES, raw_scores=True, return_text=True).ranks
    want = reference_rerank_logits(MODELS / "reranker", QUERY, PASSAGES)
    assert_close([r.score for r in sorted(ranks, key=lambda r: r.index)], want)
    assert all(r.text == PASSAGES[r.index] for r in ranks)

    classifier = HttpClient(f"http://{server}/models/classifier")
    predictions = [result.scores for result in classifier.classify(["good", "bad"])]
    assert len(predictions) == 2 and {p.label for p in predictions[0]} == {"negative", "neutral", "positive"}
    assert all(abs(sum(p.score for p in row) - 1) < 1e-5 for row in predictions)

    embedder = HttpClient(f"http://{server}")  # `/info` names the default text model: MiniLM
    info = embedder.info()
    assert embedder.prompt_names() == []
    assert info.server_model_id == "minilm" and info.max_client_batch_size == MAX_ROWS
    embedding = np.asarray(embedder.embed("dynamic batching"))
    assert embedding.shape == (1, 384) and abs(np.linalg.norm(embedding) - 1) < 1e-5
    tokens = embedder.tokenize("Hello world!")[0].tokens
    assert [t.id for t in tokens] == [101, 7592, 2088, 999, 102]
    assert [(t.text, t.start, t.stop) for t in tokens if not t.special] == [("Hello", 0, 5), ("world", 6, 11),
                                                                             ("!", 11, 12)]
    assert [t.special for t in tokens] == [True, False, False, False, True]
    assert embedder.decode([101, 7592, 2088, 102]) == ["hello world"]


def test_tei_client_embed_all_gives_each_tokens_state(server):
    """A vector per token, special tokens included, unpooled: the texts differ in length, so they are batched
    padded to the longest, and each comes back cut to its own tokens."""
    texts = ["Hello world!", "GPUs", PASSAGES[3], "naïve café résumé"]
    folder = MODELS / "minilm"
    reference = Reference(folder)
    ids, types = encode_texts(folder, texts)
    want = [reference.hidden_states(i, t) for i, t in zip(ids, types)]
    for model, tolerance in (("minilm", 1e-3), ("minilm-int8", None)):
        got = HttpClient(f"http://{server}/models/{model}").embed_all(texts)
        assert [np.asarray(g).shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            g = np.asarray(g, dtype=np.float64)
            cosines = (g * w).sum(1) / np.linalg.norm(g, axis=1) / np.linalg.norm(w, axis=1)
            if tolerance is None:  # ONNX Runtime's int8 export: close, not equal (0.998 at worst, measured)
                assert cosines.min() >= 0.99, cosines
            else:
                assert cosines.min() >= 0.9999, cosines
                assert np.max(np.abs(g - w)) < tolerance
    # The default embedding model answers /embed_all too, and mean pooling its states gives /embed unnormalised.
    status, states = post(f"http://{server}/embed_all", {"inputs": texts[0]})
    assert status == 200 and np.asarray(states).shape == (1, *want[0].shape)
    status, pooled = post(f"http://{server}/embed", {"inputs": texts[0], "normalize": False})
    assert np.max(np.abs(np.asarray(states[0]).mean(0) - pooled[0])) < 1e-5


def test_truncation_direction_cuts_the_start_or_the_end(server):
    """A text past MiniLM's 256 tokens, cut at its start (`Left`, as tei-client sends it; `left`, as huggingface_hub
    does) gives the embedding of its last 254 tokens between [CLS] and [SEP]; cut at its end, of its first."""
    text = " ".join(f"word{i}" for i in range(400))
    tokenizer = tokenizer_of(MODELS / "minilm")
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) > 300
    status, kept = post(f"http://{server}/models/minilm/embed", {"inputs": [[101, *ids[:254], 102],
                                                                            [101, *ids[-254:], 102]]})
    assert status == 200, kept
    embedder = HttpClient(f"http://{server}/models/minilm")
    right = embedder.embed(text, truncate=True)
    left = embedder.embed(text, truncate=True, truncation_direction=TruncationDirection.Left)
    assert np.max(np.abs(np.asarray(right[0]) - kept[0])) < 1e-5
    assert np.max(np.abs(np.asarray(left[0]) - kept[1])) < 1e-5
    status, lower = post(f"http://{server}/embed", {"inputs": text, "truncation_direction": "left"})
    assert status == 200 and np.max(np.abs(np.asarray(lower[0]) - kept[1])) < 1e-5
    status, error = post(f"http://{server}/embed", {"inputs": text, "truncation_direction": "middle"})
    assert status == 400 and "unknown variant `middle`" in error["error"], error


def test_huggingface_hub_inference_client_works_unchanged(server):
    embedder = InferenceClient(base_url=f"http://{server}/models/minilm")
    vector = embedder.feature_extraction("dynamic batching")
    assert vector.shape == (1, 384)
    similarity = embedder.sentence_similarity("a cat sits", ["a cat sits", "stock markets fell"])
    assert abs(similarity[0] - 1) < 1e-5 and similarity[1] < similarity[0]
    classifier = InferenceClient(base_url=f"http://{server}/models/classifier")
    top = classifier.text_classification("I like this server")
    # TEI answers one text with every label best first; the client keeps the best.
    status, answer = post(f"http://{server}/models/classifier/predict", {"inputs": "I like this server"})
    assert status == 200 and top.label == answer[0]["label"] and abs(top.score - answer[0]["score"]) < 1e-6


def test_cohere_client_reranks_unchanged(server):
    want = sigmoid(reference_rerank_logits(MODELS / "reranker", QUERY, PASSAGES))
    v2 = cohere.ClientV2(api_key="unused", base_url=f"http://{server}")
    # A hosted model's name, as clients send by default: the default reranker answers.
    answer = v2.rerank(model="rerank-v3.5", query=QUERY, documents=PASSAGES, top_n=3)
    assert [r.index for r in answer.results] == list(np.argsort(-want)[:3])
    assert_close([r.relevance_score for r in answer.results], np.sort(want)[::-1][:3])
    v1 = cohere.Client(api_key="unused", base_url=f"http://{server}")
    documents = [{"text": p, "title": f"doc {i}"} for i, p in enumerate(PASSAGES)]
    answer = v1.rerank(model="reranker", query=QUERY, documents=documents, return_documents=True)
    assert [r.index for r in answer.results] == list(np.argsort(-want))
    assert all(r.document.text == PASSAGES[r.index] for r in answer.results)
    with pytest.raises(cohere.core.ApiError) as refused:
        v2.rerank(model="reranker", query="", documents=PASSAGES)
    assert refused.value.status_code == 400 and "query" in refused.value.body["message"]


def test_tritonclient_reranks_and_classifies_with_bytes(server):
    client = httpclient.InferenceServerClient(server)
    query = httpclient.InferInput("query", [1], "BYTES")
    query.set_data_from_numpy(np.array([QUERY.encode()], dtype=object))
    texts = httpclient.InferInput("text", [len(PASSAGES)], "BYTES")
    texts.set_data_from_numpy(np.array([p.encode() for p in PASSAGES], dtype=object))
    result = client.infer("reranker", [query, texts])
    want = sigmoid(reference_rerank_logits(MODELS / "reranker", QUERY, PASSAGES))
    assert_close(result.as_numpy("score"), want)
    texts = httpclient.InferInput("text", [2], "BYTES")
    texts.set_data_from_numpy(np.array([b"good", b"bad"], dtype=object))
    scores = client.infer("classifier", [texts]).as_numpy("scores")
    folder = MODELS / "classifier"
    assert_close(scores, softmax(Reference(folder).logits(*encode_texts(folder, ["good", "bad"]))))


def test_padding_never_changes_a_score(server):
    """64 concurrent requests of mixed lengths, batched together, give what each gives alone."""
    queries = [" ".join(["batching"] * (1 + i % 7)) + f" query {i}" for i in range(64)]
    def rerank(q):
        status, ranks = post(f"http://{server}/rerank", {"query": q, "texts": PASSAGES, "raw_scores": True})
        assert status == 200, ranks
        return scores_by_index(ranks)
    alone = [rerank(q) for q in queries]
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        together = list(pool.map(rerank, queries))
    assert np.max(np.abs(np.asarray(together) - np.asarray(alone))) < 1e-5


@pytest.mark.parametrize("route,body,status,words", [
    ("/rerank", {"query": "", "texts": ["a"]}, 400, "`query` is empty"),
    ("/rerank", {"query": "q", "texts": []}, 400, "`texts` is empty"),
    ("/rerank", {"query": "q", "texts": ["a"] * (MAX_ROWS + 1)}, 413, "--max-rows"),
    ("/rerank", {"query": "q", "texts": ["word " * 600], "truncate": False}, 400, "tokens long"),
    ("/models/classifier/rerank", {"query": "q", "texts": ["a"]}, 400, "does not rerank text: it classifies text"),
    ("/models/minilm/rerank", {"query": "q", "texts": ["a"]}, 400, "does not rerank text: it embeds text"),
    ("/models/reranker/embed", {"inputs": "a"}, 400, "does not embed"),
    ("/models/classifier/embed_all", {"inputs": "a"}, 400, "does not embed"),
    ("/embed_all", {"inputs": ["word " * 600], "truncate": False}, 400, "tokens long"),
    ("/embed_all", {"inputs": []}, 400, "empty"),
    ("/embed", {"inputs": "a", "prompt_name": "query"}, 400, "this model has no prompts"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"prompt_name": "q"}}, 400,
     "this model has no prompts"),
    # 32 texts of 256 tokens, a vector of 384 values each: 3.1 Mi values, under the cap; the cap is tested in Rust.
    ("/embed_all", {"inputs": ["word " * 300] * (MAX_ROWS + 1)}, 413, "--max-rows"),
    ("/predict", {"inputs": ["a", "b", "c"]}, 400, "one text or a pair"),
    ("/decode", {"ids": [999999]}, 400, "outside the model's vocabulary"),
    ("/models/nope/rerank", {"query": "q", "texts": ["a"]}, 404, "nope"),
])
def test_bad_input_gets_a_clear_error_in_tei_shape(server, route, body, status, words):
    code, answer = post(f"http://{server}{route}", body)
    assert code == status, answer
    assert words in answer["error"] and answer["error_type"], answer


def test_cohere_and_jina_errors_carry_message_and_detail(server):
    code, answer = post(f"http://{server}/v1/rerank", {"query": "q", "documents": []})
    assert code == 400 and "`documents` is empty" in answer["message"] and answer["detail"] == answer["message"]
    code, answer = post(f"http://{server}/v1/rerank", {"query": "q", "documents": [{"title": "t"}]})
    assert code == 400 and "rank_fields" in answer["detail"], answer
