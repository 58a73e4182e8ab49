//! GTE's "new" architecture (`model_type = "new"`: gte-base-en-v1.5, gte-large-en-v1.5, gte-multilingual-base):
//! BERT's post-norm layers with rotary embeddings in place of learned positions (NTK-scaled where `rope_scaling`
//! says, for every length), a fused `qkv_proj` (or separate projections), and a gated MLP whose `up_gate_proj`
//! gives the value first, then the gate.

use candle_core::{Module, Tensor};
use candle_nn::{Activation, LayerNorm, Linear, RmsNorm, VarBuilder};

use crate::batch::Batch;
use crate::layers::{
    attention, field, field_or, gated, hidden_and_heads, linear, merge_heads, rotate, split_heads, under, Bias,
    RopeSettings, Rotary, TokenEmbeddings,
};
use crate::transformer::{Dims, Encoder};

pub(crate) struct Config {
    pub dims: Dims,
    layers: usize,
    heads: usize,
    intermediate: usize,
    activation: Activation,
    rms: bool,
    eps: f64,
    packed: bool,
    theta: f64,
    /// NTK scaling's factor (1: none).
    factor: f64,
}

impl Config {
    pub(crate) fn read(json: &serde_json::Value) -> Result<Config, String> {
        let (hidden, heads) = hidden_and_heads(json, ["hidden_size", "num_attention_heads"], true)?;
        let positions: String = field_or(json, "position_embedding_type", "rope".to_owned())?;
        if positions != "rope" {
            return Err(format!("position_embedding_type: `{positions}`; inferd runs this architecture with rope"));
        }
        if field_or(json, "logn_attention_scale", false)? {
            return Err("logn_attention_scale: true is not supported".into());
        }
        let rope = RopeSettings::read(json, None, 10_000.0)?;
        let factor = match rope.scaling.as_ref() {
            None => 1.0,
            Some((kind, _)) if json.pointer("/rope_scaling/mixed_b").is_some_and(|b| !b.is_null()) => {
                return Err(format!("rope_scaling: {kind} scaling with mixed_b is not supported"))
            }
            Some((kind, factor)) if kind == "ntk" => *factor,
            Some((kind, _)) => return Err(format!("rope_scaling: rope type `{kind}` is not supported (only ntk)")),
        };
        let norm: String = field_or(json, "layer_norm_type", "layer_norm".to_owned())?;
        let rms = match norm.as_str() {
            "layer_norm" => false,
            "rms_norm" => true,
            other => return Err(format!("layer_norm_type: `{other}` is not layer_norm or rms_norm")),
        };
        Ok(Config {
            dims: Dims {
                hidden,
                vocab: field(json, "vocab_size")?,
                token_types: field_or(json, "type_vocab_size", 1)?,
            },
            layers: field(json, "num_hidden_layers")?,
            heads,
            intermediate: field(json, "intermediate_size")?,
            activation: field_or(json, "hidden_act", Activation::Gelu)?,
            rms,
            eps: field_or(json, "layer_norm_eps", 1e-12)?,
            packed: field_or(json, "pack_qkv", true)?,
            theta: rope.theta,
            factor,
        })
    }
}

