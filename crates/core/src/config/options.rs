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
    /// ONNX Runtime's own arena for CPU memory. Off by default: the arena keeps the largest batch's memory for
    /// the life of the process, where the server's allocator reuses it while batches come and gives it back once
    /// they stop (benches/README.md, "Memory").
    pub cpu_arena: bool,
    /// Constant folding at load. Default: on, except where the graph stores weights narrower than it computes
    /// with them (int8 or fp16 weights a `Cast` widens), which folding would keep widened: 4x the memory of int8.
    /// Such a model on the CPU gets a folded second session while it is busy, dropped when it goes idle; `false`
    /// keeps its weights narrow always, `true` folds at load.
    pub fold_constants: Option<bool>,
    /// The most device memory (bytes) the CUDA execution provider's arena may take for this model's session.
    pub gpu_mem_limit: Option<u64>,
}

impl OnnxOptions {
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.intra_op_threads == Some(0) {
            return Err("onnx.intra_op_threads: must be at least 1".into());
        }
        if self.gpu_mem_limit == Some(0) {
            return Err("onnx.gpu_mem_limit: must be a number of bytes above 0".into());
        }
        Ok(())
    }
}

/// `[memory]`: what a model needs beside its weights, checked at load against the memory left (on its GPU, or
/// the host's).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryOptions {
    /// Bytes its largest batch needs beyond the weights (activations, the engine's workspace), per instance.
    pub working_set: u64,
}

/// `[candle]`: the built-in architecture and its hyper-parameters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandleOptions {
    /// The architecture: `mlp`, or `transformer` (the default of a text model: the architecture its `config.json`
    /// names; `bert` is read as it).
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::ModelConfig;

    fn parse(text: &str) -> Result<ModelConfig, String> {
        ModelConfig::parse("m", Path::new("/models/m"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn memory_options_parse_and_bad_ones_are_named() {
        let base = "backend = \"onnx\"\nfile = \"m.onnx\"\n";
        let c = parse(&format!(
            "{base}[onnx]\ngpu_mem_limit = 1073741824\nfold_constants = false\n[memory]\nworking_set = 5"
        ))
        .expect("valid");
        assert_eq!(
            (c.onnx.gpu_mem_limit, c.onnx.fold_constants, c.onnx.cpu_arena),
            (Some(1 << 30), Some(false), false)
        );
        assert_eq!(c.memory.working_set, 5);
        for (text, expected) in [
            ("[onnx]\ngpu_mem_limit = 0", "onnx.gpu_mem_limit"),
            ("[onnx]\ngpu_mem_limit = -1", "gpu_mem_limit"),
            ("[memory]\nworking = 1", "unknown field `working`"),
            ("[memory]\nworking_set = \"1GiB\"", "working_set"),
        ] {
            let err = parse(&format!("{base}{text}")).expect_err(text);
            assert!(err.contains(expected), "{text:?}: expected {expected:?} in {err:?}");
        }
    }
}
