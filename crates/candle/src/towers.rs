//! CLIP and SigLIP as engines (`[candle] architecture = "clip"`): one model, two engines on its weights. The engine
//! the loader builds runs pictures (`pixel_values` in, `image_embeds` out); its [`Engine::text_tower`] runs texts
//! (token ids in, the pooled text embedding out, as a text model's [`Contract::Pooled`]), batched apart from the
//! pictures, as the two never share a tower.

use std::sync::Arc;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use inferd_core::text::{contract_output, Contract, Similarity, TextInfo, TextSettings, ATTENTION_MASK, INPUT_IDS};
use inferd_core::{DataType, Error, ModelConfig, ModelMetadata, Pooling, Result, Tensor, TensorSpec};

use crate::batch::Batch;
use crate::clip::{Clip, Config, Family};

/// The name of the pictures' input: `[rows, channels, side, side]`, normalised as the processor does.
pub const PIXEL_VALUES: &str = "pixel_values";
/// The name of the pictures' output, `[rows, dims]`.
pub const IMAGE_EMBEDS: &str = "image_embeds";

/// A loaded CLIP or SigLIP, and what its text tower's engine reports.
pub(crate) struct Towers {
    pub model: Arc<Clip>,
    pub texts: TextInfo,
}

/// Reads the folder's `config.json` and weights: the model, the pictures' inputs and outputs, and its texts'
/// settings, resolved as every text model's are (`model.toml`'s keys, then the folder's files: its tokenizer.json,
/// the text tower's positions), pooled as each tower was trained and, unless `model.toml` says, unit vectors, the
/// space's cosine being what it was trained on.
pub(crate) fn load(
    config: &ModelConfig,
    dtype: DType,
    device: &Device,
) -> Result<(Towers, Vec<TensorSpec>, Vec<TensorSpec>)> {
    let (path, json) = crate::transformer::read_config_json(&config.dir)?;
    let clip_config = Config::read(&json).map_err(|m| Error::config(&path, m))?;
    let max_tokens = clip_config.max_tokens;
    // A saved config leaves out the positions it has by default: the model's own are the limit then.
    let mut with_positions = config.clone();
    with_positions.text.max_seq_len.get_or_insert(max_tokens);
    let settings = TextSettings::resolve(&with_positions, &[Contract::Pooled])?;
    if settings.max_seq_len > max_tokens {
        return Err(Error::config(
            &config.config_file,
            format!("max_seq_len: {} is more than the text tower's {max_tokens} positions", settings.max_seq_len),
        ));
    }
    let weights = |e: candle_core::Error| Error::config(&config.file, format!("cannot load the weights: {e}"));
    // SAFETY: as for every candle model: the map lives while VarBuilder copies each tensor out, and inferd never
    // writes model files.
    #[allow(unsafe_code)]
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&config.file], dtype, device) }.map_err(weights)?;
    let model = Clip::load(&vb, clip_config).map_err(weights)?;
    let c = &model.config;
    let dims = i64::try_from(c.dims).unwrap_or(-1);
    let side = i64::try_from(c.image_size).unwrap_or(-1);
    let channels = i64::try_from(c.channels).unwrap_or(-1);
    let pixels = vec![-1, channels, side, side];
    let inputs =
        vec![TensorSpec { name: PIXEL_VALUES.into(), datatype: DataType::Fp32, shape: pixels, optional: false }];
    let outputs = vec![TensorSpec {
        name: IMAGE_EMBEDS.into(),
        datatype: DataType::Fp32,
        shape: vec![-1, dims],
        optional: false,
    }];
    let mut texts = settings.info(config, vec![Contract::Pooled], c.dims, None)?;
    // Each tower pools as it was trained (CLIP: the end token; SigLIP: the last position).
    texts.pooling = Pooling::LastToken;
    texts.normalize = config.text.normalize.unwrap_or(true);
    texts.vocab_size = Some(c.vocab);
    texts.similarity = Some(Similarity { scale: model.scale, bias: model.bias });
    Ok((Towers { model: Arc::new(model), texts }, inputs, outputs))
}

/// The text tower's metadata: token ids and their mask in, the pooled embedding out.
pub(crate) fn text_metadata(pictures: &ModelMetadata, texts: &TextInfo) -> ModelMetadata {
    let token =
        |name: &str| TensorSpec { name: name.into(), datatype: DataType::Int64, shape: vec![-1, -1], optional: false };
    ModelMetadata {
        inputs: vec![token(INPUT_IDS), token(ATTENTION_MASK)],
        outputs: vec![contract_output(Contract::Pooled, texts.dimensions)],
        text: Some(texts.clone()),
        ..pictures.clone()
    }
}

/// Pictures' pixel values (FP32, FP16 or BF16) → their embeddings, FP32 `[rows, dims]`.
pub(crate) fn embed_pictures(model: &Clip, pixels: &Tensor, dtype: DType, device: &Device) -> Result<Tensor> {
    let x = crate::to_candle(pixels, device)?;
    let y = model.embed_images(&x, dtype).map_err(Error::engine)?;
    crate::from_candle(&y, DataType::Fp32)
}

/// Texts' token ids and mask (`[rows, seq]`, as the batcher padded them) → their embeddings, FP32 `[rows, dims]`.
/// SigLIP reads a text as its processor makes it, `max_tokens` long with the pad id after its tokens: each row is
/// laid out so, whatever the batch's padding.
pub(crate) fn embed_texts(model: &Clip, inputs: &[Tensor], device: &Device) -> Result<Tensor> {
    let [ids, mask] = inputs else {
        return Err(Error::InvalidInput(format!("CLIP's text tower takes {INPUT_IDS} and {ATTENTION_MASK}")));
    };
    let [rows, seq] = ids.shape()[..] else {
        return Err(Error::InvalidInput(format!("{INPUT_IDS} must be [rows, tokens]")));
    };
    let c = &model.config;
    let ids = crate::token_ids(ids, c.vocab as i64, INPUT_IDS)?;
    let mask = mask.to_vec::<i64>()?;
    if mask.len() != ids.len() {
        return Err(Error::InvalidInput(format!("{ATTENTION_MASK} must have the shape of {INPUT_IDS}")));
    }
    let batch = match (c.family, c.pad_id) {
        (Family::Siglip, Some(pad)) => {
            let width = c.max_tokens;
            if seq > width {
                return Err(Error::InvalidInput(format!("texts of {seq} tokens; SigLIP's take at most {width}")));
            }
            let mut laid = vec![pad; rows * width];
            for (r, row) in laid.chunks_exact_mut(width).enumerate() {
                let real = (0..seq).filter(|&t| mask[r * seq + t] != 0).map(|t| ids[r * seq + t]);
                for (slot, id) in row.iter_mut().zip(real) {
                    *slot = id;
                }
            }
            Batch::new(laid, vec![0; rows * width], &vec![1; rows * width], rows, width, device)
        }
        _ => Batch::new(ids, vec![0; rows * seq], &mask, rows, seq, device),
    }
    .map_err(Error::engine)?;
    let y = model.embed_texts(&batch).map_err(Error::engine)?;
    crate::from_candle(&y, DataType::Fp32)
}
