//! `architecture = "bert"`: a BERT encoder from a folder in the Hugging Face hub's layout (`config.json`,
//! `model.safetensors`), pooled on the device into one vector per sequence.
//!
//! The encoder layers are candle-transformers'. The embeddings and the attention mask are built here: its
//! `BertModel` casts `f32::MIN` into the model's dtype for the mask, which is −∞ in FP16 and BF16, and
//! `0 × −∞` turns every unmasked score into NaN. Here the additive mask is made in F32 from the dtype's own
//! lowest finite value and cast after, so FP16 and BF16 compute as FP32 does.

use std::path::Path;

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Embedding, LayerNorm, VarBuilder};
use candle_transformers::models::bert::{BertEncoder, Config};
use inferd_core::{Error, Pooling, Result};

/// A loaded BERT encoder and how it pools.
pub(crate) struct Bert {
    words: Embedding,
    positions: Embedding,
    token_types: Embedding,
    norm: LayerNorm,
    encoder: BertEncoder,
    pooling: Pooling,
    /// The dtype's lowest finite value: what a padded position adds to its attention scores.
    mask_value: f64,
    pub(crate) config: Config,
}

/// Reads a folder's `config.json`.
pub(crate) fn read_config(dir: &Path) -> Result<Config> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::config(&path, format!("a bert model needs the hub's config.json: {e}")))?;
    serde_json::from_str(&text).map_err(|e| Error::config(&path, format!("not a BERT configuration: {e}")))
}

impl Bert {
    /// Loads the weights of `file` (with or without the `bert.` prefix) in `dtype` onto `device`.
    pub(crate) fn load(file: &Path, config: Config, pooling: Pooling, dtype: DType, device: &Device) -> Result<Bert> {
        let weights = |e: candle_core::Error| Error::config(file, format!("cannot load the BERT weights: {e}"));
        // SAFETY: as for the mlp: the map lives only while VarBuilder copies each tensor onto the device, and
        // inferd never writes model files.
        #[allow(unsafe_code)]
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[file], dtype, device) }.map_err(weights)?;
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") { vb.pp("bert") } else { vb };
        let e = vb.pp("embeddings");
        let (hidden, c) = (config.hidden_size, &config);
        let bert = Bert {
            words: candle_nn::embedding(c.vocab_size, hidden, e.pp("word_embeddings")).map_err(weights)?,
            positions: candle_nn::embedding(c.max_position_embeddings, hidden, e.pp("position_embeddings"))
                .map_err(weights)?,
            token_types: candle_nn::embedding(c.type_vocab_size, hidden, e.pp("token_type_embeddings"))
                .map_err(weights)?,
            norm: candle_nn::layer_norm(hidden, c.layer_norm_eps, e.pp("LayerNorm")).map_err(weights)?,
            encoder: BertEncoder::load(vb.pp("encoder"), c).map_err(weights)?,
            pooling,
            mask_value: lowest(dtype),
            config,
        };
        Ok(bert)
    }

    /// Embeds `[rows, seq]` token ids (I64) with their attention mask and segment ids into pooled F32
    /// `[rows, hidden]`.
    pub(crate) fn forward(&self, ids: &Tensor, mask: &Tensor, types: &Tensor) -> candle_core::Result<Tensor> {
        let (_, seq) = ids.dims2()?;
        let positions = Tensor::arange(0u32, seq as u32, ids.device())?;
        let embedded = (self.words.forward(ids)? + self.token_types.forward(types)?)?
            .broadcast_add(&self.positions.forward(&positions)?)?;
        let embedded = self.norm.forward(&embedded)?;
        let dtype = embedded.dtype();
        // (1 − mask) × lowest, made in F32 where it is exact, then cast: 0 for a real token, the lowest finite
        // value of the dtype for padding. Shape [rows, 1, 1, seq] to broadcast over heads and query positions.
        let mask = mask.to_dtype(DType::F32)?;
        let additive = mask.affine(-self.mask_value, self.mask_value)?.unsqueeze(1)?.unsqueeze(1)?.to_dtype(dtype)?;
        let hidden = self.encoder.forward(&embedded, &additive)?.to_dtype(DType::F32)?;
        match self.pooling {
            Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1),
            Pooling::Mean => {
                let weights = mask.unsqueeze(D::Minus1)?;
                let sums = hidden.broadcast_mul(&weights)?.sum(1)?;
                let counts = mask.sum_keepdim(1)?.clamp(1f32, f32::MAX)?;
                sums.broadcast_div(&counts)
            }
        }
    }
}

/// The lowest finite value of a float dtype.
fn lowest(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f64::from(half::f16::MIN),
        DType::BF16 => f64::from(half::bf16::MIN),
        _ => f64::from(f32::MIN),
    }
}
