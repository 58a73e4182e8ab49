//! Pictures and texts into one space: CLIP (`model_type = "clip"`) and SigLIP (`"siglip"`), each a vision tower and
//! a text tower read from the hub folder's `config.json` (`text_config`, `vision_config`) and `model.safetensors`.
//!
//! Both towers are pre-norm transformers (`layer_norm1`, attention, `layer_norm2`, MLP, each added to its input).
//! - CLIP's vision tower puts a class token before the picture's patches, normalises the embeddings
//!   (`pre_layrnorm`), and pools the class token's state (`post_layernorm`, then `visual_projection`); its text tower
//!   is causal and pools the text's end token (`final_layer_norm`, then `text_projection`). A text's end is its last
//!   real token, as its tokenizer appends the end token: checkpoints with the legacy `eos_token_id` 2 pool at the
//!   highest id, which is that same token.
//! - SigLIP's vision tower has no class token; its states are normalised (`post_layernorm`) and pooled by an
//!   attention head with one learned query (`head.probe`). Its text tower reads every position (no mask: its texts
//!   are padded to `max_position_embeddings` with the pad token, as its processor does) and pools the last position
//!   through `head`. Scores are `sigmoid(exp(logit_scale) × cosine + logit_bias)`, where CLIP's are a softmax over
//!   the labels of `exp(logit_scale) × cosine`.

use candle_core::{DType, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};

use crate::batch::Batch;
use serde_json::json;

use crate::layers::{
    across_cores, attention, field, field_or, hidden_and_heads, merge_heads, quick_gelu, split_heads, stacked,
    with_defaults, Bias,
};

/// Which of the two a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Clip,
    Siglip,
}

/// The activation of a tower's MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// `x · sigmoid(1.702 x)`: CLIP's.
    QuickGelu,
    /// Exact (erf) GELU.
    Gelu,
    /// The tanh approximation (`gelu_pytorch_tanh`, `gelu_new`): SigLIP's.
    GeluTanh,
}

impl Act {
    fn read(json: &serde_json::Value, default: &str) -> Result<Act, String> {
        let name: String = field_or(json, "hidden_act", default.to_owned())?;
        match name.as_str() {
            "quick_gelu" => Ok(Act::QuickGelu),
            "gelu" => Ok(Act::Gelu),
            "gelu_pytorch_tanh" | "gelu_new" => Ok(Act::GeluTanh),
            other => Err(format!("hidden_act: `{other}` is not quick_gelu, gelu or gelu_pytorch_tanh")),
        }
    }

    fn forward(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Act::QuickGelu => quick_gelu(x),
            Act::Gelu => x.gelu_erf(),
            Act::GeluTanh => x.gelu(),
        }
    }
}

/// One tower's sizes, from `text_config` or `vision_config`.
#[derive(Debug, Clone, Copy)]
struct Tower {
    hidden: usize,
    layers: usize,
    heads: usize,
    intermediate: usize,
    act: Act,
    eps: f64,
}

impl Tower {
    fn read(json: &serde_json::Value, family: Family) -> Result<Tower, String> {
        let (hidden, heads) = hidden_and_heads(json, ["hidden_size", "num_attention_heads"], false)?;
        let (act, eps) = match family {
            Family::Clip => ("quick_gelu", 1e-5),
            Family::Siglip => ("gelu_pytorch_tanh", 1e-6),
        };
        Ok(Tower {
            hidden,
            layers: field(json, "num_hidden_layers")?,
            heads,
            intermediate: field(json, "intermediate_size")?,
            act: Act::read(json, act)?,
            eps: field_or(json, "layer_norm_eps", eps)?,
        })
    }
}

/// A CLIP or SigLIP `config.json`, checked.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub family: Family,
    text: Tower,
    vision: Tower,
    pub vocab: usize,
    /// The longest text, in tokens (CLIP: 77; SigLIP pads every text to it).
    pub max_tokens: usize,
    /// The picture's side, in pixels, and its patches'.
    pub image_size: usize,
    patch_size: usize,
    pub channels: usize,
    /// The shared space's width.
    pub dims: usize,
    /// SigLIP's text pad id (its texts are padded to `max_tokens` with it).
    pub pad_id: Option<u32>,
}

