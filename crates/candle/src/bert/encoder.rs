//! BERT's encoder layers (post-norm: self-attention, then a plain MLP, each added to its input and normalised), as
//! BERT, RoBERTa and XLM-RoBERTa name their tensors (DistilBERT's are renamed into these names by the loader). The
//! attention is the one every architecture here shares ([`crate::layers::attention`]): a long text's scores are made
//! a piece of queries at a time, and on the CPU a half-precision softmax sums in F32.

use candle_core::{Module, Tensor};
use candle_nn::{Activation, LayerNorm, Linear, VarBuilder};

use crate::bert::config::Config;
use crate::layers::{attention, merge_heads, split_heads, Bias};

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    /// `attention.output.dense`.
    attended: Linear,
    attention_norm: LayerNorm,
    /// `intermediate.dense`.
    up: Linear,
    /// `output.dense`.
    down: Linear,
    output_norm: LayerNorm,
}

pub(crate) struct Encoder {
    layers: Vec<Layer>,
    heads: usize,
    activation: Activation,
}

impl Encoder {
    /// The layers `layer.0` … under `vb` (a checkpoint's `encoder`).
    pub(crate) fn load(vb: VarBuilder, c: &Config) -> candle_core::Result<Encoder> {
        let (h, inner) = (c.hidden_size, c.intermediate_size);
        let norm = |vb: VarBuilder| candle_nn::layer_norm(h, c.layer_norm_eps, vb);
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = vb.pp(format!("layer.{i}"));
                let a = l.pp("attention");
                Ok(Layer {
                    query: candle_nn::linear(h, h, a.pp("self.query"))?,
                    key: candle_nn::linear(h, h, a.pp("self.key"))?,
                    value: candle_nn::linear(h, h, a.pp("self.value"))?,
                    attended: candle_nn::linear(h, h, a.pp("output.dense"))?,
                    attention_norm: norm(a.pp("output.LayerNorm"))?,
                    up: candle_nn::linear(h, inner, l.pp("intermediate.dense"))?,
                    down: candle_nn::linear(inner, h, l.pp("output.dense"))?,
                    output_norm: norm(l.pp("output.LayerNorm"))?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Encoder { layers, heads: c.num_attention_heads, activation: c.hidden_act })
    }

    /// The last hidden state of the embedded tokens `x` `[rows, seq, hidden]`, with `mask` (`[rows, 1, 1, seq]`, in
    /// `x`'s dtype) added to every score.
    pub(crate) fn forward(&self, x: &Tensor, mask: Tensor) -> candle_core::Result<Tensor> {
        let scale = 1.0 / ((x.dim(2)? / self.heads) as f64).sqrt();
        let mask = Bias::keys(mask);
        let mut x = x.clone();
        for layer in &self.layers {
            let q = split_heads(&layer.query.forward(&x)?, self.heads)?;
            let k = split_heads(&layer.key.forward(&x)?, self.heads)?;
            let v = split_heads(&layer.value.forward(&x)?, self.heads)?;
            let attended = layer.attended.forward(&merge_heads(&attention(&q, &k, &v, &mask, scale)?)?)?;
            x = layer.attention_norm.forward(&(attended + x)?)?;
            let inner = self.activation.forward(&layer.up.forward(&x)?)?;
            x = layer.output_norm.forward(&(layer.down.forward(&inner)? + x)?)?;
        }
        Ok(x)
    }
}
