//! ModernBERT (`model_type = "modernbert"`: gte-modernbert, modernbert-embed): pre-norm layers (the first without
//! its attention norm) with LayerNorms that may lack a bias, rotary embeddings in place of learned positions, a
//! fused `Wqkv`, a GeGLU MLP (`Wi` gives the activated half first, then its multiplier), a final norm, and attention
//! alternating between global layers and local ones, where a token reads only the tokens within half of
//! `local_attention` of it (each layer type with its own rotary base).

use candle_core::{Module, Tensor};
use candle_nn::{Activation, Embedding, LayerNorm, LayerNormConfig, Linear, VarBuilder};

use crate::batch::Batch;
use crate::layers::{
    attention, field, field_or, gated, hidden_and_heads, linear, merge_heads, rotate, under, Bias, RopeSettings, Rotary,
};
use crate::transformer::{last_linear, Dims, Encoder, Head};

const GLOBAL: &str = "full_attention";
const LOCAL: &str = "sliding_attention";

pub(crate) struct Config {
    pub dims: Dims,
    heads: usize,
    intermediate: usize,
    activation: Activation,
    eps: f64,
    norm_bias: bool,
    attention_bias: bool,
    mlp_bias: bool,
    /// Per layer: whether it is local.
    local: Vec<bool>,
    /// How far either side of a token a local layer reads.
    half_window: usize,
    global_theta: f64,
    local_theta: f64,
}

impl Config {
    pub(crate) fn read(json: &serde_json::Value) -> Result<Config, String> {
        let (hidden, heads) = hidden_and_heads(json, ["hidden_size", "num_attention_heads"], true)?;
        let layers: usize = field(json, "num_hidden_layers")?;
        let local = match field_or::<Option<Vec<String>>>(json, "layer_types", None)? {
            Some(types) if types.len() != layers => {
                return Err(format!("layer_types: {} entries for {layers} layers", types.len()))
            }
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    GLOBAL => Ok(false),
                    LOCAL => Ok(true),
                    other => Err(format!("layer_types: `{other}` is not {GLOBAL} or {LOCAL}")),
                })
                .collect::<Result<_, String>>()?,
            None => {
                let every: usize = field_or(json, "global_attn_every_n_layers", 3)?;
                if every == 0 {
                    return Err("global_attn_every_n_layers: 0".into());
                }
                (0..layers).map(|i| i % every != 0).collect()
            }
        };
        let parameters = json.get("rope_parameters");
        let theta = |kind: &str, legacy: &str, default: f64| {
            let legacy = field_or(json, legacy, default)?;
            RopeSettings::read(json, parameters.and_then(|p| p.get(kind)), legacy)?.unscaled()
        };
        let local_attention: usize = field_or(json, "local_attention", 128)?;
        Ok(Config {
            dims: Dims { hidden, vocab: field(json, "vocab_size")?, token_types: 0 },
            heads,
            intermediate: field(json, "intermediate_size")?,
            activation: field_or(json, "hidden_activation", Activation::Gelu)?,
            eps: field_or(json, "norm_eps", 1e-5)?,
            norm_bias: field_or(json, "norm_bias", false)?,
            attention_bias: field_or(json, "attention_bias", false)?,
            mlp_bias: field_or(json, "mlp_bias", false)?,
            local,
            half_window: local_attention / 2,
            global_theta: theta(GLOBAL, "global_rope_theta", 160_000.0)?,
            local_theta: theta(LOCAL, "local_rope_theta", 10_000.0)?,
        })
    }
}

struct Layer {
    /// `None` in the first layer, whose input is the embeddings' norm.
    attention_norm: Option<LayerNorm>,
    qkv: Linear,
    o: Linear,
    mlp_norm: LayerNorm,
    wi: Linear,
    wo: Linear,
}

pub(crate) struct ModernBert {
    words: Embedding,
    norm: LayerNorm,
    layers: Vec<Layer>,
    final_norm: LayerNorm,
    global_rotary: Rotary,
    local_rotary: Rotary,
    config: Config,
}

fn layer_norm(size: usize, config: &Config, vb: VarBuilder) -> candle_core::Result<LayerNorm> {
    let settings = LayerNormConfig { eps: config.eps, affine: true, remove_mean: true };
    match config.norm_bias {
        true => candle_nn::layer_norm(size, settings, vb),
        false => candle_nn::layer_norm_no_bias(size, config.eps, vb),
    }
}

