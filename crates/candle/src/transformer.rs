//! Text models on candle, whatever their architecture: the folder's `config.json` names it (`model_type`, and
//! `architectures`), and a [`TextModel`] computes the contracts its task asked for from a [`Batch`].
//!
//! BERT's family (`bert.rs`) has heads of its own; the other encoders and decoders give their last hidden state
//! ([`Encoder`]), from which [`Transformer`] makes pooled vectors and per-token states.

use std::path::Path;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Activation, LayerNorm, Linear, VarBuilder};
use inferd_core::text::Contract;
use inferd_core::{Error, Pooling, Result};

use crate::batch::Batch;
use crate::bert::Bert;
use crate::{gte, modernbert, mpnet, nomic, qwen3};

/// A model's sizes, as the engine checks its inputs and describes its outputs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    /// A token's state's length.
    pub hidden: usize,
    /// Token ids are below this.
    pub vocab: usize,
    /// Segment ids are below this; 0 or 1 where the model reads none (a tokenizer's are then ignored).
    pub token_types: usize,
}

/// What the engine runs: a text model computing contracts.
pub(crate) trait TextModel: Send {
    /// What it computes, in the order it was asked.
    fn contracts(&self) -> &[Contract];
    /// The labels of its classification head, if it has one.
    fn head_labels(&self) -> Option<usize>;
    fn dims(&self) -> Dims;
    /// `contract`'s F32 output for `batch`.
    fn run(&self, contract: Contract, batch: &Batch) -> candle_core::Result<Tensor>;
}

/// An architecture's body: token ids to the last hidden state.
pub(crate) trait Encoder: Send {
    fn dims(&self) -> Dims;
    /// The last hidden state `[rows, seq, hidden]` in the model's dtype. A real token's state does not depend on
    /// the padding around it.
    fn encode(&self, batch: &Batch) -> candle_core::Result<Tensor>;
}

/// An [`Encoder`] serving pooled vectors and per-token states, and a sequence classification head's scores where
/// it has one.
struct Transformer {
    encoder: Box<dyn Encoder>,
    pooling: Pooling,
    contracts: Vec<Contract>,
    head: Option<Head>,
}

/// A `*ForSequenceClassification` model's head, on the last hidden state.
pub(crate) enum Head {
    /// ModernBERT's: the first token's state or the mean of the real tokens' (`classifier_pooling`), then dense,
    /// the activation, a LayerNorm, and the classifier.
    Pooled { mean: bool, dense: Linear, activation: Activation, norm: LayerNorm, classifier: Linear },
    /// RoBERTa's and MPNet's: the first token's state, dense, tanh, and the output projection.
    FirstToken { dense: Linear, out_proj: Linear },
}

impl Head {
    fn labels(&self) -> Option<usize> {
        match self {
            Head::Pooled { classifier: last, .. } | Head::FirstToken { out_proj: last, .. } => {
                last.weight().dim(0).ok()
            }
        }
    }

    /// The logits `[rows, labels]` (F32) of `hidden`.
    fn scores(&self, hidden: &Tensor, batch: &Batch) -> candle_core::Result<Tensor> {
        let first = |hidden: &Tensor| crate::pool::pooled(hidden, batch, Pooling::Cls)?.to_dtype(hidden.dtype());
        match self {
            Head::Pooled { mean, dense, activation, norm, classifier } => {
                let pooled = match mean {
                    true => crate::pool::pooled(hidden, batch, Pooling::Mean)?.to_dtype(hidden.dtype())?,
                    false => first(hidden)?,
                };
                classifier.forward(&norm.forward(&activation.forward(&dense.forward(&pooled)?)?)?)?.to_dtype(DType::F32)
            }
            Head::FirstToken { dense, out_proj } => {
                out_proj.forward(&dense.forward(&first(hidden)?)?.tanh()?)?.to_dtype(DType::F32)
            }
        }
    }
}

/// A head's last linear layer from `hidden` inputs to as many labels as its weights hold, with its bias.
pub(crate) fn last_linear(vb: &VarBuilder, hidden: usize) -> candle_core::Result<Linear> {
    let weight = vb.get_unchecked("weight")?;
    let (labels, inputs) = weight.dims2()?;
    if inputs != hidden || labels == 0 {
        candle_core::bail!("{}.weight is [{labels}, {inputs}], not [labels, {hidden}]", vb.prefix());
    }
    Ok(Linear::new(weight, Some(vb.get(labels, "bias")?)))
}

impl TextModel for Transformer {
    fn contracts(&self) -> &[Contract] {
        &self.contracts
    }

    fn head_labels(&self) -> Option<usize> {
        self.head.as_ref().and_then(Head::labels)
    }

    fn dims(&self) -> Dims {
        self.encoder.dims()
    }

