//! Qwen3 (`model_type = "qwen3"`), the decoder of Qwen3-Embedding: pre-norm layers with RMSNorm, grouped-query
//! attention whose queries and keys are RMS-normalised per head before the rotary embedding, causal (and, where
//! configured, a sliding window), and a SwiGLU MLP. A text's embedding is its last token's state, so the padding
//! around a text must change nothing: positions count real tokens and no query reads a padded key.

use candle_core::{Module, Tensor};
use candle_nn::{Activation, Embedding, Linear, RmsNorm, VarBuilder};

use crate::batch::Batch;
use crate::layers::{
    attention, field, field_or, gated, linear, merge_heads, rotate, split_heads, under, Bias, RopeSettings, Rotary,
};
use crate::transformer::{Dims, Encoder};

pub(crate) struct Config {
    pub dims: Dims,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    activation: Activation,
    eps: f64,
    theta: f64,
    bias: bool,
    /// Per layer: the window a query reads back (itself included), or `None` for every earlier token.
    windows: Vec<Option<usize>>,
}

impl Config {
    pub(crate) fn read(json: &serde_json::Value) -> Result<Config, String> {
        let hidden: usize = field(json, "hidden_size")?;
        let heads: usize = field(json, "num_attention_heads")?;
        let kv_heads: usize = field_or(json, "num_key_value_heads", heads)?;
        if heads == 0 {
            return Err("num_attention_heads: 0".into());
        }
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(format!("num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}"));
        }
        let head_dim = match field_or::<Option<usize>>(json, "head_dim", None)? {
            Some(d) => d,
            None if hidden.is_multiple_of(heads) => hidden / heads,
            None => return Err(format!("num_attention_heads: {heads} heads do not divide hidden_size {hidden}")),
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(format!("head_dim: {head_dim}; the rotary embedding pairs a head's dimensions"));
        }
        let layers: usize = field(json, "num_hidden_layers")?;
        let sliding: Option<usize> = match field_or(json, "use_sliding_window", false)? {
            true => field_or(json, "sliding_window", None)?,
            false => None,
        };
        let types: Option<Vec<String>> = field_or(json, "layer_types", None)?;
        let first_sliding: usize = field_or(json, "max_window_layers", layers)?;
        let windows = (0..layers)
            .map(|i| match (&types, sliding) {
                (_, None) => Ok(None),
                (Some(types), Some(w)) => match types.get(i).map(String::as_str) {
                    Some("sliding_attention") => Ok(Some(w)),
                    Some("full_attention") => Ok(None),
                    other => {
                        Err(format!("layer_types: layer {i} is {other:?}, not full_attention or sliding_attention"))
                    }
                },
                (None, Some(w)) => Ok((i >= first_sliding).then_some(w)),
            })
            .collect::<Result<_, String>>()?;
        Ok(Config {
            dims: Dims { hidden, vocab: field(json, "vocab_size")?, token_types: 0 },
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate: field(json, "intermediate_size")?,
            activation: field_or(json, "hidden_act", Activation::Silu)?,
            eps: field_or(json, "rms_norm_eps", 1e-6)?,
            theta: RopeSettings::read(json, None, 10_000.0)?.unscaled()?,
            bias: field_or(json, "attention_bias", false)?,
            windows,
        })
    }
}

struct Layer {
    input_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    post_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

pub(crate) struct Qwen3 {
    words: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    rotary: Rotary,
    config: Config,
}

impl Qwen3 {
    pub(crate) fn load(root: &VarBuilder, config: Config) -> candle_core::Result<Qwen3> {
        let vb = under(root, "model", "embed_tokens.weight");
        let c = &config;
        let (h, d) = (c.dims.hidden, c.head_dim);
        let layers = (0..c.layers)
            .map(|i| {
                let l = vb.pp(format!("layers.{i}"));
                let a = l.pp("self_attn");
                let m = l.pp("mlp");
                Ok(Layer {
                    input_norm: candle_nn::rms_norm(h, c.eps, l.pp("input_layernorm"))?,
                    q: linear(h, c.heads * d, c.bias, a.pp("q_proj"))?,
                    k: linear(h, c.kv_heads * d, c.bias, a.pp("k_proj"))?,
                    v: linear(h, c.kv_heads * d, c.bias, a.pp("v_proj"))?,
                    o: linear(c.heads * d, h, c.bias, a.pp("o_proj"))?,
                    q_norm: candle_nn::rms_norm(d, c.eps, a.pp("q_norm"))?,
                    k_norm: candle_nn::rms_norm(d, c.eps, a.pp("k_norm"))?,
                    post_norm: candle_nn::rms_norm(h, c.eps, l.pp("post_attention_layernorm"))?,
                    gate: linear(h, c.intermediate, false, m.pp("gate_proj"))?,
                    up: linear(h, c.intermediate, false, m.pp("up_proj"))?,
                    down: linear(c.intermediate, h, false, m.pp("down_proj"))?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Qwen3 {
            words: candle_nn::embedding(c.dims.vocab, h, vb.pp("embed_tokens"))?,
            layers,
            norm: candle_nn::rms_norm(h, c.eps, vb.pp("norm"))?,
            rotary: Rotary::new(d, c.theta, vb.device())?,
            config,
        })
    }
}

/// `[rows, seq, heads × dim]` split into heads, each RMS-normalised: `[rows, heads, seq, dim]`.
fn normed_heads(x: &Tensor, heads: usize, norm: &RmsNorm) -> candle_core::Result<Tensor> {
    let (rows, seq, width) = x.dims3()?;
    norm.forward(&x.reshape((rows, seq, heads, width / heads))?)?.transpose(1, 2)?.contiguous()
}

impl Encoder for Qwen3 {
    fn dims(&self) -> Dims {
        self.config.dims
    }

    fn encode(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let mut x = self.words.forward(&batch.ids)?;
        let dtype = x.dtype();
        let (cos, sin) = self.rotary.cos_sin(&batch.positions(0, 0)?, dtype)?;
        let (rows, seq) = (batch.rows, batch.seq);
        let causal = Bias::per_query(rows, seq, seq, |start, n| batch.pair_mask(dtype, |q, k| k <= q, start, n))?;
        // One window size for every sliding layer.
        let windowed = match c.windows.iter().flatten().next() {
            Some(&w) => Some(Bias::per_query(rows, seq, seq, move |start, n| {
                batch.pair_mask(dtype, move |q, k| k <= q && q - k < w, start, n)
            })?),
            None => None,
        };
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        for (layer, window) in self.layers.iter().zip(&c.windows) {
            let mask = match (window, &windowed) {
                (Some(_), Some(windowed)) => windowed,
                _ => &causal,
            };
            let n = layer.input_norm.forward(&x)?;
            let q = rotate(&normed_heads(&layer.q.forward(&n)?, c.heads, &layer.q_norm)?, &cos, &sin)?;
            let k = rotate(&normed_heads(&layer.k.forward(&n)?, c.kv_heads, &layer.k_norm)?, &cos, &sin)?;
            let v = split_heads(&layer.v.forward(&n)?, c.kv_heads)?;
            x = (x + layer.o.forward(&merge_heads(&attention(&q, &k, &v, mask, scale)?)?)?)?;
            let n = layer.post_norm.forward(&x)?;
            let inner = gated(&layer.gate.forward(&n)?, &layer.up.forward(&n)?, c.activation)?;
            x = (x + layer.down.forward(&inner)?)?;
        }
        self.norm.forward(&x)
    }
}
