//! MPNet (all-mpnet-base-v2's architecture, `model_type = "mpnet"`): BERT's post-norm layers with learned absolute
//! positions numbered past the padding id (as RoBERTa's), no token types, and a bias on every head's attention scores
//! from the query-to-key distance: T5's log-spaced buckets (exact up to a quarter of the buckets, logarithmic up to
//! 128 tokens, one bucket per direction beyond), shared by the layers.

use candle_core::{Module, Tensor};
use candle_nn::{Activation, Embedding, LayerNorm, Linear, VarBuilder};

use crate::batch::Batch;
use crate::layers::{attention, field, field_or, hidden_and_heads, linear, merge_heads, split_heads, under, Bias};
use crate::transformer::{last_linear, Dims, Encoder, Head};

/// The distance past which every bucket is the last of its direction, as MPNet fixes it.
const MAX_DISTANCE: i64 = 128;
/// The buckets MPNet computes with, whatever `relative_attention_num_buckets` sizes its table to.
const BUCKETS: usize = 32;

pub(crate) struct Config {
    pub dims: Dims,
    layers: usize,
    heads: usize,
    intermediate: usize,
    activation: Activation,
    positions: usize,
    eps: f64,
    buckets: usize,
    pad: u32,
}

impl Config {
    pub(crate) fn read(json: &serde_json::Value) -> Result<Config, String> {
        let (hidden, heads) = hidden_and_heads(json, ["hidden_size", "num_attention_heads"], false)?;
        Ok(Config {
            dims: Dims { hidden, vocab: field(json, "vocab_size")?, token_types: 0 },
            layers: field(json, "num_hidden_layers")?,
            heads,
            intermediate: field(json, "intermediate_size")?,
            activation: field_or(json, "hidden_act", Activation::Gelu)?,
            positions: field(json, "max_position_embeddings")?,
            eps: field_or(json, "layer_norm_eps", 1e-5)?,
            buckets: match field_or(json, "relative_attention_num_buckets", BUCKETS)? {
                n if n < BUCKETS => {
                    return Err(format!(
                    "relative_attention_num_buckets: {n}; MPNet computes {BUCKETS} buckets, so its table needs as many"
                ))
                }
                n => n,
            },
            pad: field_or(json, "pad_token_id", 1)?,
        })
    }
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attention_norm: LayerNorm,
    up: Linear,
    down: Linear,
    output_norm: LayerNorm,
}

pub(crate) struct MPNet {
    words: Embedding,
    positions: Embedding,
    norm: LayerNorm,
    layers: Vec<Layer>,
    /// `[buckets, heads]`.
    relative_bias: Tensor,
    config: Config,
}