    fn run(&self, contract: Contract, batch: &Batch) -> candle_core::Result<Tensor> {
        let hidden = self.encoder.encode(batch)?;
        match contract {
            Contract::Pooled => crate::pool::pooled(&hidden, batch, self.pooling),
            Contract::TokenStates => hidden.to_dtype(DType::F32),
            Contract::SequenceScores => match &self.head {
                Some(head) => head.scores(&hidden, batch),
                None => candle_core::bail!("this model has no head for {}", contract.as_str()),
            },
            other => candle_core::bail!("this model has no head for {}", other.as_str()),
        }
    }
}

/// The architectures a folder's `config.json` may name, by `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bert,
    MPNet,
    ModernBert,
    NomicBert,
    Gte,
    Qwen3,
}

/// What `model_type` each architecture has, and how the error lists them.
const KINDS: [(&str, Kind); 10] = [
    ("bert", Kind::Bert),
    ("roberta", Kind::Bert),
    ("xlm-roberta", Kind::Bert),
    ("camembert", Kind::Bert),
    ("distilbert", Kind::Bert),
    ("mpnet", Kind::MPNet),
    ("modernbert", Kind::ModernBert),
    ("nomic_bert", Kind::NomicBert),
    ("new", Kind::Gte),
    ("qwen3", Kind::Qwen3),
];

/// The supported architectures, in words.
const SUPPORTED: &str = "BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT (model_type bert, roberta, xlm-roberta, \
                         camembert, distilbert), MPNet (mpnet), ModernBERT (modernbert), NomicBERT (nomic_bert), \
                         GTE's \"new\" architecture (new) and Qwen3 (qwen3)";

/// A text model's settings from the folder: its `config.json` read and checked before any weight is.
pub(crate) struct Plan {
    config: Parsed,
    json: serde_json::Value,
    path: std::path::PathBuf,
}

/// A `config.json` read into its architecture's own terms.
enum Parsed {
    Bert(crate::bert::Config),
    MPNet(mpnet::Config),
    ModernBert(modernbert::Config),
    NomicBert(nomic::Config),
    Gte(gte::Config),
    Qwen3(qwen3::Config),
}

/// `dir/config.json`, the hub's model configuration, as JSON, and its path for errors.
pub(crate) fn read_config_json(dir: &Path) -> Result<(std::path::PathBuf, serde_json::Value)> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::config(&path, format!("a text model needs the hub's config.json: {e}")))?;
    let json = serde_json::from_str(&text).map_err(|e| Error::config(&path, format!("not JSON: {e}")))?;
    Ok((path, json))
}

impl Plan {
    /// Reads `dir/config.json`; an architecture inferd does not have, or a contradictory configuration, is an
    /// error naming the field.
    pub(crate) fn read(dir: &Path) -> Result<Plan> {
        let (path, json) = read_config_json(dir)?;
        let model_type = json.get("model_type").and_then(|t| t.as_str()).unwrap_or("");
        let Some(&(_, kind)) = KINDS.iter().find(|(name, _)| *name == model_type) else {
            let architectures = json.get("architectures").map(|a| a.to_string()).unwrap_or_else(|| "none".into());
            return Err(Error::config(
                &path,
                format!(
                    "architectures {architectures} (model_type \"{model_type}\") is not an architecture inferd runs \
                     on candle; it runs {SUPPORTED}. Serve an ONNX export of it instead"
                ),
            ));
        };
        // Every check of the configuration happens here, before a weight is read.
        let bad = |message: String| Error::config(&path, message);
        let config = match kind {
            Kind::Bert => Parsed::Bert(crate::bert::Config::read(&json).map_err(bad)?),
            Kind::MPNet => Parsed::MPNet(mpnet::Config::read(&json).map_err(bad)?),
            Kind::ModernBert => Parsed::ModernBert(modernbert::Config::read(&json).map_err(bad)?),
            Kind::NomicBert => Parsed::NomicBert(nomic::Config::read(&json).map_err(bad)?),
            Kind::Gte => Parsed::Gte(gte::Config::read(&json).map_err(bad)?),
            Kind::Qwen3 => Parsed::Qwen3(qwen3::Config::read(&json).map_err(bad)?),
        };
        Ok(Plan { config, json, path })
    }

