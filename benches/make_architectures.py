#!/usr/bin/env python3
"""Write the architecture benchmark models: each tiny model of tests/data/architectures (MPNet, ModernBERT,
NomicBERT, GTE, Qwen3) grown to MiniLM's size (hidden 384, 6 layers, intermediate 1536, heads of 64; Qwen3 with 2
key-value heads; ModernBERT's local window 128 every layer but each third) and given MiniLM's tokenizer and vocabulary
(30,522 WordPiece tokens: the tiny models' few hundred tokens would cut the benchmark's sentences into characters),
with fixed-seed random weights under the same tensor names and the same folder files (pooling, prompts). Random
weights compute as trained ones do: the benchmarks measure speed and memory, never answers. Deterministic: the same
bytes on every run.

Run: python3 benches/make_architectures.py OUT    (needs numpy and safetensors: benches/python/requirements-models.txt)
Writes OUT/<name>/ for each architecture, a model repository.
"""

import json
import pathlib
import re
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "architectures"
NAMES = ["mpnet", "modernbert", "nomic", "gte", "qwen3"]
HIDDEN, INTERMEDIATE, LAYERS, HEAD_DIM, KV_HEADS = 384, 1536, 6, 64, 2
# The tiny fixtures' sizes: hidden 32, intermediate 64, heads of 8, Qwen3's 2 key-value heads.
TINY_HIDDEN, TINY_INTERMEDIATE, TINY_HEAD_DIM = 32, 64, 8
SEED = 384


VOCAB = 30522
TOKENIZER = ROOT / "models" / "minilm" / "tokenizer.json"


def config(name, tiny):
    """The tiny config.json grown to the benchmark's sizes, with MiniLM's vocabulary."""
    c = dict(tiny, vocab_size=VOCAB)
    heads = HIDDEN // HEAD_DIM
    if name == "nomic":
        c.update(n_embd=HIDDEN, n_inner=INTERMEDIATE, n_layer=LAYERS, n_head=heads)
        return c
    c.update(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS, num_attention_heads=heads)
    if name == "qwen3":
        c.update(head_dim=HEAD_DIM, num_key_value_heads=KV_HEADS, layer_types=["full_attention"] * LAYERS)
    if name == "modernbert":
        c.update(local_attention=128,
                 layer_types=["full_attention" if i % 3 == 0 else "sliding_attention" for i in range(LAYERS)])
    return c


def shape(name, tensor, tiny_shape):
    """A tiny tensor's shape at the benchmark's sizes: each dimension by the size it stands for."""
    if tensor.endswith("relative_attention_bias.weight"):  # [buckets, heads]
        return [tiny_shape[0], HIDDEN // HEAD_DIM]
    if re.search(r"(word_embeddings|tok_embeddings|embed_tokens)\.weight$", tensor):  # [vocab, hidden]
        return [VOCAB, HIDDEN]
    grown = {
        TINY_HIDDEN: HIDDEN,
        TINY_INTERMEDIATE: INTERMEDIATE,
        2 * TINY_INTERMEDIATE: 2 * INTERMEDIATE,
        3 * TINY_HIDDEN: 3 * HIDDEN,
    }
    if name == "qwen3":
        grown.update({TINY_HEAD_DIM: HEAD_DIM, 2 * TINY_HEAD_DIM: KV_HEADS * HEAD_DIM})
    return [grown.get(d, d) for d in tiny_shape]


def weights(name, tiny, rng):
    """Every tensor of the grown model: the tiny one's names, its layer 1 repeated for each new layer (layer 0 as it
    is: ModernBERT's has no attention norm)."""
    out = {}
    layer = re.compile(r"^(.*?layers?\.)(\d+)(\..*)$")
    for tensor in sorted(tiny):
        m = layer.match(tensor)
        if m and m.group(2) != "1":
            if m.group(2) == "0":
                out[tensor] = shape(name, tensor, tiny[tensor].shape)
            continue
        if m:
            for i in range(1, LAYERS):
                out[f"{m.group(1)}{i}{m.group(3)}"] = shape(name, tensor, tiny[tensor].shape)
        else:
            out[tensor] = shape(name, tensor, tiny[tensor].shape)
    made = {}
    for tensor, dims in sorted(out.items()):
        norm = re.search(r"(norm|LayerNorm|_ln|ln)[^.]*\.weight$", tensor) and len(dims) == 1
        values = np.ones(dims) if norm else rng.normal(0.0, 0.02, dims)
        made[tensor] = values.astype(np.float32)
    return made


def main(out):
    out = pathlib.Path(out)
    for index, name in enumerate(NAMES):
        folder = out / name
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(FIXTURES / name, folder)
        for extra in ["tokenizer_config.json", "special_tokens_map.json"]:
            (folder / extra).unlink(missing_ok=True)
        shutil.copy(TOKENIZER, folder / "tokenizer.json")
        tiny_config = json.loads((FIXTURES / name / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config(name, tiny_config), indent=2))
        tiny = load_file(str(FIXTURES / name / "model.safetensors"))
        rng = np.random.default_rng(SEED + index)
        save_file(weights(name, tiny, rng), str(folder / "model.safetensors"),
                  metadata={"format": "pt", "inferd": f"{name} at MiniLM's size, fixed-seed random weights"})
        (folder / "model.toml").write_text(
            f"# {name} at MiniLM's size with fixed-seed random weights (benches/make_architectures.py).\n"
            'backend = "candle"\ntask = "embed"\n\n[batching]\nmax_batch_size = 64\nmax_batch_tokens = 16384\n')
        print(f"{folder}: {(folder / 'model.safetensors').stat().st_size / 2**20:.1f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
