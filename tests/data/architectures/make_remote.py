"""Writes two tiny, seeded, hub-layout fixtures for the remote-code embedding architectures, and their references.

    /work/main/.venv/bin/python tests/data/architectures/make_remote.py

* `nomic/`: NomicBERT as nomic-ai/nomic-embed-text-v1.5 ships it (`model_type` "nomic_bert", NomicBertModel, rotary,
  SwiGLU, fused Wqkv, post-norm), mean pooling, normalised, nomic's query/document prompts.
* `gte/`: Alibaba's "new" architecture as Alibaba-NLP/gte-base-en-v1.5 ships it (`model_type` "new", NewModel, rotary
  with NTK scaling, fused qkv_proj, GLU MLP with fused up_gate_proj, post-norm), CLS pooling, normalised.
* `references_remote.json`: for TEXTS, each fixture's token ids (tokenizer.json, special tokens added) and the last
  hidden state of tests/python/reference_arch.py (float64 numpy), 9 significant digits.

Weights are seeded normals. Word/token-type embeddings use std 0.05; the layers' linear weights use std 0.25 so that
attention is far from uniform and the MLP moves the residual stream by a visible amount (with 0.05 a wrong rotary or a
swapped gate would change the output by well under 1%); LayerNorm weights are 1 + N(0, 0.1) and every bias N(0, 0.05),
so no formula hides behind an identity norm. The script checks that a padded, masked batch reproduces each text alone
within 1e-9, and that the fixtures are sensitive to the details a port can get wrong (gate/value order, rotary layout,
NTK scaling). Needs only numpy, safetensors and tokenizers.
"""

import json
import math
import pathlib
import sys

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))
import reference_arch as ref  # noqa: E402

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "a",
    "Rust servers answer quickly when batches are full and the queue is short, which is why dynamic batching "
    "matters for inference.",
    "naïve café résumé",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30",
    "short one",
    "What is the capital of France?",
]

CORPUS = TEXTS + [
    "search_query: what is the best way to serve embeddings?",
    "search_document: a server answers requests for sentence embeddings in batches.",
    "The capital of France is Paris, and the capital of Germany is Berlin.",
    "Dynamic batching groups requests that arrive together, so the accelerator stays busy.",
    "A tokenizer splits text into word pieces; unknown words fall back to smaller pieces.",
    "Rotary position embeddings rotate queries and keys by an angle that grows with the position.",
    "The model reads a short question and a long document, then compares their vectors.",
    "Numbers such as 100, 2024 and 3.14 appear in text as often as words do.",
    "Hello there! How are you today? I am fine, thank you.",
    "Inference servers measure latency, throughput and memory; queues should stay short.",
    "The lazy dog sleeps while the quick fox runs over the hill and back again.",
    "Vectors are normalised to unit length before the cosine similarity is taken.",
    "Long documents are cut to the maximum sequence length that the model accepts.",
]

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_SIZE = 384  # a multiple of 64, as nomic's pad_vocab_size_multiple wants

HIDDEN, HEADS, LAYERS, INTER = 32, 4, 2, 64
SEED = 20240607


# ------------------------------------------------------------------------------------------------------------- tokenizer
SUFFIXES = ["##s", "##es", "##ed", "##ing", "##er", "##ers", "##ly", "##ion", "##al", "##ive", "##ume", "##ity",
            "##ness", "##ment", "##able", "##est"]
FILLER = """about above after again against all also always among another any around away back because been
before being below between both bring call came can case change child city close come could country day does down
during each early end even every eye fact family far feel few find first follow food form found four free friend
from give good great group hand have head help here high home house however idea important into just keep kind know
land large last late learn leave left life light like line little live look made make man many may mean might more
most move much must name near need never new next night number often old only open order other our out own page part
people place play point power problem public put read real right room said same school see seem set should show side
since small some something sound start state still story study such take tell than their them then there these they
thing think those thought three through time together too took turn under until upon use very want water way well
went were where while white whole will with without word work world would write year young your""".split()


