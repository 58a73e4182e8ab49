#!/usr/bin/env python3
"""Make tiny MPNet, ModernBERT and Qwen3 fixtures, and transformers' reference outputs for them.

Each fixture is a model folder in the Hugging Face hub layout that sentence-transformers ships (config.json,
model.safetensors with the base model's tensor names, tokenizer.json, tokenizer_config.json,
special_tokens_map.json, modules.json, 1_Pooling/config.json, sentence_bert_config.json) plus this server's
model.toml:

- mpnet/: MPNetModel (all-mpnet-base-v2's architecture), WordPiece tokenizer with <s> <pad> </s> <unk> <mask>,
  mean pooling, normalised.
- modernbert/: ModernBertModel (gte-modernbert / modernbert-embed's architecture), byte-level BPE tokenizer with
  [CLS] [SEP] [PAD] [UNK] [MASK] at the end of the vocabulary, 3 layers (global, local, global) with an 8-token local
  window, mean pooling, normalised.
- qwen3/: Qwen3Model (Qwen3-Embedding's architecture), byte-level BPE tokenizer that appends <|endoftext|> to each
  text, last-token pooling, normalised, with a "query" prompt that is not applied by default.
- qwen3-query/: the same model, with "query" as the default prompt.
- qwen3-sliding/: the same weights and tokenizer as qwen3/, with config.json's use_sliding_window true,
  sliding_window 4 and max_window_layers 1: layer 0 attends to every earlier token, layer 1 to the last 4 (itself
  and the 3 before it). No prompts.
- modernbert-classifier/, mpnet-classifier/: ModernBertForSequenceClassification and
  MPNetForSequenceClassification with 3 labels.

Weights come from the transformers initialisation under a fixed seed, then every parameter is perturbed with seeded
noise (norm weights become 1 + noise, biases noise, matrices get noise of about 1/sqrt(fan_in)) so that a wrong
formula cannot hide behind identity norms, zero biases or near-uniform attention.

references.json holds, for every fixture and every text in TEXTS: `ids` (tokenizer.json's ids, special tokens
included) and `hidden` (the base model's last hidden state for the text alone, batch of 1, no padding, computed by
transformers in float64 from the saved FP32 weights, [tokens, hidden], 8 significant digits); the classifiers add
`logits`; qwen3 adds `query_ids` / `query_hidden` for the query prompt followed by the text. A self-check runs every
fixture on a padded batch of all TEXTS (right padding; qwen3 and qwen3-sliding also left padding) and asserts that
each real token's state matches its unpadded run within 1e-6, and that qwen3-sliding's window is applied: its
states equal qwen3's at each text's first 4 positions and differ at every later one.

Run (from the repository root, in a venv made from tests/data/architectures/requirements-fixtures.txt):

    python3 -m venv .cache/fixture-env
    .cache/fixture-env/bin/pip install -r tests/data/architectures/requirements-fixtures.txt
    .cache/fixture-env/bin/python tests/data/architectures/make_native.py
"""

import json
import math
import pathlib
import shutil

import numpy as np
import torch
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoTokenizer,
    ModernBertConfig,
    ModernBertForSequenceClassification,
    ModernBertModel,
    MPNetConfig,
    MPNetForSequenceClassification,
    MPNetModel,
    Qwen3Config,
    Qwen3Model,
)

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = "tests/data/architectures/make_native.py"

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

QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"

# A small corpus of our own for training the tokenizers: every letter, digit and the punctuation the texts use.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs!",
    "Sphinx of black quartz, judge my vow?",
    "A server answers requests; a client sends them.",
    "Embeddings map each sentence to a vector, and similar sentences land close together.",
    "The model reads tokens, attends to its neighbours and writes a hidden state for each one.",
    "Batches fill up when many requests arrive at once, and the queue stays short.",
    "What is the weather like in Paris, the capital of France?",
    "Where is the nearest station? How long does the trip take?",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 30 42 100 2024.",
    "Instruct: given a question, find the passages that answer it. Query: what is rust?",
    "Search for relevant documents and retrieve the best passages for the query.",
    "Café, naïve, résumé, façade, über, jalapeño, déjà vu.",
    "Short texts and long texts are both welcome here.",
    "Hello, world! Hello again, world.",
    "Inference servers batch work dynamically to keep the hardware busy.",
    "Why does dynamic batching matter? Because throughput matters for inference.",
    "Every layer normalises its input, mixes the tokens and applies a small network.",
    "Quiet zebras jog past the vexed wizard's box.",
    "The lazy dog sleeps while the quick fox runs over the hill.",
] * 3


