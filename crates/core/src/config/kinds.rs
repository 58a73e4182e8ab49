//! What a model is and where it runs: its engine (`Backend`), its job (`Task`, and a text model's `Pooling`), its
//! device (`DeviceSpec`) and the precision it computes in (`Precision`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};

use crate::dtype::DataType;
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Onnx,
    Candle,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Onnx => "onnx",
            Backend::Candle => "candle",
        }
    }

    /// The backend as Triton's model configuration names it (`backend`): ONNX Runtime's is `onnxruntime`.
    pub fn triton_name(self) -> &'static str {
        match self {
            Backend::Onnx => "onnxruntime",
            Backend::Candle => "candle",
        }
    }
}

/// Where a model should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The first GPU if one is usable, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// GPU `n`: the model fails to load if it cannot run there.
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| format!("unknown device `{s}` (expected auto, cpu, cuda or cuda:N)")),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl<'de> Deserialize<'de> for DeviceSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The floating-point precision a model computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Fp32,
    Fp16,
    Bf16,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }

    /// The tensor data type of this precision.
    pub fn data_type(self) -> DataType {
        match self {
            Precision::Fp32 => DataType::Fp32,
            Precision::Fp16 => DataType::Fp16,
            Precision::Bf16 => DataType::Bf16,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "fp16" => Ok(Precision::Fp16),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(format!("unknown precision `{s}` (expected fp32, fp16 or bf16)")),
        }
    }
}

/// What a model does with its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// Tensors in, tensors out.
    #[default]
    Tensors,
    /// Texts in, one embedding vector per text out.
    Embed,
    /// A cross-encoder: a query and passages in, one relevance score per passage out.
    Rerank,
    /// A sequence classifier: texts (or pairs of texts) in, a score per label out.
    Classify,
    /// Sparse embeddings (SPLADE): texts in, a weight per vocabulary entry out, most of them zero.
    EmbedSparse,
    /// A token classifier (named entities): texts in, labelled spans of each text out.
    TokenClassify,
}

impl Task {
    /// Every task.
    pub const ALL: [Task; 6] =
        [Task::Tensors, Task::Embed, Task::Rerank, Task::Classify, Task::EmbedSparse, Task::TokenClassify];

    /// The names of the tasks `which` keeps, for a message: "`embed`, `rerank`, …".
    pub fn names(which: fn(Task) -> bool) -> String {
        Task::ALL.into_iter().filter(|t| which(*t)).map(|t| format!("`{}`", t.as_str())).collect::<Vec<_>>().join(", ")
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Task::Tensors => "tensors",
            Task::Embed => "embed",
            Task::Rerank => "rerank",
            Task::Classify => "classify",
            Task::EmbedSparse => "embed_sparse",
            Task::TokenClassify => "token_classify",
        }
    }

    /// Whether the model takes texts, which the server tokenizes.
    pub fn is_text(self) -> bool {
        self != Task::Tensors
    }

    /// Whether the model ends in a classification head whose outputs are labels (`labels` in `model.toml`,
    /// `id2label` in the hub's `config.json`).
    pub fn has_labels(self) -> bool {
        matches!(self, Task::Rerank | Task::Classify | Task::TokenClassify)
    }
}

/// How a text model turns its last hidden state into one vector per text: sentence-transformers' pooling modes.
/// Only real (unpadded) tokens count, wherever the padding lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Pooling {
    /// The mean of the tokens' states.
    #[serde(rename = "mean")]
    Mean,
    /// The first token's state (`[CLS]`).
    #[serde(rename = "cls")]
    Cls,
    /// Each dimension's largest value over the tokens.
    #[serde(rename = "max")]
    Max,
    /// The sum of the tokens' states over the square root of their number.
    #[serde(rename = "mean_sqrt_len", alias = "mean_sqrt_len_tokens")]
    MeanSqrtLen,
    /// The mean weighted by position: the i-th token (from 1) weighs i.
    #[serde(rename = "weighted_mean", alias = "weightedmean")]
    WeightedMean,
    /// The last token's state: a decoder's (its causal attention has read the whole text only there).
    #[serde(rename = "last_token", alias = "lasttoken", alias = "last-token")]
    LastToken,
}

impl Pooling {
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
            Pooling::MeanSqrtLen => "mean_sqrt_len",
            Pooling::WeightedMean => "weighted_mean",
            Pooling::LastToken => "last_token",
        }
    }
}