impl Config {
    pub(crate) fn read(json: &serde_json::Value) -> Result<Config, String> {
        let model_type: String = field(json, "model_type")?;
        let family = match model_type.as_str() {
            "clip" => Family::Clip,
            "siglip" => Family::Siglip,
            other => return Err(format!("model_type: `{other}` is not clip or siglip")),
        };
        // transformers' defaults (CLIP's base, SigLIP's base) for the keys a saved config leaves out.
        let (text_defaults, vision_defaults) = match family {
            Family::Clip => (
                json!({"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                       "num_attention_heads": 8, "max_position_embeddings": 77}),
                json!({"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "image_size": 224, "patch_size": 32}),
            ),
            Family::Siglip => (
                json!({"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "max_position_embeddings": 64, "pad_token_id": 1}),
                json!({"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "image_size": 224, "patch_size": 16}),
            ),
        };
        let text_json = &with_defaults(json.get("text_config").unwrap_or(&json!({})), text_defaults);
        let vision_json = &with_defaults(json.get("vision_config").unwrap_or(&json!({})), vision_defaults);
        if !field_or(vision_json, "vision_use_head", true).map_err(within("vision_config"))? {
            return Err("vision_config.vision_use_head: false; a picture's embedding is its attention head's".into());
        }
        fn within(part: &'static str) -> impl Fn(String) -> String {
            move |e| format!("{part}.{e}")
        }
        let text = Tower::read(text_json, family).map_err(within("text_config"))?;
        let vision = Tower::read(vision_json, family).map_err(within("vision_config"))?;
        let image_size: usize = field(vision_json, "image_size").map_err(within("vision_config"))?;
        let patch_size: usize = field(vision_json, "patch_size").map_err(within("vision_config"))?;
        if patch_size == 0 || !image_size.is_multiple_of(patch_size) {
            return Err(format!(
                "vision_config.patch_size: patches of {patch_size} pixels do not divide image_size {image_size}"
            ));
        }
        let dims = match family {
            Family::Clip => field_or(json, "projection_dim", 512)?,
            Family::Siglip => field_or(text_json, "projection_size", text.hidden).map_err(within("text_config"))?,
        };
        if family == Family::Siglip && dims != vision.hidden {
            return Err(format!(
                "text_config.projection_size: {dims} is not the vision tower's hidden_size {}; the two would not \
                 share a space",
                vision.hidden
            ));
        }
        let max_tokens = field(text_json, "max_position_embeddings").map_err(within("text_config"))?;
        let pad_id = match family {
            Family::Clip => None,
            Family::Siglip => Some(field(text_json, "pad_token_id").map_err(within("text_config"))?),
        };
        Ok(Config {
            family,
            text,
            vision,
            vocab: field(text_json, "vocab_size").map_err(within("text_config"))?,
            max_tokens,
            image_size,
            patch_size,
            channels: field_or(vision_json, "num_channels", 3).map_err(within("vision_config"))?,
            dims,
            pad_id,
        })
    }
}

/// A pre-norm encoder layer, as both towers of both families have it.
struct Layer {
    norm1: LayerNorm,
    /// `q_proj`, `k_proj` and `v_proj` as one product.
    qkv: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

struct Encoder {
    layers: Vec<Layer>,
    tower: Tower,
}

impl Encoder {
    fn load(vb: VarBuilder, tower: Tower) -> candle_core::Result<Encoder> {
        let (h, eps) = (tower.hidden, tower.eps);
        let layers = (0..tower.layers)
            .map(|i| {
                let l = vb.pp(format!("layers.{i}"));
                let a = l.pp("self_attn");
                Ok(Layer {
                    norm1: candle_nn::layer_norm(h, eps, l.pp("layer_norm1"))?,
                    qkv: stacked(&[
                        candle_nn::linear(h, h, a.pp("q_proj"))?,
                        candle_nn::linear(h, h, a.pp("k_proj"))?,
                        candle_nn::linear(h, h, a.pp("v_proj"))?,
                    ])?,
                    out: candle_nn::linear(h, h, a.pp("out_proj"))?,
                    norm2: candle_nn::layer_norm(h, eps, l.pp("layer_norm2"))?,
                    fc1: candle_nn::linear(h, tower.intermediate, l.pp("mlp.fc1"))?,
                    fc2: candle_nn::linear(tower.intermediate, h, l.pp("mlp.fc2"))?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Encoder { layers, tower })
    }

    /// `x` `[rows, seq, hidden]` through every layer, `bias` added to the attention scores.
    fn forward(&self, x: &Tensor, bias: &Bias<'_>) -> candle_core::Result<Tensor> {
        let heads = self.tower.heads;
        let scale = 1.0 / ((self.tower.hidden / heads) as f64).sqrt();
        let mut x = x.clone();
        for layer in &self.layers {
            let (rows, seq, h) = x.dims3()?;
            let qkv = layer.qkv.forward(&layer.norm1.forward(&x)?)?;
            let qkv = qkv.reshape((rows, seq, 3, heads, h / heads))?.permute((2, 0, 3, 1, 4))?.contiguous()?;
            let (q, k, v) = (qkv.get(0)?, qkv.get(1)?, qkv.get(2)?);
            x = (layer.out.forward(&merge_heads(&attention(&q, &k, &v, bias, scale)?)?)? + x)?;
            let inner = self.tower.act.forward(&layer.fc1.forward(&layer.norm2.forward(&x)?)?)?;
            x = (layer.fc2.forward(&inner)? + x)?;
        }
        Ok(x)
    }
}

/// SigLIP's attention pooling: one learned query (`probe`) attends to every patch, then a residual MLP.
struct PoolingHead {
    probe: Tensor,
    /// `in_proj_weight` and `in_proj_bias` split into the query's, the keys' and the values' projections.
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    tower: Tower,
}

impl PoolingHead {
    fn load(vb: VarBuilder, tower: Tower) -> candle_core::Result<PoolingHead> {
        let h = tower.hidden;
        let a = vb.pp("attention");
        let weight = a.get((3 * h, h), "in_proj_weight")?;
        let bias = a.get(3 * h, "in_proj_bias")?;
        let part = |i: usize| -> candle_core::Result<Linear> {
            Ok(Linear::new(weight.narrow(0, i * h, h)?, Some(bias.narrow(0, i * h, h)?)))
        };
        Ok(PoolingHead {
            probe: vb.get((1, 1, h), "probe")?,
            q: part(0)?,
            k: part(1)?,
            v: part(2)?,
            out: candle_nn::linear(h, h, a.pp("out_proj"))?,
            norm: candle_nn::layer_norm(h, tower.eps, vb.pp("layernorm"))?,
            fc1: candle_nn::linear(h, tower.intermediate, vb.pp("mlp.fc1"))?,
            fc2: candle_nn::linear(tower.intermediate, h, vb.pp("mlp.fc2"))?,
            tower,
        })
    }

    /// `[rows, patches, hidden]` → `[rows, hidden]`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (rows, patches, h) = x.dims3()?;
        let heads = self.tower.heads;
        let probe = self.probe.broadcast_as((rows, 1, h))?.contiguous()?;
        let q = split_heads(&self.q.forward(&probe)?, heads)?;
        let k = split_heads(&self.k.forward(x)?, heads)?;
        let v = split_heads(&self.v.forward(x)?, heads)?;
        let none = Bias::keys(Tensor::zeros((1, 1, 1, patches), x.dtype(), x.device())?);
        let scale = 1.0 / ((h / heads) as f64).sqrt();
        let attended = self.out.forward(&merge_heads(&attention(&q, &k, &v, &none, scale)?)?)?;
        let inner = self.tower.act.forward(&self.fc1.forward(&self.norm.forward(&attended)?)?)?;
        (self.fc2.forward(&inner)? + attended)?.squeeze(1)
    }
}

struct Vision {
    /// The patch embedding (a convolution whose stride is its kernel) as a linear layer on each patch's values
    /// `[channels × patch²]`: one matrix product, in any dtype (candle's CPU convolution has no BF16).
    patches: Linear,
    patch_size: usize,
    /// CLIP's class token `[hidden]`; SigLIP has none.
    class: Option<Tensor>,
    /// `[tokens, hidden]`.
    positions: Tensor,
    /// CLIP's `pre_layrnorm`.
    pre_norm: Option<LayerNorm>,
    encoder: Encoder,
    post_norm: LayerNorm,
    /// SigLIP's pooling head.
    head: Option<PoolingHead>,
    /// CLIP's `visual_projection`.
    projection: Option<Linear>,
}

struct Text {
    words: Embedding,
    positions: Embedding,
    encoder: Encoder,
    norm: LayerNorm,
    /// CLIP's `text_projection` (no bias) or SigLIP's `head`.
    projection: Linear,
}

/// A loaded CLIP or SigLIP model.
pub(crate) struct Clip {
    pub config: Config,
    vision: Vision,
    text: Text,
    /// `exp(logit_scale)`.
    pub scale: f32,
    /// SigLIP's `logit_bias`.
    pub bias: Option<f32>,
}

impl Clip {
    /// Both towers from `root` (a checkpoint's top, where `text_model.` and `vision_model.` lie).
    pub(crate) fn load(root: &VarBuilder, config: Config) -> candle_core::Result<Clip> {
        let (c, siglip) = (&config, config.family == Family::Siglip);
        let (v, t) = (c.vision, c.text);
        let vb = root.pp("vision_model");
        let e = vb.pp("embeddings");
        let (p, pe) = (c.patch_size, e.pp("patch_embedding"));
        let weight = pe.get((v.hidden, c.channels, p, p), "weight")?.reshape((v.hidden, c.channels * p * p))?;
        let patches = Linear::new(weight, if siglip { Some(pe.get(v.hidden, "bias")?) } else { None });
        let grid = c.image_size / c.patch_size;
        let tokens = grid * grid + usize::from(!siglip);
        let vision = Vision {
            patches,
            patch_size: p,
            class: match siglip {
                true => None,
                false => Some(e.get(v.hidden, "class_embedding")?),
            },
            positions: e.pp("position_embedding").get((tokens, v.hidden), "weight")?,
            pre_norm: match siglip {
                true => None,
                false => Some(candle_nn::layer_norm(v.hidden, v.eps, vb.pp("pre_layrnorm"))?),
            },
            encoder: Encoder::load(vb.pp("encoder"), v)?,
            post_norm: candle_nn::layer_norm(v.hidden, v.eps, vb.pp("post_layernorm"))?,
            head: match siglip {
                true => Some(PoolingHead::load(vb.pp("head"), v)?),
                false => None,
            },
            projection: match siglip {
                true => None,
                false => Some(candle_nn::linear_no_bias(v.hidden, c.dims, root.pp("visual_projection"))?),
            },
        };
        let tb = root.pp("text_model");
        let te = tb.pp("embeddings");
        let text = Text {
            words: candle_nn::embedding(c.vocab, t.hidden, te.pp("token_embedding"))?,
            positions: candle_nn::embedding(c.max_tokens, t.hidden, te.pp("position_embedding"))?,
            encoder: Encoder::load(tb.pp("encoder"), t)?,
            norm: candle_nn::layer_norm(t.hidden, t.eps, tb.pp("final_layer_norm"))?,
            projection: match siglip {
                true => candle_nn::linear(t.hidden, c.dims, tb.pp("head"))?,
                false => candle_nn::linear_no_bias(t.hidden, c.dims, root.pp("text_projection"))?,
            },
        };
        // The logit scale and bias are scalars, `[]` or `[1]` as checkpoints store them, read in F32 whatever the
        // model runs in (BF16 would make CLIP's exp(4.6052) = 100 into 98.9).
        let scalar = |name: &str| -> candle_core::Result<f32> {
            let value = root.get_unchecked_dtype(name, DType::F32)?.flatten_all()?;
            value.get(0)?.to_scalar::<f32>()
        };
        Ok(Clip {
            scale: scalar("logit_scale")?.exp(),
            bias: match siglip {
                true => Some(scalar("logit_bias")?),
                false => None,
            },
            vision,
            text,
            config,
        })
    }

    /// Pictures' pixel values `[rows, channels, side, side]` (F32, as the processor normalised them) → their
    /// embeddings `[rows, dims]` (F32, not normalised).
    pub(crate) fn embed_images(&self, pixels: &Tensor, dtype: DType) -> candle_core::Result<Tensor> {
        across_cores(pixels, |part| self.embed_images_together(part, dtype))
    }

    /// [`Clip::embed_images`] of every picture in one pass.
    fn embed_images_together(&self, pixels: &Tensor, dtype: DType) -> candle_core::Result<Tensor> {
        let v = &self.vision;
        let (rows, channels, height, width) = pixels.dims4()?;
        let (side, p) = (self.config.image_size, v.patch_size);
        if (channels, height, width) != (self.config.channels, side, side) {
            candle_core::bail!(
                "pictures of {channels} × {height} × {width}; the model takes {} × {side} × {side}",
                self.config.channels
            );
        }
        let grid = side / p;
        // [rows, channels, grid, p, grid, p] → [rows, grid, grid, channels, p, p]: each patch's values in the
        // convolution weight's order.
        let cut = pixels.reshape((rows, channels, grid, p, grid, p))?.permute((0, 2, 4, 1, 3, 5))?;
        let cut = cut.contiguous()?.reshape((rows, grid * grid, channels * p * p))?.to_dtype(dtype)?;
        let patches = v.patches.forward(&cut)?;
        let x = match &v.class {
            Some(class) => {
                let class = class.reshape((1, 1, ()))?.broadcast_as((rows, 1, class.dim(0)?))?;
                Tensor::cat(&[&class.contiguous()?, &patches.contiguous()?], 1)?
            }
            None => patches.contiguous()?,
        };
        let x = x.broadcast_add(&v.positions)?;
        let x = match &v.pre_norm {
            Some(norm) => norm.forward(&x)?,
            None => x,
        };
        let none = Bias::keys(Tensor::zeros((1, 1, 1, x.dim(1)?), x.dtype(), x.device())?);
        let x = v.encoder.forward(&x, &none)?;
        let pooled = match (&v.head, &v.projection) {
            (Some(head), _) => head.forward(&v.post_norm.forward(&x)?)?,
            (None, Some(projection)) => projection.forward(&v.post_norm.forward(&x.narrow(1, 0, 1)?.squeeze(1)?)?)?,
            (None, None) => candle_core::bail!("a vision tower without a head or a projection"),
        };
        pooled.to_dtype(DType::F32)
    }

    /// Texts' token ids → their embeddings `[rows, dims]` (F32, not normalised). CLIP's rows are padded on either
    /// side (the mask says where). SigLIP's must each be `max_tokens` long, padded with `pad_id` and every position
    /// marked real, as its processor makes them: it pools the last position, and reads the padding.
    pub(crate) fn embed_texts(&self, batch: &Batch) -> candle_core::Result<Tensor> {
        let t = &self.text;
        let x = (t.words.forward(&batch.ids)? + t.positions.forward(&batch.positions(0, 0)?)?)?;
        let dtype = x.dtype();
        let x = match self.config.family {
            Family::Clip => {
                let causal = Bias::per_query(batch.rows, batch.seq, batch.seq, |start, n| {
                    batch.pair_mask(dtype, |q, k| k <= q, start, n)
                })?;
                t.encoder.forward(&x, &causal)?
            }
            Family::Siglip => t.encoder.forward(&x, &Bias::keys(batch.key_mask(dtype)?))?,
        };
        let x = t.norm.forward(&x)?;
        let (rows, seq, width) = x.dims3()?;
        let last = Tensor::from_vec(batch.ends().1, rows, x.device())?;
        let pooled = x.reshape((rows * seq, width))?.index_select(&last, 0)?;
        t.projection.forward(&pooled)?.to_dtype(DType::F32)
    }

    /// Each picture's score for each text `[pictures, texts]` from their embeddings: `exp(logit_scale)` × cosine,
    /// plus SigLIP's bias (logits: CLIP's softmax over the texts, SigLIP's sigmoid, give probabilities).
    #[cfg(test)]
    pub(crate) fn logits(&self, images: &Tensor, texts: &Tensor) -> candle_core::Result<Tensor> {
        let unit = |x: &Tensor| -> candle_core::Result<Tensor> {
            x.broadcast_div(&x.sqr()?.sum_keepdim(candle_core::D::Minus1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?)
        };
        let cosine = unit(images)?.matmul(&unit(texts)?.t()?)?;
        (cosine * f64::from(self.scale))? + f64::from(self.bias.unwrap_or(0.0))
    }
}

#[cfg(test)]
#[path = "clip_tests.rs"]
mod tests;