def train_wordpiece_mpnet():
    """A WordPiece vocabulary built explicitly (the WordPiece trainer's ties are not deterministic): the specials, every
    character of the normalised corpus alone and as a ##continuation, a few suffixes, and the corpus words seen at
    least three times, so that rarer words split into pieces."""
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts = {}
    for line in CORPUS:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)):
            counts[word] = counts.get(word, 0) + 1
    chars = sorted({c for word in counts for c in word})
    suffixes = ["##ed", "##ing", "##ly", "##er", "##est", "##ion"]
    words = sorted(w for w, n in counts.items() if n >= 3 and len(w) > 1)
    vocab_list = specials + chars + [f"##{c}" for c in chars] + suffixes + words
    assert len(vocab_list) == len(set(vocab_list)) and len(vocab_list) <= 400, len(vocab_list)
    vocab = {token: i for i, token in enumerate(vocab_list)}
    tok = Tokenizer(
        models.WordPiece(vocab=vocab, unk_token="<unk>", continuing_subword_prefix="##", max_input_chars_per_word=100)
    )
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    ids = {s: tok.token_to_id(s) for s in specials}
    assert ids == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}, ids
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok, ids


def train_bytelevel_bpe(vocab_size, specials):
    """Byte-level BPE trained with no special tokens; the specials are added after, so they get the last ids."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_special_tokens(specials)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_modernbert_tokenizer():
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    tok = train_bytelevel_bpe(340, specials)
    ids = {s: tok.token_to_id(s) for s in specials}
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    return tok, ids


def train_qwen3_tokenizer():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = train_bytelevel_bpe(360, specials)
    ids = {s: tok.token_to_id(s) for s in specials}
    eot = ids["<|endoftext|>"]
    # As Qwen3-Embedding's tokenizer.json: no BOS, <|endoftext|> appended after each text.
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>",
        pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eot)],
    )
    return tok, ids


def perturb(model, seed):
    """Add seeded noise to every parameter (norm weights stay near 1, everything else moves visibly)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("relative_attention_bias.weight"):
                p.add_(noise * 1.0)
            elif p.dim() <= 1:
                # LayerNorm / RMSNorm weights (initialised to 1) become 1 + noise; biases become noise; scalars (a
                # logit scale) move a little.
                p.add_(noise * 0.1)
            elif "embed" in name.lower():
                p.add_(noise * 0.5)
            else:
                p.add_(noise / math.sqrt(p.shape[1]))


def write_json(path, obj, indent=2):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def write_tokenizer(folder, tok, special_map, extra_config):
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special_map, **extra_config}
    write_json(folder / "tokenizer_config.json", config)
    write_json(folder / "special_tokens_map.json", special_map)


