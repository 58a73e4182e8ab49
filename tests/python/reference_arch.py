"""Float64 numpy references for MPNet (transformers' MPNetModel, for the real all-mpnet-base-v2 weights, itself
checked against transformers on the tiny fixture) and for two embedding architectures that `transformers` does not
ship (they run as remote code from the hub): NomicBERT (`model_type` "nomic_bert", nomic-ai/nomic-embed-text-v1 / v1.5) and Alibaba's GTE "new"
architecture (`model_type` "new", Alibaba-NLP/gte-base-en-v1.5, gte-large-en-v1.5, gte-multilingual-base).

`forward(folder, ids)` reads `config.json` and `model.safetensors` from a hub-layout folder and returns the last
hidden state, shape [tokens, hidden], of ONE unpadded sequence (no attention mask, nothing to share a padding bug with
the server). Written from a reading of the original modelling code and of text-embeddings-inference's candle backend;
no code is taken from either.

Sources, in words
-----------------
NomicBERT: nomic-ai's `contrastors` repository, `src/contrastors/models/huggingface/modeling_hf_nomic_bert.py` and
`configuration_hf_nomic_bert.py` (the same files the hub serves from nomic-ai/nomic-bert-2048, which
nomic-embed-text-v1.5's `auto_map` names). Second reading: text-embeddings-inference `backends/candle/src/models/
nomic.rs`.

* Config: a GPT2Config subclass, so `n_embd` (hidden), `n_head`, `n_layer`, `n_inner`, `n_positions`,
  `layer_norm_epsilon` (GPT2Config default 1e-5; the hub checkpoints say 1e-12), `activation_function` (GPT2Config
  default "gelu_new"), plus NomicBertConfig's own keys with these defaults: `prenorm` False, `rotary_emb_fraction` 0.0,
  `rotary_emb_base` 10000, `rotary_emb_interleaved` False, `rotary_emb_scale_base` None, `qkv_proj_bias` True,
  `mlp_fc1_bias` True, `mlp_fc2_bias` True, `type_vocab_size` 2, `rotary_scaling_factor` None,
  `max_trained_positions` 2048.
* Embeddings (NomicBertEmbeddings + NomicBertModel.forward): word embedding, plus the token type embedding when
  `type_vocab_size` > 0 (token types default to all zeros), plus a learned absolute position embedding only when
  rotary is off (`rotary_emb_fraction` <= 0 and `n_positions` > 0). Then LayerNorm `emb_ln`. No scaling.
* Attention (NomicBertAttention): one fused projection `attn.Wqkv` (bias iff `qkv_proj_bias`), output laid out as
  (three, heads, head_dim): the first `n_embd` outputs are q, the next k, the last v, each head-major. Rotary
  (NomicBertRotaryEmbedding / apply_rotary_emb) acts on q and k only, on the first
  rotary_dim = head_dim * rotary_emb_fraction dimensions of each head; the rest pass through.
  inv_freq[j] = 1 / base ** (2j / rotary_dim), j = 0 .. rotary_dim/2 - 1; angle = position * inv_freq, positions
  0 .. T-1. Non-interleaved (GPT-NeoX, "rotate half"): cos/sin repeated as [f, f], x*cos + rotate_half(x)*sin with
  rotate_half([x1, x2]) = [-x2, x1]. Interleaved (GPT-J): pairs (2j, 2j+1) rotate together.
  Scores q.k / sqrt(head_dim) (`norm_factor`), plus the extended additive mask, softmax, times v; heads concatenated;
  `attn.out_proj` (bias iff `qkv_proj_bias`, the same flag).
* Dynamic NTK (NomicBertDynamicNTKRotaryEmbedding, used only when `rotary_scaling_factor` is set): when the sequence
  length T exceeds `max_trained_positions` (strictly), the base becomes
      base' = base * (factor * T / max_trained_positions - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
  and inv_freq is recomputed from base'; at or below that length the plain base is used. The original keeps the
  rescaled inv_freq in a buffer afterwards (stateful); this reference is stateless and uses T of the one sequence.
* Block (NomicBertBlock, prenorm False, post-norm): h = norm1(h + attn(h)); h = norm2(h + mlp(h)). No final norm.
* MLP: for "swiglu" / "geglu" / "glu" the gated NomciBertGatedMLP: y = fc11(x), gate = fc12(x),
  out = fc2(y * act(gate)) with act = silu (swiglu), exact erf gelu (geglu), sigmoid (glu). So fc11 is the VALUE and
  fc12 the GATE. fc11/fc12 bias iff `mlp_fc1_bias`, fc2 bias iff `mlp_fc2_bias`. Note the original rounds the hidden
  width up to a multiple of 256 (n_inner = 3072 for the real models is unchanged); this reference takes the width from
  the tensors. Otherwise the plain MLP fc2(gelu(fc1(x))) with exact (erf) gelu for every gelu spelling, because the
  block passes the function F.gelu, not the name.

GTE "new": Alibaba-NLP/new-impl `modeling.py` and `configuration.py` (named by gte-*-v1.5's `auto_map`). Second
reading: text-embeddings-inference `backends/candle/src/models/gte.rs` and `layers/rotary.rs`.

* Config (NewConfig defaults): `hidden_size` 768, `num_hidden_layers` 12, `num_attention_heads` 12,
  `intermediate_size` 3072, `hidden_act` "gelu", `max_position_embeddings` 2048, `type_vocab_size` 1,
  `layer_norm_type` "layer_norm" (or "rms_norm"), `layer_norm_eps` 1e-12, `position_embedding_type` "rope" (or
  "absolute"), `rope_theta` 10000.0, `rope_scaling` None, `pack_qkv` True, `unpad_inputs` False,
  `use_memory_efficient_attention` False, `logn_attention_scale` False, `logn_attention_clip1` False.
* Embeddings (NewEmbeddings): word embedding, plus token type embedding when `type_vocab_size` > 0 (token types
  default to zeros), plus an absolute position embedding only when `position_embedding_type` is "absolute"; then
  `embeddings.LayerNorm`. Rotary tables are built here and shared by all layers.
* Rotary (RotaryEmbedding / NTKScalingRotaryEmbedding): dim = hidden / heads (the whole head),
  inv_freq[j] = 1 / theta ** (2j / dim), rotate-half layout (cos/sin = cat(freqs, freqs)). With
  rope_scaling {"type": "ntk", "factor": f} and no "mixed_b": the NTK tables are built at construction for length
  max_position_embeddings * f, and since that exceeds max_position_embeddings whenever f > 1 the scaling applies to
  EVERY sequence, short ones included:
      inv_freq[j] = 1 / (theta * f) ** (2j / dim) / f ** (2 / dim)
  With "mixed_b" = b: inv_freq[j] = 1 / theta ** (2j / dim) / exp(a * (j + 1) ** b), a = ln(f) / (dim / 2) ** b.
  (If f <= 1 the plain table is used unless a sequence is longer than max_position_embeddings.)
* Attention (NewAttention): `attention.qkv_proj` (always with bias) split into three blocks of `hidden_size`,
  q then k then v, each viewed as (heads, head_dim); rotary on q and k; with `logn_attention_scale` q is multiplied
  by log(T) / log(max_position_embeddings), floored at 1 when `logn_attention_clip1`; scores / sqrt(head_dim), plus the
  extended additive mask, softmax, times v; `attention.o_proj` (with bias). With `pack_qkv` false: q_proj/k_proj/v_proj.
* Layer (NewLayer, post-norm): h = attn_ln(h + attn(h)); h = mlp_ln(h + mlp(h)). No final norm.
* MLP (NewGatedMLP): `mlp.up_gate_proj` (NO bias) gives 2 * intermediate_size outputs; the FIRST half is `up`
  (value), the SECOND half is `gate`; out = down_proj(act(gate) * up), `mlp.down_proj` with bias. act is
  transformers' ACT2FN[hidden_act]: "gelu" = exact erf gelu; "gelu_new" / "gelu_pytorch_tanh" = tanh approximation;
  "silu"/"swish"; "relu".
"""

