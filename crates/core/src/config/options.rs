//! Per-backend options (`[onnx]`, `[candle]`) and a text model's top-level settings, with the weights a candle
//! text model reads by default.

use std::path::PathBuf;

use serde::Deserialize;

use super::Pooling;

/// `[onnx]`: ONNX Runtime options.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OnnxOptions {
    /// Threads inside one operator; default: the cores present shared among the instances.
    pub intra_op_threads: Option<usize>,
    /// Try the TensorRT execution provider before CUDA.
    pub tensorrt: bool,
    /// Let TensorRT build FP16 engines (also implied by `precision = "fp16"` with `tensorrt = true`).
    pub tensorrt_fp16: bool,
}

/// `[candle]`: the built-in architecture and its hyper-parameters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandleOptions {
    /// The architecture: `mlp`, or `bert` (the default of a text model, configured by its `config.json`).
    pub architecture: String,
    /// `mlp`: the width of each layer, input first (`[64, 128, 10]`).
    #[serde(default)]
    pub layers: Vec<usize>,
    /// `mlp`: one activation after each linear layer (`relu`, `gelu`, `tanh`, `sigmoid` or `none`).
    #[serde(default)]
    pub activations: Vec<String>,
}

/// A text model's settings as `model.toml` gives them (top-level keys); unset ones come from the folder's files.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextOverrides {
    /// `tokenizer.json`, resolved against the model's folder.
    pub tokenizer: Option<PathBuf>,
    pub pooling: Option<Pooling>,
    pub normalize: Option<bool>,
    pub max_seq_len: Option<usize>,
    /// A scoring model's label names, in the order of its head's outputs.
    pub labels: Option<Vec<String>>,
}

/// The weights a candle text model reads when `file` is not given: the hub's name.
pub const DEFAULT_TEXT_WEIGHTS: &str = "model.safetensors";
