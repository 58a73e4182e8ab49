//! NomicBERT (`model_type = "nomic_bert"`: nomic-embed-text): BERT's post-norm layers with rotary embeddings in
//! place of learned positions (over the whole head, halves or neighbours paired), a fused `Wqkv`, and a gated MLP
//! (`fc11` the value, `fc12` the gate: SwiGLU, GeGLU or GLU), its own config keys (GPT-2's names), and biases where
//! `qkv_proj_bias` and `mlp_fc*_bias` say.

use candle_core::{Module, Tensor};
use candle_nn::{Activation, LayerNorm, Linear, VarBuilder};

use crate::batch::Batch;
use crate::layers::{
    attention, field, field_or, gated, hidden_and_heads, linear, merge_heads, rotate, rotate_interleaved, split_heads,
    under, Bias, Rotary, TokenEmbeddings,
};
use crate::transformer::{Dims, Encoder};

/// The MLP: gated (`fc11`, `fc12`, `fc2`) or plain (`fc1`, `fc2`).
enum Mlp {
    Gated { value: Linear, gate: Linear, activation: Activation },
    Plain { up: Linear, activation: Activation },
}

pub(crate) struct Config {
    pub dims: Dims,
    layers: usize,
    heads: usize,
    /// The activation, and whether the MLP is gated.
    activation: (Activation, bool),
    eps: f64,
    theta: f64,
    interleaved: bool,
    qkv_bias: bool,
    fc1_bias: bool,
    fc2_bias: bool,
}

impl Config {
    pub(crate) fn read(json: &serde_json::Value) -> Result<Config, String> {
        let (hidden, heads) = hidden_and_heads(json, ["n_embd", "n_head"], true)?;
        if field_or(json, "prenorm", false)? {
            return Err("prenorm: only post-norm NomicBERT (prenorm false) is supported".into());
        }
        let fraction: f64 = field_or(json, "rotary_emb_fraction", 0.0)?;
        if fraction != 1.0 {
            return Err(format!(
                "rotary_emb_fraction: {fraction}; inferd runs NomicBERT with the rotary embedding over whole heads (1.0)"
            ));
        }
        if field_or::<Option<f64>>(json, "rotary_scaling_factor", None)?.is_some() {
            return Err("rotary_scaling_factor: dynamic NTK scaling is not supported; set it to null".into());
        }
        // What would change the arithmetic unseen: refused, each by its key.
        for (key, refused) in [
            ("norm_mlp", "a LayerNorm after the gated MLP"),
            ("use_rms_norm", "RMSNorm"),
            ("causal", "causal attention"),
        ] {
            if field_or(json, key, false)? {
                return Err(format!("{key}: {refused} is not supported; inferd runs NomicBERT without it"));
            }
        }
        if !json.get("rotary_emb_scale_base").is_none_or(serde_json::Value::is_null) {
            return Err("rotary_emb_scale_base: the scaled rotary embedding (xPos) is not supported".into());
        }
        if field_or(json, "moe_every_n_layers", 0usize)? > 0 || field_or(json, "num_experts", 0usize)? > 0 {
            return Err(
                "moe_every_n_layers: NomicBERT's mixture of experts (nomic-embed-text-v2-moe) is not supported".into(),
            );
        }
        let name: String = field_or(json, "activation_function", "gelu_new".to_owned())?;
        let activation = match name.as_str() {
            "swiglu" => (Activation::Silu, true),
            "geglu" => (Activation::Gelu, true),
            "glu" => (Activation::Sigmoid, true),
            // Its block is given exact GELU for every other name, whatever the name says.
            "gelu" | "gelu_new" | "gelu_fast" | "gelu_pytorch_tanh" | "relu" => (Activation::Gelu, false),
            other => return Err(format!("activation_function: `{other}` is not swiglu, geglu, glu, gelu or relu")),
        };
        Ok(Config {
            dims: Dims {
                hidden,
                vocab: field(json, "vocab_size")?,
                token_types: field_or(json, "type_vocab_size", 2)?,
            },
            layers: field(json, "n_layer")?,
            heads,
            activation,
            eps: field_or(json, "layer_norm_epsilon", 1e-5)?,
            theta: field_or(json, "rotary_emb_base", 10_000.0)?,
            interleaved: field_or(json, "rotary_emb_interleaved", false)?,
            qkv_bias: field_or(json, "qkv_proj_bias", true)?,
            fc1_bias: field_or(json, "mlp_fc1_bias", true)?,
            fc2_bias: field_or(json, "mlp_fc2_bias", true)?,
        })
    }
}