import json
import math
import pathlib

import numpy as np
from safetensors.numpy import load_file

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def relu(x):
    return np.maximum(x, 0.0)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def linear(x, tensors, name, bias=True):
    y = x @ tensors[name + ".weight"].T
    if bias:
        y = y + tensors[name + ".bias"]
    return y


GTE_ACTS = {"gelu": gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "gelu_fast": gelu_tanh,
            "silu": silu, "swish": silu, "relu": relu}

_PREFIXES = ("new.", "bert.", "model.")


def load(folder):
    folder = pathlib.Path(folder)
    config = json.loads((folder / "config.json").read_text())
    raw = load_file(str(folder / "model.safetensors"))
    tensors = {}
    for name, value in raw.items():
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        tensors[name] = np.asarray(value, dtype=np.float64)
    return config, tensors


# ---------------------------------------------------------------------------------------------------------------- rotary
def inv_freq_plain(dim, base):
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def nomic_inv_freq(config, rotary_dim, seq_len):
    base = float(config.get("rotary_emb_base", 10000))
    factor = config.get("rotary_scaling_factor")
    max_trained = config.get("max_trained_positions", 2048)
    if factor and seq_len > max_trained:
        base = base * ((factor * seq_len / max_trained) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
    return inv_freq_plain(rotary_dim, base)


def gte_inv_freq(config, dim, seq_len):
    theta = float(config.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling")
    if scaling is None:
        return inv_freq_plain(dim, theta)
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind != "ntk":
        raise NotImplementedError(f"rope_scaling type {kind!r} (the original raises too)")
    factor = float(scaling["factor"])
    max_pos = config.get("max_position_embeddings", 2048)
    cached = max(max_pos * factor, seq_len)
    if not cached > max_pos:
        return inv_freq_plain(dim, theta)
    mixed_b = scaling.get("mixed_b")
    if mixed_b is None:
        return inv_freq_plain(dim, theta * factor) / factor ** (2.0 / dim)
    a = math.log(factor) / (dim / 2) ** mixed_b
    lam = np.exp(a * np.arange(1, dim // 2 + 1, dtype=np.float64) ** mixed_b)
    return inv_freq_plain(dim, theta) / lam


def rotary_tables(inv_freq, positions):
    """cos, sin of shape [T, rotary_dim / 2]."""
    angles = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    return np.cos(angles), np.sin(angles)


def apply_rotary(x, cos, sin, interleaved=False):
    """x: [T, heads, head_dim]; rotates the first 2 * cos.shape[-1] dims of each head."""
    ro = 2 * cos.shape[-1]
    xr, rest = x[..., :ro], x[..., ro:]
    c = cos[:, None, :]
    s = sin[:, None, :]
    if not interleaved:
        x1, x2 = xr[..., : ro // 2], xr[..., ro // 2:]
        out = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = np.empty_like(xr)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x2 * c + x1 * s
    return np.concatenate([out, rest], axis=-1)


def attention(q, k, v):
    """q, k, v: [T, heads, head_dim] -> [T, heads * head_dim]. No mask: one unpadded sequence."""
    t, h, d = q.shape
    scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    ctx = np.einsum("hqk,khd->qhd", softmax(scores, -1), v)
    return ctx.reshape(t, h * d)


# ----------------------------------------------------------------------------------------------------------------- nomic
def nomic_forward(config, tensors, ids, token_type_ids=None):
    ids = np.asarray(ids, dtype=np.int64)
    t = len(ids)
    hidden = config["n_embd"]
    heads = config["n_head"]
    head_dim = hidden // heads
    eps = config.get("layer_norm_epsilon", 1e-5)
    fraction = config.get("rotary_emb_fraction", 0.0)
    if config.get("prenorm", False):
        raise NotImplementedError("prenorm NomicBERT (no released embedding model uses it)")
    if config.get("rotary_emb_scale_base") is not None:
        raise NotImplementedError("xPos-style rotary_emb_scale_base")

    h = tensors["embeddings.word_embeddings.weight"][ids]
    if config.get("type_vocab_size", 2) > 0:
        tt = np.zeros(t, dtype=np.int64) if token_type_ids is None else np.asarray(token_type_ids)
        h = h + tensors["embeddings.token_type_embeddings.weight"][tt]
    if fraction <= 0 and config.get("n_positions", 0) > 0:
        h = h + tensors["embeddings.position_embeddings.weight"][np.arange(t)]
    h = layer_norm(h, tensors["emb_ln.weight"], tensors["emb_ln.bias"], eps)

    rotary_dim = int(head_dim * fraction)
    if rotary_dim > 0:
        cos, sin = rotary_tables(nomic_inv_freq(config, rotary_dim, t), np.arange(t))
    qkv_bias = config.get("qkv_proj_bias", True)
    fc1_bias = config.get("mlp_fc1_bias", True)
    fc2_bias = config.get("mlp_fc2_bias", True)
    act_name = config.get("activation_function", "gelu_new")

    for i in range(config["n_layer"]):
        p = f"encoder.layers.{i}."
        qkv = linear(h, tensors, p + "attn.Wqkv", qkv_bias).reshape(t, 3, heads, head_dim)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        if rotary_dim > 0:
            interleaved = config.get("rotary_emb_interleaved", False)
            q = apply_rotary(q, cos, sin, interleaved)
            k = apply_rotary(k, cos, sin, interleaved)
        a = linear(attention(q, k, v), tensors, p + "attn.out_proj", qkv_bias)
        h = layer_norm(h + a, tensors[p + "norm1.weight"], tensors[p + "norm1.bias"], eps)

        if act_name in ("swiglu", "geglu", "glu"):
            act = {"swiglu": silu, "geglu": gelu, "glu": sigmoid}[act_name]
            y = linear(h, tensors, p + "mlp.fc11", fc1_bias)
            gate = linear(h, tensors, p + "mlp.fc12", fc1_bias)
            m = linear(y * act(gate), tensors, p + "mlp.fc2", fc2_bias)
        else:
            m = linear(gelu(linear(h, tensors, p + "mlp.fc1", fc1_bias)), tensors, p + "mlp.fc2", fc2_bias)
        h = layer_norm(h + m, tensors[p + "norm2.weight"], tensors[p + "norm2.bias"], eps)
    return h


# ------------------------------------------------------------------------------------------------------------------- gte
def gte_norm(config, tensors, name, x):
    eps = config.get("layer_norm_eps", 1e-12)
    if config.get("layer_norm_type", "layer_norm") == "rms_norm":
        return rms_norm(x, tensors[name + ".weight"], eps)
    return layer_norm(x, tensors[name + ".weight"], tensors[name + ".bias"], eps)


def gte_forward(config, tensors, ids, token_type_ids=None):
    ids = np.asarray(ids, dtype=np.int64)
    t = len(ids)
    hidden = config.get("hidden_size", 768)
    heads = config.get("num_attention_heads", 12)
    head_dim = hidden // heads
    inter = config.get("intermediate_size", 3072)
    pos_type = config.get("position_embedding_type", "rope")

    h = tensors["embeddings.word_embeddings.weight"][ids]
    if config.get("type_vocab_size", 1) > 0:
        tt = np.zeros(t, dtype=np.int64) if token_type_ids is None else np.asarray(token_type_ids)
        h = h + tensors["embeddings.token_type_embeddings.weight"][tt]
    if pos_type == "absolute":
        h = h + tensors["embeddings.position_embeddings.weight"][np.arange(t)]
    elif pos_type != "rope":
        raise ValueError(pos_type)
    h = gte_norm(config, tensors, "embeddings.LayerNorm", h)

    if pos_type == "rope":
        cos, sin = rotary_tables(gte_inv_freq(config, head_dim, t), np.arange(t))
    scale = None
    if config.get("logn_attention_scale", False):
        scale = math.log(t) / math.log(config.get("max_position_embeddings", 2048))
        if config.get("logn_attention_clip1", False):
            scale = max(scale, 1.0)
    act = GTE_ACTS[config.get("hidden_act", "gelu")]

    for i in range(config.get("num_hidden_layers", 12)):
        p = f"encoder.layer.{i}."
        if config.get("pack_qkv", True):
            qkv = linear(h, tensors, p + "attention.qkv_proj")
            q, k, v = qkv[:, :hidden], qkv[:, hidden:2 * hidden], qkv[:, 2 * hidden:]
        else:
            q, k, v = (linear(h, tensors, p + f"attention.{n}_proj") for n in "qkv")
        q, k, v = (x.reshape(t, heads, head_dim) for x in (q, k, v))
        if pos_type == "rope":
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        if scale is not None:
            q = q * scale
        a = linear(attention(q, k, v), tensors, p + "attention.o_proj")
        h = gte_norm(config, tensors, p + "attn_ln", h + a)

        up_gate = linear(h, tensors, p + "mlp.up_gate_proj", bias=False)
        up, gate = up_gate[:, :inter], up_gate[:, inter:]
        m = linear(act(gate) * up, tensors, p + "mlp.down_proj")
        h = gte_norm(config, tensors, p + "mlp_ln", h + m)
    return h


# ----------------------------------------------------------------------------------------------------------------- mpnet
def mpnet_bucket(relative, buckets=32, max_distance=128):
    """T5's bucket of a key `relative` positions after its query (transformers' MPNet computes it with 32 buckets,
    whatever the table holds): half the buckets per direction (keys after the query in the upper half), exact below a
    quarter, then logarithmic up to `max_distance`, in float32 and truncated as torch does."""
    half = buckets // 2
    n = -relative
    out = half if n < 0 else 0
    n = abs(n)
    exact = half // 2
    if n < exact:
        return out + n
    large = exact + int(np.float32(np.log(np.float32(n) / np.float32(exact)))
                        / np.float32(math.log(max_distance / exact)) * np.float32(half - exact))
    return out + min(large, half - 1)


def mpnet_forward(config, tensors, ids, token_type_ids=None):
    """MPNet (transformers' MPNetModel): word embeddings plus learned positions numbered from pad_token_id + 1,
    LayerNorm; post-norm layers (q, k, v, o with biases; the scores over sqrt(head_dim) plus a per-head bias looked up
    by the query-to-key distance's bucket; LayerNorm(attention + input); exact GELU MLP; LayerNorm(mlp + input))."""
    del token_type_ids  # MPNet has no token types.
    ids = np.asarray(ids)
    t = len(ids)
    heads, eps = config["num_attention_heads"], config.get("layer_norm_eps", 1e-5)
    pad = config.get("pad_token_id", 1)
    x = tensors["embeddings.word_embeddings.weight"][ids] + tensors["embeddings.position_embeddings.weight"][
        np.arange(t) + pad + 1]
    x = layer_norm(x, tensors["embeddings.LayerNorm.weight"], tensors["embeddings.LayerNorm.bias"], eps)
    table = tensors["encoder.relative_attention_bias.weight"]  # [buckets, heads]
    buckets = np.array([[mpnet_bucket(k - q) for k in range(t)] for q in range(t)])
    bias = table[buckets].transpose(2, 0, 1)  # [heads, q, k]
    d = x.shape[-1] // heads
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q, k, v = (linear(x, tensors, p + f"attention.attn.{n}").reshape(t, heads, d) for n in "qkv")
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d) + bias
        context = np.einsum("hqk,khd->qhd", softmax(scores, -1), v).reshape(t, heads * d)
        x = layer_norm(linear(context, tensors, p + "attention.attn.o") + x, tensors[p + "attention.LayerNorm.weight"],
                       tensors[p + "attention.LayerNorm.bias"], eps)
        inner = gelu(linear(x, tensors, p + "intermediate.dense"))
        x = layer_norm(linear(inner, tensors, p + "output.dense") + x, tensors[p + "output.LayerNorm.weight"],
                       tensors[p + "output.LayerNorm.bias"], eps)
    return x


ARCHITECTURES = {"nomic_bert": nomic_forward, "new": gte_forward, "mpnet": mpnet_forward}


def forward(folder, ids, token_type_ids=None):
    """Last hidden state [tokens, hidden] (float64) of one unpadded sequence, for config.json's `model_type`."""
    config, tensors = load(folder)
    return ARCHITECTURES[config["model_type"]](config, tensors, ids, token_type_ids)