def build_tokenizer():
    """A BERT-style uncased WordPiece tokenizer with a vocabulary fixed by this script (the `tokenizers` trainer breaks
    ties differently from run to run): specials, every printable ASCII character, `##` continuations of letters and
    digits, a few suffixes, the corpus's words by frequency, then filler words, to exactly VOCAB_SIZE entries."""
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                            lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts = {}
    for line in CORPUS:
        for word, _ in pre.pre_tokenize_str(normalizer.normalize_str(line)):
            counts[word] = counts.get(word, 0) + 1
    chars = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    continuations = ["##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    words = sorted((w for w in counts if len(w) > 1), key=lambda w: (-counts[w], w))
    pieces = []
    for token in SPECIALS + chars + continuations + SUFFIXES + words + FILLER:
        if len(pieces) == VOCAB_SIZE:
            break
        if token not in pieces:
            pieces.append(token)
    assert len(pieces) == VOCAB_SIZE, len(pieces)
    vocab = {token: i for i, token in enumerate(pieces)}

    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(SPECIALS)
    assert tok.token_to_id("[PAD]") == 0 and tok.get_vocab_size() == VOCAB_SIZE
    return tok


def tokenizer_config(max_length):
    return {"do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
            "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenize_chinese_chars": True, "strip_accents": None,
            "do_basic_tokenize": True, "never_split": None, "tokenizer_class": "BertTokenizer",
            "model_max_length": max_length}


SPECIAL_TOKENS_MAP = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"}

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def pooling(mode):
    return {"word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": mode == "cls",
            "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}


# --------------------------------------------------------------------------------------------------------------- weights
class Weights:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.tensors = {}

    def normal(self, name, shape, std):
        self.tensors[name] = self.rng.normal(0.0, std, size=shape).astype(np.float32)

    def linear(self, name, out_dim, in_dim, bias):
        self.normal(name + ".weight", (out_dim, in_dim), 0.25)
        if bias:
            self.normal(name + ".bias", (out_dim,), 0.05)

    def norm(self, name, dim):
        self.tensors[name + ".weight"] = (1.0 + self.rng.normal(0.0, 0.1, size=dim)).astype(np.float32)
        self.normal(name + ".bias", (dim,), 0.05)


def nomic_config(vocab):
    return {
        "_name_or_path": "nomic-ai/nomic-bert-2048",
        "activation_function": "swiglu",
        "architectures": ["NomicBertModel"],
        "attn_pdrop": 0.0,
        "auto_map": {
            "AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
            "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel",
            "AutoModelForMaskedLM": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertForPreTraining",
        },
        "bos_token_id": None,
        "causal": False,
        "dense_seq_output": True,
        "embd_pdrop": 0.0,
        "eos_token_id": None,
        "fused_bias_fc": True,
        "fused_dropout_add_ln": True,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-12,
        "max_trained_positions": 2048,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "model_type": "nomic_bert",
        "n_embd": HIDDEN,
        "n_head": HEADS,
        "n_inner": INTER,
        "n_layer": LAYERS,
        "n_positions": 2048,
        "pad_vocab_size_multiple": 64,
        "parallel_block": False,
        "parallel_block_tied_norm": False,
        "prenorm": False,
        "qkv_proj_bias": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0,
        "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None,
        "rotary_scaling_factor": None,
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
        "summary_activation": None,
        "summary_first_dropout": 0.0,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "torch_dtype": "float32",
        "transformers_version": "4.34.0",
        "type_vocab_size": 2,
        "use_cache": True,
        "use_flash_attn": True,
        "use_rms_norm": False,
        "use_xentropy": True,
        "vocab_size": vocab,
    }


def nomic_weights(vocab):
    w = Weights(SEED)
    w.normal("embeddings.word_embeddings.weight", (vocab, HIDDEN), 0.05)
    w.normal("embeddings.token_type_embeddings.weight", (2, HIDDEN), 0.05)
    w.norm("emb_ln", HIDDEN)
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        w.linear(p + "attn.Wqkv", 3 * HIDDEN, HIDDEN, bias=False)
        w.linear(p + "attn.out_proj", HIDDEN, HIDDEN, bias=False)
        w.linear(p + "mlp.fc11", INTER, HIDDEN, bias=False)
        w.linear(p + "mlp.fc12", INTER, HIDDEN, bias=False)
        w.linear(p + "mlp.fc2", HIDDEN, INTER, bias=False)
        w.norm(p + "norm1", HIDDEN)
        w.norm(p + "norm2", HIDDEN)
    return w.tensors


def gte_config(vocab):
    impl = "Alibaba-NLP/new-impl--"
    return {
        "_name_or_path": "Alibaba-NLP/gte-base-en-v1.5",
        "architectures": ["NewModel"],
        "attention_probs_dropout_prob": 0.0,
        "auto_map": {
            "AutoConfig": impl + "configuration.NewConfig",
            "AutoModel": impl + "modeling.NewModel",
            "AutoModelForMaskedLM": impl + "modeling.NewForMaskedLM",
            "AutoModelForMultipleChoice": impl + "modeling.NewForMultipleChoice",
            "AutoModelForQuestionAnswering": impl + "modeling.NewForQuestionAnswering",
            "AutoModelForSequenceClassification": impl + "modeling.NewForSequenceClassification",
            "AutoModelForTokenClassification": impl + "modeling.NewForTokenClassification",
        },
        "classifier_dropout": None,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "layer_norm_eps": 1e-12,
        "layer_norm_type": "layer_norm",
        "logn_attention_clip1": False,
        "logn_attention_scale": False,
        "max_position_embeddings": 8192,
        "model_type": "new",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "pack_qkv": True,
        "pad_token_id": 0,
        "position_embedding_type": "rope",
        "rope_scaling": {"factor": 2.0, "type": "ntk"},
        "rope_theta": 500000,
        "torch_dtype": "float32",
        "transformers_version": "4.39.1",
        "type_vocab_size": 2,
        "unpad_inputs": False,
        "use_memory_efficient_attention": False,
        "vocab_size": vocab,
    }


def gte_weights(vocab):
    w = Weights(SEED + 1)
    w.normal("embeddings.word_embeddings.weight", (vocab, HIDDEN), 0.05)
    w.normal("embeddings.token_type_embeddings.weight", (2, HIDDEN), 0.05)
    w.norm("embeddings.LayerNorm", HIDDEN)
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        w.linear(p + "attention.qkv_proj", 3 * HIDDEN, HIDDEN, bias=True)
        w.linear(p + "attention.o_proj", HIDDEN, HIDDEN, bias=True)
        w.norm(p + "attn_ln", HIDDEN)
        w.linear(p + "mlp.up_gate_proj", 2 * INTER, HIDDEN, bias=False)
        w.linear(p + "mlp.down_proj", HIDDEN, INTER, bias=True)
        w.norm(p + "mlp_ln", HIDDEN)
    return w.tensors


# -------------------------------------------------------------------------------------------------------------- writing
def dump(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_folder(name, config, tensors, tok, pool, max_seq, prompts, what):
    folder = HERE / name
    folder.mkdir(exist_ok=True)
    dump(folder / "config.json", config)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "model.safetensors").chmod(0o644)
    tok.save(str(folder / "tokenizer.json"))
    dump(folder / "tokenizer_config.json", tokenizer_config(max_seq))
    dump(folder / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
    dump(folder / "modules.json", MODULES)
    dump(folder / "1_Pooling" / "config.json", pooling(pool))
    dump(folder / "sentence_bert_config.json", {"max_seq_length": max_seq, "do_lower_case": False})
    if prompts is not None:
        dump(folder / "config_sentence_transformers.json", prompts)
    (folder / "model.toml").write_text(f"# {what}\nbackend = \"candle\"\ntask = \"embed\"\n")
    return folder


# ---------------------------------------------------------------------------------------------- batched check (script)
def batched_forward(config, tensors, batch_ids):
    """A padded batch with an additive attention mask, as the originals run it (transformers'
    get_extended_attention_mask: 0 for real keys, the dtype's minimum for padding). Right padding, positions 0..L-1."""
    b = len(batch_ids)
    length = max(len(x) for x in batch_ids)
    ids = np.zeros((b, length), dtype=np.int64)
    mask = np.zeros((b, length))
    for i, x in enumerate(batch_ids):
        ids[i, : len(x)] = x
        mask[i, : len(x)] = 1.0
    bias = ((1.0 - mask) * np.finfo(np.float64).min)[:, None, None, :]  # [B, 1, 1, L]
    nomic = config["model_type"] == "nomic_bert"
    hidden = config["n_embd"] if nomic else config["hidden_size"]
    heads = config["n_head"] if nomic else config["num_attention_heads"]
    hd = hidden // heads

    def attend(q, k, v):  # [B, L, H, D]
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd) + bias
        return np.einsum("bhqk,bkhd->bqhd", ref.softmax(s, -1), v).reshape(b, length, hidden)

    h = tensors["embeddings.word_embeddings.weight"][ids] + tensors["embeddings.token_type_embeddings.weight"][0]
    if nomic:
        eps = config["layer_norm_epsilon"]
        h = ref.layer_norm(h, tensors["emb_ln.weight"], tensors["emb_ln.bias"], eps)
        cos, sin = ref.rotary_tables(ref.nomic_inv_freq(config, hd, length), np.arange(length))
        for i in range(config["n_layer"]):
            p = f"encoder.layers.{i}."
            qkv = (h @ tensors[p + "attn.Wqkv.weight"].T).reshape(b, length, 3, heads, hd)
            q = np.stack([ref.apply_rotary(x, cos, sin) for x in qkv[:, :, 0]])
            k = np.stack([ref.apply_rotary(x, cos, sin) for x in qkv[:, :, 1]])
            a = attend(q, k, qkv[:, :, 2]) @ tensors[p + "attn.out_proj.weight"].T
            h = ref.layer_norm(h + a, tensors[p + "norm1.weight"], tensors[p + "norm1.bias"], eps)
            y = h @ tensors[p + "mlp.fc11.weight"].T
            g = h @ tensors[p + "mlp.fc12.weight"].T
            m = (y * ref.silu(g)) @ tensors[p + "mlp.fc2.weight"].T
            h = ref.layer_norm(h + m, tensors[p + "norm2.weight"], tensors[p + "norm2.bias"], eps)
    else:
        eps = config["layer_norm_eps"]
        inter = config["intermediate_size"]
        h = ref.layer_norm(h, tensors["embeddings.LayerNorm.weight"], tensors["embeddings.LayerNorm.bias"], eps)
        cos, sin = ref.rotary_tables(ref.gte_inv_freq(config, hd, length), np.arange(length))
        for i in range(config["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            qkv = h @ tensors[p + "attention.qkv_proj.weight"].T + tensors[p + "attention.qkv_proj.bias"]
            q, k, v = (qkv[..., j * hidden:(j + 1) * hidden].reshape(b, length, heads, hd) for j in range(3))
            q = np.stack([ref.apply_rotary(x, cos, sin) for x in q])
            k = np.stack([ref.apply_rotary(x, cos, sin) for x in k])
            a = attend(q, k, v) @ tensors[p + "attention.o_proj.weight"].T + tensors[p + "attention.o_proj.bias"]
            h = ref.layer_norm(h + a, tensors[p + "attn_ln.weight"], tensors[p + "attn_ln.bias"], eps)
            ug = h @ tensors[p + "mlp.up_gate_proj.weight"].T
            m = (ref.gelu(ug[..., inter:]) * ug[..., :inter]) @ tensors[p + "mlp.down_proj.weight"].T
            m = m + tensors[p + "mlp.down_proj.bias"]
            h = ref.layer_norm(h + m, tensors[p + "mlp_ln.weight"], tensors[p + "mlp_ln.bias"], eps)
    return h, mask


def check_batch(folder, all_ids, alone):
    config, tensors = ref.load(folder)
    batch, mask = batched_forward(config, tensors, all_ids)
    worst = 0.0
    for i, x in enumerate(all_ids):
        worst = max(worst, float(np.abs(batch[i, : len(x)] - alone[i]).max()))
    assert worst < 1e-9, f"{folder.name}: padded batch differs from alone by {worst:.3e}"
    return worst


def check_sensitivity(folder, all_ids, alone):
    """Each mistake a port could make must move the output by far more than a float32 tolerance."""
    config, tensors = ref.load(folder)
    variants = {}
    if config["model_type"] == "nomic_bert":
        swapped = dict(tensors)
        for i in range(config["n_layer"]):
            p = f"encoder.layers.{i}.mlp."
            swapped[p + "fc11.weight"], swapped[p + "fc12.weight"] = tensors[p + "fc12.weight"], tensors[p + "fc11.weight"]
        variants["fc11/fc12 swapped"] = (config, swapped)
        variants["interleaved rotary"] = ({**config, "rotary_emb_interleaved": True}, tensors)
        variants["no rotary"] = ({**config, "rotary_emb_fraction": 0.0, "n_positions": 0}, tensors)
        variants["no token type"] = ({**config, "type_vocab_size": 0}, tensors)
    else:
        swapped = dict(tensors)
        inter = config["intermediate_size"]
        for i in range(config["num_hidden_layers"]):
            name = f"encoder.layer.{i}.mlp.up_gate_proj.weight"
            w = tensors[name]
            swapped[name] = np.concatenate([w[inter:], w[:inter]])
        variants["up/gate swapped"] = (config, swapped)
        variants["no NTK scaling"] = ({**config, "rope_scaling": None}, tensors)
        variants["gelu tanh"] = ({**config, "hidden_act": "gelu_new"}, tensors)
        variants["no token type"] = ({**config, "type_vocab_size": 0}, tensors)
    out = {}
    for label, (cfg, tns) in variants.items():
        diff = max(float(np.abs(ref.ARCHITECTURES[cfg["model_type"]](cfg, tns, x) - alone[i]).max())
                   for i, x in enumerate(all_ids))
        out[label] = diff
        limit = 1e-4 if label == "gelu tanh" else 1e-2
        assert diff > limit, f"{folder.name}: {label} changes the output by only {diff:.3e}"
    return out


def rounded(a):
    return [[float(f"{v:.9g}") for v in row] for row in a]


def main():
    tok = build_tokenizer()
    vocab = tok.get_vocab_size()
    assert vocab % 64 == 0, vocab
    fixtures = {
        "nomic": write_folder(
            "nomic", nomic_config(vocab), nomic_weights(vocab), tok, "mean", 512,
            {"prompts": {"query": "search_query: ", "document": "search_document: "}, "default_prompt_name": None},
            "Tiny seeded NomicBERT (nomic-embed-text-v1.5 layout, random weights), made by "
            "tests/data/architectures/make_remote.py."),
        # max_seq_length 512, not gte-base-en-v1.5's 8192: a text model warms up with one text of its longest
        # length, which at 8192 tokens cost every server in the tests 7 s (its positions still allow 8192).
        "gte": write_folder(
            "gte", gte_config(vocab), gte_weights(vocab), tok, "cls", 512, None,
            "Tiny seeded GTE \"new\" model (gte-base-en-v1.5 layout, random weights), made by "
            "tests/data/architectures/make_remote.py."),
    }
    refs = {"texts": TEXTS}
    for name, folder in fixtures.items():
        t = Tokenizer.from_file(str(folder / "tokenizer.json"))
        all_ids = [t.encode(text).ids for text in TEXTS]
        alone = [ref.forward(folder, ids) for ids in all_ids]
        worst = check_batch(folder, all_ids, alone)
        sens = check_sensitivity(folder, all_ids, alone)
        print(f"{name}: batch vs alone max |diff| {worst:.2e}; sensitivity " +
              ", ".join(f"{k} {v:.3g}" for k, v in sens.items()))
        refs[name] = {"ids": all_ids, "hidden": [rounded(h) for h in alone]}
    (HERE / "references_remote.json").write_text(json.dumps(refs, separators=(",", ":")) + "\n")
    for folder in fixtures.values():
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        assert size < 300_000, (folder, size)
        print(f"{folder.name}/: {size} bytes")


if __name__ == "__main__":
    main()