def write_sentence_transformers(folder, dim, pooling, max_seq_length, st_config=None, description=""):
    write_json(
        folder / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    modes = ["cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken"]
    pool = {"word_embedding_dimension": dim}
    pool.update({f"pooling_mode_{m}": m == pooling for m in modes})
    pool["include_prompt"] = True
    write_json(folder / "1_Pooling" / "config.json", pool)
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    if st_config is not None:
        write_json(folder / "config_sentence_transformers.json", st_config)
    write_model_toml(folder, "embed", description)


def write_model_toml(folder, task, description, shared_from=None):
    """model.toml; with `shared_from`, the weights and tokenizer are that sibling folder's (not copied)."""
    shared = ""
    if shared_from is not None:
        shared = f'file = "../{shared_from}/model.safetensors"\ntokenizer = "../{shared_from}/tokenizer.json"\n'
    (folder / "model.toml").write_text(
        f"# {description}; made by {SCRIPT}.\n" f'backend = "candle"\ntask = "{task}"\n{shared}'
    )


def share_weights(folder, sibling, description):
    """Drops `folder`'s copies of `sibling`'s weights and tokenizer files (made to compute its references) for
    model.toml's paths to the sibling's: the fixtures stay small."""
    for name in ["model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        assert (folder / name).read_bytes() == (folder.parent / sibling / name).read_bytes(), name
        (folder / name).unlink()
    write_model_toml(folder, "embed", description, shared_from=sibling)


def save_model(model, folder):
    folder.mkdir(parents=True, exist_ok=True)
    model = model.float()
    model.config.dtype = "float32"
    model.save_pretrained(str(folder))
    (folder / "model.safetensors").chmod(0o644)
    for extra in ("generation_config.json",):
        if (folder / extra).exists():
            (folder / extra).unlink()


DIGITS = 8  # significant digits of the float64 references (the tests compare within 1e-4 and a cosine of 0.99999)


def rounded(x):
    return float(f"{x:.{DIGITS}g}")


def round_rows(a):
    return [[rounded(x) for x in row] for row in np.asarray(a, dtype=np.float64)]


def run_alone(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out


def padded_check(model, all_ids, pad_id, side, alone):
    """Run all texts as one padded batch and return the largest difference of a real token from its lone run."""
    width = max(len(i) for i in all_ids)
    input_ids, mask = [], []
    for ids in all_ids:
        pad = width - len(ids)
        if side == "right":
            input_ids.append(ids + [pad_id] * pad)
            mask.append([1] * len(ids) + [0] * pad)
        else:
            input_ids.append([pad_id] * pad + ids)
            mask.append([0] * pad + [1] * len(ids))
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(mask)).last_hidden_state
    worst = 0.0
    for row, ids in enumerate(all_ids):
        real = hidden[row, : len(ids)] if side == "right" else hidden[row, width - len(ids) :]
        worst = max(worst, (real - alone[row]).abs().max().item())
    return worst


def check_tokenizer(folder, tok):
    """AutoTokenizer must load the folder and give tokenizer.json's ids."""
    auto = AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        want = tok.encode(text).ids
        got = auto(text)["input_ids"]
        assert got == want, (folder.name, text, got, want)
    return auto


def references_for(model_cls, folder, tok, pad_id, sides, prompt=None, attn="sdpa"):
    """Load the saved folder back, in float64, and compute each text's last hidden state alone and in a batch."""
    kwargs = {"attn_implementation": attn} if attn else {}
    model = model_cls.from_pretrained(str(folder), **kwargs).double().eval()
    out = {}
    alone = []
    all_ids = []
    for text in TEXTS:
        ids = tok.encode(text).ids
        hidden = run_alone(model, ids).last_hidden_state[0]
        out[text] = {"ids": ids, "hidden": round_rows(hidden.numpy())}
        alone.append(hidden)
        all_ids.append(ids)
        if prompt is not None:
            qids = tok.encode(prompt + text).ids
            out[text]["query_ids"] = qids
            out[text]["query_hidden"] = round_rows(run_alone(model, qids).last_hidden_state[0].numpy())
    checks = {side: padded_check(model, all_ids, pad_id, side, alone) for side in sides}
    return out, checks


def classifier_logits(model_cls, folder, tok, attn="sdpa"):
    kwargs = {"attn_implementation": attn} if attn else {}
    model = model_cls.from_pretrained(str(folder), **kwargs).double().eval()
    out = {}
    for text in TEXTS:
        ids = tok.encode(text).ids
        out[text] = {"ids": ids, "logits": [rounded(x) for x in run_alone(model, ids).logits[0].tolist()]}
    return out


def window_evidence(full_folder, sliding_folder, tok, window):
    """Per text (TEXTS plus a few short probes around the window's length), the two Qwen3 folders' lone runs
    compared: the largest difference over positions before `window` (where the window covers every earlier token,
    so the states must agree), and over positions from `window` on the largest and the smallest of each position's
    largest difference (where they must not agree)."""
    full = Qwen3Model.from_pretrained(str(full_folder), attn_implementation="sdpa").double().eval()
    sliding = Qwen3Model.from_pretrained(str(sliding_folder), attn_implementation="sdpa").double().eval()
    assert sliding.config.layer_types == ["full_attention", "sliding_attention"], sliding.config.layer_types
    assert sliding.config.sliding_window == window, sliding.config.sliding_window
    out = {}
    for text in TEXTS + ["a b", "a b c", "Hello", "The quick", "a b c d"]:
        ids = tok.encode(text).ids
        diff = (run_alone(full, ids).last_hidden_state[0] - run_alone(sliding, ids).last_hidden_state[0]).abs()
        per_position = diff.max(dim=1).values
        inside = per_position[:window].max().item()
        past = (per_position[window:].max().item(), per_position[window:].min().item()) if len(ids) > window else None
        out[text] = (len(ids), inside, past)
    return out


LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def main():
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    references = {}
    checks = {}

    # ---- MPNet -------------------------------------------------------------------------------------------------
    tok, ids = train_wordpiece_mpnet()
    mpnet_config = dict(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=130,
        relative_attention_num_buckets=32,
        layer_norm_eps=1e-5,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
    )
    torch.manual_seed(1)
    model = MPNetModel(MPNetConfig(**mpnet_config))
    perturb(model, 101)
    folder = HERE / "mpnet"
    save_model(model, folder)
    specials = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "sep_token": "</s>",
        "cls_token": "<s>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    }
    write_tokenizer(folder, tok, specials, {"model_max_length": 128, "do_lower_case": True})
    write_sentence_transformers(
        folder, 32, "mean_tokens", 128, description="Tiny MPNetModel (all-mpnet-base-v2's architecture), random weights"
    )
    check_tokenizer(folder, tok)
    references["mpnet"], checks["mpnet"] = references_for(MPNetModel, folder, tok, ids["<pad>"], ["right"], attn=None)
    mpnet_tok = tok

    # ---- ModernBERT --------------------------------------------------------------------------------------------
    tok, ids = train_modernbert_tokenizer()
    modernbert_config = dict(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        global_attn_every_n_layers=2,
        local_attention=8,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        max_position_embeddings=512,
        pad_token_id=ids["[PAD]"],
        cls_token_id=ids["[CLS]"],
        sep_token_id=ids["[SEP]"],
        bos_token_id=ids["[CLS]"],
        eos_token_id=ids["[SEP]"],
    )
    torch.manual_seed(2)
    model = ModernBertModel(ModernBertConfig(**modernbert_config))
    perturb(model, 202)
    folder = HERE / "modernbert"
    save_model(model, folder)
    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    write_tokenizer(folder, tok, specials, {"model_max_length": 512})
    write_sentence_transformers(
        folder,
        32,
        "mean_tokens",
        512,
        description="Tiny ModernBertModel (gte-modernbert's architecture; layers global, local, global), random weights",
    )
    check_tokenizer(folder, tok)
    references["modernbert"], checks["modernbert"] = references_for(
        ModernBertModel, folder, tok, ids["[PAD]"], ["right"]
    )
    modernbert_tok = tok

    # ---- Qwen3 -------------------------------------------------------------------------------------------------
    tok, ids = train_qwen3_tokenizer()
    eot = ids["<|endoftext|>"]
    qwen3_config = dict(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
    )
    torch.manual_seed(3)
    model = Qwen3Model(Qwen3Config(**qwen3_config))
    perturb(model, 303)
    folder = HERE / "qwen3"
    save_model(model, folder)
    specials = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    write_tokenizer(folder, tok, specials, {"model_max_length": 512, "padding_side": "left"})
    st = {"prompts": {"query": QUERY_PROMPT, "document": ""}, "default_prompt_name": None, "similarity_fn_name": "cosine"}
    write_sentence_transformers(
        folder,
        32,
        "lasttoken",
        512,
        st_config=st,
        description="Tiny Qwen3Model (Qwen3-Embedding's architecture, last-token pooling), random weights",
    )
    auto = check_tokenizer(folder, tok)
    assert auto.padding_side == "left"
    references["qwen3"], checks["qwen3"] = references_for(
        Qwen3Model, folder, tok, eot, ["right", "left"], prompt=QUERY_PROMPT
    )

    query_folder = HERE / "qwen3-query"
    if query_folder.exists():
        shutil.rmtree(query_folder)
    shutil.copytree(folder, query_folder)
    write_sentence_transformers(
        query_folder,
        32,
        "lasttoken",
        512,
        st_config={**st, "default_prompt_name": "query"},
        description="Tiny Qwen3Model as qwen3/, with the query prompt applied by default",
    )
    # The same model and tokenizer as qwen3: its references are qwen3's (query_ids / query_hidden apply by default).
    references["qwen3-query"] = {"same_as": "qwen3"}

    # The same weights and tokenizer again, with layer 1 attending through a 4-token sliding window (layer 0 stays
    # full: max_window_layers 1). Qwen3Config derives layer_types from the three fields and writes it.
    window = 4
    sliding_folder = HERE / "qwen3-sliding"
    if sliding_folder.exists():
        shutil.rmtree(sliding_folder)
    shutil.copytree(folder, sliding_folder)
    (sliding_folder / "config_sentence_transformers.json").unlink()
    sliding_config = Qwen3Config(
        **{**qwen3_config, "use_sliding_window": True, "sliding_window": window, "max_window_layers": 1}
    )
    assert sliding_config.layer_types == ["full_attention", "sliding_attention"], sliding_config.layer_types
    sliding_config.architectures = ["Qwen3Model"]
    sliding_config.dtype = "float32"
    sliding_config.save_pretrained(str(sliding_folder))
    full_json = json.loads((folder / "config.json").read_text())
    sliding_json = json.loads((sliding_folder / "config.json").read_text())
    changed = {k for k in full_json.keys() | sliding_json.keys() if full_json.get(k) != sliding_json.get(k)}
    assert changed == {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}, changed
    assert sliding_json["layer_types"] == ["full_attention", "sliding_attention"], sliding_json["layer_types"]
    write_model_toml(
        sliding_folder,
        "embed",
        "Tiny Qwen3Model with qwen3/'s weights, layer 0 full attention and layer 1 a 4-token sliding window",
    )
    check_tokenizer(sliding_folder, tok)
    references["qwen3-sliding"], checks["qwen3-sliding"] = references_for(
        Qwen3Model, sliding_folder, tok, eot, ["right", "left"]
    )
    evidence = window_evidence(folder, sliding_folder, tok, window)
    share_weights(query_folder, "qwen3", "Tiny Qwen3Model as qwen3/ (its weights and tokenizer), with the query "
                  "prompt applied by default")
    share_weights(sliding_folder, "qwen3", "Tiny Qwen3Model with qwen3/'s weights and tokenizer, layer 0 full "
                  "attention and layer 1 a 4-token sliding window")

    # ---- Classifiers -------------------------------------------------------------------------------------------
    label2id = {v: k for k, v in LABELS.items()}
    torch.manual_seed(4)
    model = ModernBertForSequenceClassification(
        ModernBertConfig(**modernbert_config, num_labels=3, id2label=LABELS, label2id=label2id, classifier_pooling="mean")
    )
    perturb(model, 404)
    folder = HERE / "modernbert-classifier"
    save_model(model, folder)
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}
    write_tokenizer(folder, modernbert_tok, specials, {"model_max_length": 512})
    write_model_toml(folder, "classify", "Tiny ModernBertForSequenceClassification (3 labels, mean pooling), random weights")
    check_tokenizer(folder, modernbert_tok)
    references["modernbert-classifier"] = classifier_logits(ModernBertForSequenceClassification, folder, modernbert_tok)

    torch.manual_seed(5)
    model = MPNetForSequenceClassification(
        MPNetConfig(**mpnet_config, num_labels=3, id2label=LABELS, label2id=label2id)
    )
    perturb(model, 505)
    folder = HERE / "mpnet-classifier"
    save_model(model, folder)
    specials = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "sep_token": "</s>",
        "cls_token": "<s>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    }
    write_tokenizer(folder, mpnet_tok, specials, {"model_max_length": 128, "do_lower_case": True})
    write_model_toml(folder, "classify", "Tiny MPNetForSequenceClassification (3 labels), random weights")
    check_tokenizer(folder, mpnet_tok)
    references["mpnet-classifier"] = classifier_logits(
        MPNetForSequenceClassification, folder, mpnet_tok, attn=None
    )

    (HERE / "references.json").write_text(
        json.dumps({"texts": TEXTS, "query_prompt": QUERY_PROMPT, "fixtures": references}, separators=(",", ":"), ensure_ascii=False)
        + "\n"
    )

    # ---- Report ------------------------------------------------------------------------------------------------
    for name, sides in checks.items():
        for side, worst in sides.items():
            print(f"{name}: padded batch ({side} padding) vs alone, max |diff| = {worst:.3e}")
            assert worst < 1e-6, (name, side, worst)
    for text, (count, inside, past) in evidence.items():
        shown = "-" if past is None else f"{past[0]:.3e} (each at least {past[1]:.3e})"
        print(
            f"qwen3-sliding vs qwen3, {count:3d} tokens {text[:32]!r}: max |diff| positions < {window} = {inside:.3e},"
            f" positions >= {window} = {shown}"
        )
        assert inside == 0.0, (text, inside)
        assert past is None or past[1] > 1e-6, (text, past)
    for name in ["mpnet", "modernbert", "qwen3", "qwen3-sliding", "modernbert-classifier", "mpnet-classifier"]:
        folder = HERE / name
        weights = folder / "model.safetensors"
        if not weights.exists():  # a folder sharing qwen3's weights
            weights = HERE / "qwen3" / "model.safetensors"
        with safe_open(str(weights), "np") as f:
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        print(f"{name}: {len(shapes)} tensors, config {AutoConfig.from_pretrained(str(folder)).model_type}")
        lengths = [len(references[name][t]["ids"]) for t in TEXTS]
        print(f"  token counts: {lengths}")


if __name__ == "__main__":
    main()