    /// Loads the weights of `file` in `dtype` onto `device`, computing `wants`.
    pub(crate) fn load(
        self,
        file: &Path,
        wants: &[Contract],
        pooling: Pooling,
        dtype: DType,
        device: &Device,
    ) -> Result<Box<dyn TextModel>> {
        let config = match self.config {
            Parsed::Bert(config) => return Ok(Box::new(Bert::load(file, config, wants, pooling, dtype, device)?)),
            other => other,
        };
        let headed = matches!(config, Parsed::MPNet(_) | Parsed::ModernBert(_));
        let modern = matches!(config, Parsed::ModernBert(_));
        let serves = |c: &Contract| match c {
            Contract::Pooled | Contract::TokenStates => true,
            Contract::SequenceScores => headed,
            _ => false,
        };
        if !serves(&wants[0]) {
            return Err(Error::config(
                &self.path,
                format!(
                    "model_type \"{}\": inferd has no {} head for it on candle",
                    self.json.get("model_type").and_then(|t| t.as_str()).unwrap_or(""),
                    wants[0].as_str()
                ),
            ));
        }
        let weights = |e: candle_core::Error| Error::config(file, format!("cannot load the model's weights: {e}"));
        // SAFETY: the map lives only while VarBuilder copies each tensor onto the device, and inferd never writes
        // model files.
        #[allow(unsafe_code)]
        let root = unsafe { VarBuilder::from_mmaped_safetensors(&[file], dtype, device) }.map_err(weights)?;
        let encoder: Box<dyn Encoder> = match config {
            Parsed::MPNet(c) => Box::new(mpnet::MPNet::load(&root, c).map_err(weights)?),
            Parsed::ModernBert(c) => Box::new(modernbert::ModernBert::load(&root, c).map_err(weights)?),
            Parsed::NomicBert(c) => Box::new(nomic::NomicBert::load(&root, c).map_err(weights)?),
            Parsed::Gte(c) => Box::new(gte::Gte::load(&root, c).map_err(weights)?),
            Parsed::Qwen3(c) => Box::new(qwen3::Qwen3::load(&root, c).map_err(weights)?),
            Parsed::Bert(_) => return Err(Error::Unsupported("BERT's family loads above".into())),
        };
        let contracts: Vec<Contract> = wants.iter().copied().filter(serves).collect();
        let head = match contracts.contains(&Contract::SequenceScores) {
            false => None,
            true => {
                let hidden = encoder.dims().hidden;
                Some(match modern {
                    true => modernbert::head(&root, &self.json, hidden).map_err(weights)?,
                    false => mpnet::head(&root, hidden).map_err(weights)?,
                })
            }
        };
        Ok(Box::new(Transformer { encoder, pooling, contracts, head }))
    }
}

#[cfg(test)]
mod tests {
    use super::Plan;

    /// `Plan::read`'s error for `config.json` holding `json`.
    fn refusal(json: &str) -> String {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.json"), json).expect("write");
        match Plan::read(dir.path()) {
            Ok(_) => panic!("{json} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn an_architecture_inferd_lacks_is_named_with_the_ones_it_has() {
        let err = refusal(r#"{"architectures": ["T5EncoderModel"], "model_type": "t5"}"#);
        assert!(err.contains("[\"T5EncoderModel\"]") && err.contains("\"t5\""), "{err}");
        assert!(err.contains("MPNet (mpnet)") && err.contains("Qwen3 (qwen3)"), "{err}");
    }

    #[test]
    fn contradictory_configurations_name_their_field() {
        let qwen3 = r#"{"model_type": "qwen3", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 64, "vocab_size": 10, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#;
        assert!(refusal(qwen3).contains("rope_scaling: rope type `yarn`"), "{}", refusal(qwen3));
        let mpnet = r#"{"model_type": "mpnet", "hidden_size": 30, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 64, "vocab_size": 10, "max_position_embeddings": 20}"#;
        assert!(
            refusal(mpnet).contains("num_attention_heads: 4 heads do not divide hidden_size 30"),
            "{}",
            refusal(mpnet)
        );
        let modernbert = r#"{"model_type": "modernbert", "hidden_size": 32, "num_attention_heads": 4,
            "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 10, "layer_types": ["full_attention"]}"#;
        assert!(refusal(modernbert).contains("layer_types: 1 entries for 2 layers"), "{}", refusal(modernbert));
        let gte = r#"{"model_type": "new", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 64, "vocab_size": 10, "rope_scaling": {"type": "linear", "factor": 2.0}}"#;
        assert!(refusal(gte).contains("rope_scaling: rope type `linear`"), "{}", refusal(gte));
        let nomic = r#"{"model_type": "nomic_bert", "n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 10,
            "rotary_emb_fraction": 0.5}"#;
        assert!(refusal(nomic).contains("rotary_emb_fraction: 0.5"), "{}", refusal(nomic));
        let norm_mlp = r#"{"model_type": "nomic_bert", "n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 10,
            "rotary_emb_fraction": 1.0, "norm_mlp": true}"#;
        assert!(refusal(norm_mlp).contains("norm_mlp: a LayerNorm after the gated MLP"), "{}", refusal(norm_mlp));
        let buckets = r#"{"model_type": "mpnet", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 64, "vocab_size": 10, "max_position_embeddings": 20,
            "relative_attention_num_buckets": 16}"#;
        assert!(refusal(buckets).contains("relative_attention_num_buckets: 16"), "{}", refusal(buckets));
        let missing = r#"{"model_type": "qwen3", "hidden_size": 32}"#;
        assert!(refusal(missing).contains("num_attention_heads: missing"), "{}", refusal(missing));
    }
}