/// A LayerNorm or an RMSNorm, as `layer_norm_type` says.
enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    fn load(config: &Config, vb: VarBuilder) -> candle_core::Result<Norm> {
        let h = config.dims.hidden;
        Ok(match config.rms {
            false => Norm::Layer(candle_nn::layer_norm(h, config.eps, vb)?),
            true => Norm::Rms(candle_nn::rms_norm(h, config.eps, vb)?),
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }
}

/// The attention's input projections: packed `qkv_proj`, or `q_proj`, `k_proj`, `v_proj`.
enum Projections {
    Packed(Linear),
    Apart([Linear; 3]),
}

struct Layer {
    qkv: Projections,
    o: Linear,
    attention_norm: Norm,
    up_gate: Linear,
    down: Linear,
    mlp_norm: Norm,
}

pub(crate) struct Gte {
    embeddings: TokenEmbeddings,
    norm: Norm,
    layers: Vec<Layer>,
    rotary: Rotary,
    config: Config,
}

impl Gte {
    pub(crate) fn load(root: &VarBuilder, config: Config) -> candle_core::Result<Gte> {
        let vb = under(root, "new", "embeddings.word_embeddings.weight");
        let c = &config;
        let h = c.dims.hidden;
        let layers = (0..c.layers)
            .map(|i| {
                let l = vb.pp(format!("encoder.layer.{i}"));
                let a = l.pp("attention");
                Ok(Layer {
                    qkv: match c.packed {
                        true => Projections::Packed(linear(h, 3 * h, true, a.pp("qkv_proj"))?),
                        false => Projections::Apart([
                            linear(h, h, true, a.pp("q_proj"))?,
                            linear(h, h, true, a.pp("k_proj"))?,
                            linear(h, h, true, a.pp("v_proj"))?,
                        ]),
                    },
                    o: linear(h, h, true, a.pp("o_proj"))?,
                    attention_norm: Norm::load(c, l.pp("attn_ln"))?,
                    up_gate: linear(h, 2 * c.intermediate, false, l.pp("mlp.up_gate_proj"))?,
                    down: linear(c.intermediate, h, true, l.pp("mlp.down_proj"))?,
                    mlp_norm: Norm::load(c, l.pp("mlp_ln"))?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        let e = vb.pp("embeddings");
        let head_dim = h / c.heads;
        // NTK scaling, as the architecture builds its table at every length: the base times the factor, each
        // frequency divided by factor^(2 / head_dim).
        let (theta, divisor) = match c.factor {
            f if f > 1.0 => (c.theta * f, f.powf(2.0 / head_dim as f64)),
            _ => (c.theta, 1.0),
        };
        Ok(Gte {
            embeddings: TokenEmbeddings::load(c.dims, e.clone())?,
            norm: Norm::load(c, e.pp("LayerNorm"))?,
            layers,
            rotary: Rotary::scaled(head_dim, theta, divisor, vb.device())?,
            config,
        })
    }
}

impl Encoder for Gte {
    fn dims(&self) -> Dims {
        self.config.dims
    }

    fn encode(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let mut x = self.norm.forward(&self.embeddings.forward(batch)?)?;
        let dtype = x.dtype();
        let (cos, sin) = self.rotary.cos_sin(&batch.positions(0, 0)?, dtype)?;
        let mask = Bias::keys(batch.key_mask(dtype)?);
        let h = c.dims.hidden;
        let scale = 1.0 / ((h / c.heads) as f64).sqrt();
        for layer in &self.layers {
            let (q, k, v) = match &layer.qkv {
                Projections::Packed(qkv) => {
                    let qkv = qkv.forward(&x)?;
                    (qkv.narrow(2, 0, h)?, qkv.narrow(2, h, h)?, qkv.narrow(2, 2 * h, h)?)
                }
                Projections::Apart([q, k, v]) => (q.forward(&x)?, k.forward(&x)?, v.forward(&x)?),
            };
            let q = rotate(&split_heads(&q, c.heads)?, &cos, &sin)?;
            let k = rotate(&split_heads(&k, c.heads)?, &cos, &sin)?;
            let v = split_heads(&v, c.heads)?;
            let attended = layer.o.forward(&merge_heads(&attention(&q, &k, &v, &mask, scale)?)?)?;
            x = layer.attention_norm.forward(&(attended + x)?)?;
            let up_gate = layer.up_gate.forward(&x)?;
            let value = up_gate.narrow(2, 0, c.intermediate)?;
            let gate = up_gate.narrow(2, c.intermediate, c.intermediate)?;
            x = layer.mlp_norm.forward(&(layer.down.forward(&gated(&gate, &value, c.activation)?)? + x)?)?;
        }
        Ok(x)
    }
}