/// `ModernBertForSequenceClassification`'s head: the first token or the mean (`classifier_pooling`), then
/// `head.dense` (with a bias where `classifier_bias` says), `classifier_activation`, `head.norm`, and `classifier`.
pub(crate) fn head(root: &VarBuilder, json: &serde_json::Value, hidden: usize) -> candle_core::Result<Head> {
    let config = Config::read(json).map_err(candle_core::Error::Msg)?;
    let read = |key: &str, default: &str| field_or(json, key, default.to_owned()).map_err(candle_core::Error::Msg);
    let mean = match read("classifier_pooling", "cls")?.as_str() {
        "cls" => false,
        "mean" => true,
        other => candle_core::bail!("classifier_pooling: `{other}` is not cls or mean"),
    };
    let activation: Activation =
        field_or(json, "classifier_activation", Activation::Gelu).map_err(candle_core::Error::Msg)?;
    let bias: bool = field_or(json, "classifier_bias", false).map_err(candle_core::Error::Msg)?;
    Ok(Head::Pooled {
        mean,
        dense: linear(hidden, hidden, bias, root.pp("head.dense"))?,
        activation,
        norm: layer_norm(hidden, &config, root.pp("head.norm"))?,
        classifier: last_linear(&root.pp("classifier"), hidden)?,
    })
}

impl ModernBert {
    pub(crate) fn load(root: &VarBuilder, config: Config) -> candle_core::Result<ModernBert> {
        let vb = under(root, "model", "embeddings.tok_embeddings.weight");
        let c = &config;
        let h = c.dims.hidden;
        let layers = (0..c.local.len())
            .map(|i| {
                let l = vb.pp(format!("layers.{i}"));
                Ok(Layer {
                    attention_norm: match i {
                        0 => None,
                        _ => Some(layer_norm(h, c, l.pp("attn_norm"))?),
                    },
                    qkv: linear(h, 3 * h, c.attention_bias, l.pp("attn.Wqkv"))?,
                    o: linear(h, h, c.attention_bias, l.pp("attn.Wo"))?,
                    mlp_norm: layer_norm(h, c, l.pp("mlp_norm"))?,
                    wi: linear(h, 2 * c.intermediate, c.mlp_bias, l.pp("mlp.Wi"))?,
                    wo: linear(c.intermediate, h, c.mlp_bias, l.pp("mlp.Wo"))?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        let head_dim = h / c.heads;
        Ok(ModernBert {
            words: candle_nn::embedding(c.dims.vocab, h, vb.pp("embeddings.tok_embeddings"))?,
            norm: layer_norm(h, c, vb.pp("embeddings.norm"))?,
            layers,
            final_norm: layer_norm(h, c, vb.pp("final_norm"))?,
            global_rotary: Rotary::new(head_dim, c.global_theta, vb.device())?,
            local_rotary: Rotary::new(head_dim, c.local_theta, vb.device())?,
            config,
        })
    }
}

impl Encoder for ModernBert {
    fn dims(&self) -> Dims {
        self.config.dims
    }

    fn encode(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let mut x = self.norm.forward(&self.words.forward(&batch.ids)?)?;
        let dtype = x.dtype();
        let positions = batch.positions(0, 0)?;
        let (global_cos, global_sin) = self.global_rotary.cos_sin(&positions, dtype)?;
        let (local_cos, local_sin) = self.local_rotary.cos_sin(&positions, dtype)?;
        let global_mask = Bias::keys(batch.key_mask(dtype)?);
        let half = c.half_window;
        let local_mask = match c.local.iter().any(|&l| l) {
            true => Some(Bias::per_query(batch.rows, batch.seq, batch.seq, move |start, n| {
                batch.pair_mask(dtype, move |q, k| q.abs_diff(k) <= half, start, n)
            })?),
            false => None,
        };
        let (rows, seq, h) = x.dims3()?;
        let head_dim = h / c.heads;
        let scale = 1.0 / (head_dim as f64).sqrt();
        for (layer, &local) in self.layers.iter().zip(&c.local) {
            let n = match &layer.attention_norm {
                Some(norm) => norm.forward(&x)?,
                None => x.clone(),
            };
            // [rows, seq, 3, heads, dim] → each [rows, heads, seq, dim].
            let qkv = layer.qkv.forward(&n)?.reshape((rows, seq, 3, c.heads, head_dim))?.permute((2, 0, 3, 1, 4))?;
            let (cos, sin, mask) = match (local, &local_mask) {
                (true, Some(mask)) => (&local_cos, &local_sin, mask),
                _ => (&global_cos, &global_sin, &global_mask),
            };
            let q = rotate(&qkv.get(0)?, cos, sin)?;
            let k = rotate(&qkv.get(1)?, cos, sin)?;
            let v = qkv.get(2)?.contiguous()?;
            x = (x + layer.o.forward(&merge_heads(&attention(&q, &k, &v, mask, scale)?)?)?)?;
            let inner = layer.wi.forward(&layer.mlp_norm.forward(&x)?)?;
            let activated = inner.narrow(2, 0, c.intermediate)?;
            let multiplier = inner.narrow(2, c.intermediate, c.intermediate)?;
            x = (x + layer.wo.forward(&gated(&activated, &multiplier, c.activation)?)?)?;
        }
        self.final_norm.forward(&x)
    }
}