struct Layer {
    qkv: Linear,
    o: Linear,
    norm1: LayerNorm,
    mlp: Mlp,
    down: Linear,
    norm2: LayerNorm,
}

pub(crate) struct NomicBert {
    embeddings: TokenEmbeddings,
    norm: LayerNorm,
    layers: Vec<Layer>,
    rotary: Rotary,
    config: Config,
}

impl NomicBert {
    pub(crate) fn load(root: &VarBuilder, config: Config) -> candle_core::Result<NomicBert> {
        let vb = under(root, "bert", "embeddings.word_embeddings.weight");
        let c = &config;
        let h = c.dims.hidden;
        let layers = (0..c.layers)
            .map(|i| {
                let l = vb.pp(format!("encoder.layers.{i}"));
                let m = l.pp("mlp");
                let (activation, is_gated) = c.activation;
                // The MLP's width as stored: NomicBERT rounds `n_inner` (or its default) up to a multiple of 256 for
                // a gated MLP, so the weights say it, not the config.
                let inner = m.pp("fc2").get_unchecked("weight")?.dim(1)?;
                Ok(Layer {
                    qkv: linear(h, 3 * h, c.qkv_bias, l.pp("attn.Wqkv"))?,
                    o: linear(h, h, c.qkv_bias, l.pp("attn.out_proj"))?,
                    norm1: candle_nn::layer_norm(h, c.eps, l.pp("norm1"))?,
                    mlp: match is_gated {
                        true => Mlp::Gated {
                            value: linear(h, inner, c.fc1_bias, m.pp("fc11"))?,
                            gate: linear(h, inner, c.fc1_bias, m.pp("fc12"))?,
                            activation,
                        },
                        false => Mlp::Plain { up: linear(h, inner, c.fc1_bias, m.pp("fc1"))?, activation },
                    },
                    down: linear(inner, h, c.fc2_bias, m.pp("fc2"))?,
                    norm2: candle_nn::layer_norm(h, c.eps, l.pp("norm2"))?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(NomicBert {
            embeddings: TokenEmbeddings::load(c.dims, vb.pp("embeddings"))?,
            norm: candle_nn::layer_norm(h, c.eps, vb.pp("emb_ln"))?,
            layers,
            rotary: Rotary::new(h / c.heads, c.theta, vb.device())?,
            config,
        })
    }
}

impl Encoder for NomicBert {
    fn dims(&self) -> Dims {
        self.config.dims
    }

    fn encode(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let mut x = self.norm.forward(&self.embeddings.forward(batch)?)?;
        let dtype = x.dtype();
        let (cos, sin) = self.rotary.cos_sin(&batch.positions(0, 0)?, dtype)?;
        let turn = |t: &Tensor| match c.interleaved {
            true => rotate_interleaved(t, &cos, &sin),
            false => rotate(t, &cos, &sin),
        };
        let mask = Bias::keys(batch.key_mask(dtype)?);
        let h = c.dims.hidden;
        let scale = 1.0 / ((h / c.heads) as f64).sqrt();
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x)?;
            let q = turn(&split_heads(&qkv.narrow(2, 0, h)?, c.heads)?)?;
            let k = turn(&split_heads(&qkv.narrow(2, h, h)?, c.heads)?)?;
            let v = split_heads(&qkv.narrow(2, 2 * h, h)?, c.heads)?;
            let attended = layer.o.forward(&merge_heads(&attention(&q, &k, &v, &mask, scale)?)?)?;
            x = layer.norm1.forward(&(attended + x)?)?;
            let inner = match &layer.mlp {
                Mlp::Gated { value, gate, activation } => gated(&gate.forward(&x)?, &value.forward(&x)?, *activation)?,
                Mlp::Plain { up, activation } => activation.forward(&up.forward(&x)?)?,
            };
            x = layer.norm2.forward(&(layer.down.forward(&inner)? + x)?)?;
        }
        Ok(x)
    }
}
