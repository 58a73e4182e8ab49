//! Text models on candle, whatever their architecture: the folder's `config.json` names it (`model_type`, and
//! `architectures`), and a [`TextModel`] computes the contracts its task asked for from a [`Batch`].
//!
//! BERT's family (`bert.rs`) has heads of its own; the other encoders and decoders give their last hidden state
//! ([`Encoder`]), from which [`Transformer`] makes pooled vectors and per-token states.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
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

/// An [`Encoder`] serving pooled vectors and per-token states.
struct Transformer {
    encoder: Box<dyn Encoder>,
    pooling: Pooling,
    contracts: Vec<Contract>,
}

impl TextModel for Transformer {
    fn contracts(&self) -> &[Contract] {
        &self.contracts
    }

    fn head_labels(&self) -> Option<usize> {
        None
    }

    fn dims(&self) -> Dims {
        self.encoder.dims()
    }

    fn run(&self, contract: Contract, batch: &Batch) -> candle_core::Result<Tensor> {
        let hidden = self.encoder.encode(batch)?;
        match contract {
            Contract::Pooled => crate::pool::pooled(&hidden, batch, self.pooling),
            Contract::TokenStates => hidden.to_dtype(DType::F32),
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
    kind: Kind,
    json: serde_json::Value,
    path: std::path::PathBuf,
}

impl Plan {
    /// Reads `dir/config.json`; an architecture inferd does not have, or a contradictory configuration, is an
    /// error naming the field.
    pub(crate) fn read(dir: &Path) -> Result<Plan> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::config(&path, format!("a text model needs the hub's config.json: {e}")))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::config(&path, format!("not JSON: {e}")))?;
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
        match kind {
            Kind::Bert => drop(crate::bert::read_config(dir)?),
            Kind::MPNet => drop(mpnet::Config::read(&json).map_err(bad)?),
            Kind::ModernBert => drop(modernbert::Config::read(&json).map_err(bad)?),
            Kind::NomicBert => drop(nomic::Config::read(&json).map_err(bad)?),
            Kind::Gte => drop(gte::Config::read(&json).map_err(bad)?),
            Kind::Qwen3 => drop(qwen3::Config::read(&json).map_err(bad)?),
        }
        Ok(Plan { kind, json, path })
    }

    /// Loads the weights of `file` in `dtype` onto `device`, computing `wants`.
    pub(crate) fn load(
        self,
        dir: &Path,
        file: &Path,
        wants: &[Contract],
        pooling: Pooling,
        dtype: DType,
        device: &Device,
    ) -> Result<Box<dyn TextModel>> {
        if let Some(&head) = wants.iter().find(|c| !matches!(c, Contract::Pooled | Contract::TokenStates)) {
            if self.kind != Kind::Bert && wants[0] == head {
                return Err(Error::config(
                    &self.path,
                    format!("model_type \"{}\": inferd has no {} head for it on candle", self.model_type(), head.as_str()),
                ));
            }
        }
        let weights = |e: candle_core::Error| Error::config(file, format!("cannot load the model's weights: {e}"));
        let root = || {
            // SAFETY: the map lives only while VarBuilder copies each tensor onto the device, and inferd never
            // writes model files.
            #[allow(unsafe_code)]
            let root = unsafe { VarBuilder::from_mmaped_safetensors(&[file], dtype, device) };
            root.map_err(weights)
        };
        let bad = |message: String| Error::config(&self.path, message);
        let json = &self.json;
        let encoder: Box<dyn Encoder> = match self.kind {
            Kind::Bert => {
                let config = crate::bert::read_config(dir)?;
                return Ok(Box::new(Bert::load(file, config, wants, pooling, dtype, device)?));
            }
            Kind::MPNet => Box::new(mpnet::MPNet::load(&root()?, mpnet::Config::read(json).map_err(bad)?).map_err(weights)?),
            Kind::ModernBert => Box::new(
                modernbert::ModernBert::load(&root()?, modernbert::Config::read(json).map_err(bad)?).map_err(weights)?,
            ),
            Kind::NomicBert => {
                Box::new(nomic::NomicBert::load(&root()?, nomic::Config::read(json).map_err(bad)?).map_err(weights)?)
            }
            Kind::Gte => Box::new(gte::Gte::load(&root()?, gte::Config::read(json).map_err(bad)?).map_err(weights)?),
            Kind::Qwen3 => {
                Box::new(qwen3::Qwen3::load(&root()?, qwen3::Config::read(json).map_err(bad)?).map_err(weights)?)
            }
        };
        let contracts = wants.iter().copied().filter(|c| matches!(c, Contract::Pooled | Contract::TokenStates)).collect();
        Ok(Box::new(Transformer { encoder, pooling, contracts }))
    }

    fn model_type(&self) -> &str {
        self.json.get("model_type").and_then(|t| t.as_str()).unwrap_or("")
    }
}