impl MPNet {
    pub(crate) fn load(root: &VarBuilder, config: Config) -> candle_core::Result<MPNet> {
        let vb = under(root, "mpnet", "embeddings.word_embeddings.weight");
        let c = &config;
        let h = c.dims.hidden;
        let e = vb.pp("embeddings");
        let layers = (0..c.layers)
            .map(|i| {
                let l = vb.pp(format!("encoder.layer.{i}"));
                let a = l.pp("attention");
                Ok(Layer {
                    q: linear(h, h, true, a.pp("attn.q"))?,
                    k: linear(h, h, true, a.pp("attn.k"))?,
                    v: linear(h, h, true, a.pp("attn.v"))?,
                    o: linear(h, h, true, a.pp("attn.o"))?,
                    attention_norm: candle_nn::layer_norm(h, c.eps, a.pp("LayerNorm"))?,
                    up: linear(h, c.intermediate, true, l.pp("intermediate.dense"))?,
                    down: linear(c.intermediate, h, true, l.pp("output.dense"))?,
                    output_norm: candle_nn::layer_norm(h, c.eps, l.pp("output.LayerNorm"))?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(MPNet {
            words: candle_nn::embedding(c.dims.vocab, h, e.pp("word_embeddings"))?,
            positions: candle_nn::embedding(c.positions, h, e.pp("position_embeddings"))?,
            norm: candle_nn::layer_norm(h, c.eps, e.pp("LayerNorm"))?,
            layers,
            relative_bias: vb.pp("encoder.relative_attention_bias").get((c.buckets, c.heads), "weight")?,
            config,
        })
    }

    /// The bias `[1, heads, n, seq]` of each query `start..start + n` (row) and key (column) of `seq` tokens.
    fn position_bias(&self, start: usize, n: usize, seq: usize) -> candle_core::Result<Tensor> {
        let buckets: Vec<u32> = (start..start + n)
            .flat_map(|q| (0..seq).map(move |k| (q, k)))
            .map(|(q, k)| bucket(k as i64 - q as i64, BUCKETS))
            .collect();
        let buckets = Tensor::from_vec(buckets, n * seq, self.relative_bias.device())?;
        let heads = self.config.heads;
        self.relative_bias.index_select(&buckets, 0)?.reshape((n, seq, heads))?.permute((2, 0, 1))?.unsqueeze(0)
    }
}

/// `MPNetForSequenceClassification`'s head: `classifier.dense` and `classifier.out_proj` on the first token.
pub(crate) fn head(root: &VarBuilder, hidden: usize) -> candle_core::Result<Head> {
    let head = root.pp("classifier");
    Ok(Head::FirstToken {
        dense: linear(hidden, hidden, true, head.pp("dense"))?,
        out_proj: last_linear(&head.pp("out_proj"), hidden)?,
    })
}

/// T5's bucket of a key `relative` positions after its query, among `buckets` (half per direction), as MPNet
/// computes it: in F32, truncated.
fn bucket(relative: i64, buckets: usize) -> u32 {
    let half = (buckets / 2) as i64;
    let n = -relative;
    let direction = if n < 0 { half } else { 0 };
    let n = n.abs();
    let exact = half / 2;
    if n < exact {
        return (direction + n) as u32;
    }
    let scale = (MAX_DISTANCE as f64 / exact as f64).ln() as f32;
    let large = exact + ((n as f32 / exact as f32).ln() / scale * (half - exact) as f32) as i64;
    (direction + large.min(half - 1)) as u32
}

impl Encoder for MPNet {
    fn dims(&self) -> Dims {
        self.config.dims
    }

    fn encode(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let pad = self.config.pad;
        let x = self.words.forward(&batch.ids)?;
        let dtype = x.dtype();
        let x = (x + self.positions.forward(&batch.positions(pad + 1, pad)?)?)?;
        let mut x = self.norm.forward(&x)?;
        // Distances between real tokens are the same in any padding: the padded columns are masked.
        let keys = batch.key_mask(dtype)?;
        let heads = self.config.heads;
        let (rows, seq) = (batch.rows, batch.seq);
        let bias = Bias::per_query(rows * heads, seq, seq, |start, n| {
            self.position_bias(start, n, seq)?.to_dtype(dtype)?.broadcast_add(&keys)
        })?;
        let scale = 1.0 / ((self.config.dims.hidden / heads) as f64).sqrt();
        for layer in &self.layers {
            let (q, k, v) = (layer.q.forward(&x)?, layer.k.forward(&x)?, layer.v.forward(&x)?);
            let context =
                attention(&split_heads(&q, heads)?, &split_heads(&k, heads)?, &split_heads(&v, heads)?, &bias, scale)?;
            let attended = layer.attention_norm.forward(&(layer.o.forward(&merge_heads(&context)?)? + &x)?)?;
            let inner = self.config.activation.forward(&layer.up.forward(&attended)?)?;
            x = layer.output_norm.forward(&(layer.down.forward(&inner)? + attended)?)?;
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_are_exact_near_and_logarithmic_far_in_each_direction() {
        // 32 buckets: 16 per direction, 8 exact; a key before its query (negative) in the first half.
        assert_eq!((0..8).map(|d| bucket(-d, 32)).collect::<Vec<_>>(), (0..8).collect::<Vec<u32>>());
        assert_eq!(bucket(1, 32), 17);
        assert_eq!(bucket(-8, 32), 8);
        assert_eq!(bucket(-1000, 32), 15);
        assert_eq!(bucket(1000, 32), 31);
        assert!((8..200).map(|d| bucket(-d, 32)).collect::<Vec<_>>().windows(2).all(|w| w[0] <= w[1]));
    }
}
