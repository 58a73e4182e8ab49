//! The synchronous `Engine` trait every backend implements, and what an engine says about its model.

use crate::config::{DeviceSpec, Precision, TensorSpec};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::text::{Contract, TextInfo};

/// What a loaded model takes and gives, and where it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMetadata {
    /// Inputs in the order [`Engine::run`] takes them.
    pub inputs: Vec<TensorSpec>,
    /// Outputs in the order [`Engine::run`] returns them.
    pub outputs: Vec<TensorSpec>,
    /// Where it runs: `cpu` or `cuda:N`.
    pub device: String,
    pub precision: Precision,
    /// The engine, in Triton's words: `onnxruntime_onnx` or `candle`.
    pub platform: &'static str,
    /// A text model: its inputs are token sequences (`INT64 [rows, seq]`, see [`crate::text`]) whose `seq` may
    /// differ between requests; a batch pads them with zeros to its longest, the attention mask marking the
    /// padding. Its one output is its first contract's ([`TextInfo::contracts`]).
    pub text: Option<TextInfo>,
}

impl ModelMetadata {
    /// Inputs of `rows` rows with every variable non-batch dimension set to 1: what warm-up runs. A text model
    /// is warmed with sequences of its longest length, all tokens real, so warm-up sees its largest shapes.
    pub fn warm_up_inputs(&self, rows: usize) -> Result<Vec<Tensor>> {
        self.inputs
            .iter()
            .map(|spec| {
                let variable = self.text.as_ref().map_or(1, |t| t.max_seq_len);
                let shape: Vec<usize> = std::iter::once(rows)
                    .chain(spec.row_dims().iter().map(|&d| usize::try_from(d).unwrap_or(variable)))
                    .collect();
                if self.text.is_some() && spec.name == crate::text::ATTENTION_MASK {
                    let ones = vec![1i64; crate::tensor::element_count(&shape)?];
                    return Tensor::from_slice(shape, &ones);
                }
                Tensor::zeros(spec.datatype, shape)
            })
            .collect()
    }

    /// Whether every input's first dimension is variable: a batch dimension along which requests may be joined.
    /// A graph exported with a fixed first dimension (a batch of 1, say) has none.
    pub fn has_batch_dim(&self) -> bool {
        !self.inputs.is_empty() && self.inputs.iter().all(|s| s.shape.first() == Some(&-1))
    }

    pub fn on_gpu(&self) -> bool {
        self.device.starts_with("cuda")
    }

    /// The index of the GPU it runs on (`cuda:N`), read as `model.toml`'s `device` is; none on the CPU.
    pub fn gpu(&self) -> Option<usize> {
        match self.device.parse() {
            Ok(DeviceSpec::Cuda(n)) => Some(n),
            _ => None,
        }
    }
}

/// A loaded model that runs batches. Engines are synchronous: each one is owned by one worker thread, which
/// is why `run` may take `&mut self` and need not be `Sync`.
pub trait Engine: Send {
    fn metadata(&self) -> &ModelMetadata;

    /// Bytes of weights this engine keeps resident (host memory on the CPU, device memory on a GPU), by its own
    /// account of what it loaded; `None` where it cannot tell.
    fn weight_bytes(&self) -> Option<u64> {
        None
    }

    /// Gives the device back what its allocator keeps cached from finished batches (after a warm-up, the largest
    /// batch's working memory; on a GPU, the cache every model there shares), so that what a loaded model holds is
    /// its weights and what its runtime needs, not its last peak. The loader calls it after each warm-up; a no-op
    /// where nothing is cached.
    fn release_cached_memory(&mut self) {}

    /// Runs one batch. `inputs` follow `metadata().inputs` in order, share their row count along dim 0, and fit
    /// their specs; the result follows `metadata().outputs`, each with the same row count.
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>>;

    /// A model of two towers (CLIP's and SigLIP's, pictures and texts into one space): the engine that runs its texts,
    /// on this one's weights, which the loader batches apart from this one's pictures. `None` for a model of one.
    fn text_tower(&self) -> Option<Box<dyn Engine>> {
        None
    }

    /// Runs one batch of a text model for `contract`'s output (see [`Contract`]), one of those its
    /// [`TextInfo::contracts`] lists; [`Engine::run`] gives the first.
    fn run_text(&mut self, contract: Contract, inputs: &[Tensor]) -> Result<Tensor> {
        let _ = inputs;
        Err(crate::Error::Unsupported(format!("this model gives no {}", contract.as_str())))
    }
}
