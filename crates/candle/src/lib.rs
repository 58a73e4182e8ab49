//! inferd-candle: the [`Engine`] on candle. Weights come from safetensors files; architectures are built in (`mlp`
//! for tensors, and for text models the transformer the folder's `config.json` names: BERT's family with the heads
//! its contracts need, MPNet, ModernBERT, NomicBERT, GTE's "new" architecture and Qwen3; CLIP and SigLIP, pictures
//! and texts into one space, as two engines on one model's weights). Runs on the CPU, or on `cuda:N` in builds with
//! the `cuda` feature.

mod batch;
mod bert;
mod clip;
mod gte;
pub mod ipc;
mod layers;
mod memory;
mod modernbert;
mod mpnet;
mod nomic;
mod pool;
mod qwen3;
mod threads;
mod towers;
mod transformer;

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Module};
use candle_nn::{Linear, VarBuilder};
use inferd_core::text::{contract_output, Contract, TextSettings, ATTENTION_MASK, INPUT_IDS, TOKEN_TYPE_IDS};
use inferd_core::{
    CandleOptions, DataType, DeviceSpec, Engine, Error, ModelConfig, ModelMetadata, Precision, Result, Tensor,
    TensorSpec,
};

pub use crate::threads::fix_cpu_threads;

use crate::batch::Batch;
use crate::transformer::{Plan, TextModel};

/// One loaded candle model: what one worker thread owns.
pub struct CandleEngine {
    metadata: ModelMetadata,
    device: Device,
    /// The dtype weights are held and computed in.
    dtype: DType,
    model: Architecture,
    /// The weights file's tensors at the served dtype, read from its header.
    weight_bytes: u64,
}

/// The built-in architectures.
enum Architecture {
    Mlp(Mlp),
    Text(Box<dyn TextModel>),
    /// CLIP's or SigLIP's pictures; its texts run on [`Architecture::Texts`], the engine [`Engine::text_tower`] makes.
    Pictures(towers::Towers),
    Texts(Arc<clip::Clip>),
}

impl std::fmt::Debug for CandleEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleEngine").field("metadata", &self.metadata).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    Relu,
    Gelu,
    Tanh,
    Sigmoid,
    None,
}

impl Activation {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "tanh" => Activation::Tanh,
            "sigmoid" => Activation::Sigmoid,
            "none" => Activation::None,
            _ => return None,
        })
    }

    fn apply(self, x: candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu_erf(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => candle_nn::ops::sigmoid(&x),
            Activation::None => Ok(x),
        }
    }
}

/// A stack of linear layers (torch names `fc1`, `fc2`, …), each followed by its activation.
struct Mlp {
    layers: Vec<(Linear, Activation)>,
}

impl Mlp {
    fn forward(&self, mut x: candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
        for (linear, activation) in &self.layers {
            x = activation.apply(linear.forward(&x)?)?;
        }
        Ok(x)
    }
}

/// The device a model runs on: `Err` when it must be a GPU that cannot be had.
fn select_device(spec: DeviceSpec, model: &str) -> Result<Device> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::Cpu),
        DeviceSpec::Cuda(n) => cuda_device(n),
        DeviceSpec::Auto => match cuda_device(0) {
            Ok(device) => Ok(device),
            Err(e) => {
                if cfg!(feature = "cuda") {
                    tracing::warn!(model, error = %e, "no usable GPU for candle: the model runs on the CPU");
                }
                Ok(Device::Cpu)
            }
        },
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(n: usize) -> Result<Device> {
    // The CUDA driver bindings may panic rather than fail when no driver is present.
    match std::panic::catch_unwind(|| Device::new_cuda(n)) {
        Ok(Ok(device)) => Ok(device),
        Ok(Err(e)) => Err(Error::Unsupported(format!("cannot use GPU {n}: {e}"))),
        Err(_) => Err(Error::Unsupported(format!("cannot use GPU {n}: the CUDA driver is not usable here"))),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(n: usize) -> Result<Device> {
    Err(Error::Unsupported(format!(
        "cuda:{n} was asked for, but this inferd was built without CUDA support (build with --features cuda, or use \
         the CUDA image)"
    )))
}

pub(crate) fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        _ => "cpu".to_owned(),
    }
}

fn dtype_of(precision: Precision) -> DType {
    match precision {
        Precision::Fp32 => DType::F32,
        Precision::Fp16 => DType::F16,
        Precision::Bf16 => DType::BF16,
    }
}

impl CandleEngine {
    /// Loads the model: a text model computing `wants` (its task's contracts, see [`Contract`]), or a tensor model
    /// when `wants` is empty. `default_precision` applies on a GPU when `model.toml` names none; on the CPU, where
    /// FP16/BF16 are several times slower than FP32, only an explicit `precision` leaves FP32.
    pub fn load(config: &ModelConfig, default_precision: Precision, wants: &[Contract]) -> Result<CandleEngine> {
        let toml = config.config_file.as_path();
        let options = config.candle.as_ref().ok_or_else(|| Error::config(toml, "candle: missing [candle] table"))?;
        let text = match (options.architecture.as_str(), wants.is_empty()) {
            ("mlp", true) | ("clip", _) => None,
            // `bert`: the name text models had before other architectures.
            ("transformer" | "bert", false) => Some(TextSettings::resolve(config, wants)?),
            ("mlp" | "transformer" | "bert", _) => {
                return Err(Error::config(
                    toml,
                    format!(
                        "candle.architecture: `{}` does not serve task = \"{}\" (`mlp` takes tensors, `transformer` \
                         text)",
                        options.architecture,
                        config.task.as_str()
                    ),
                ))
            }
            (other, _) => {
                return Err(Error::config(
                    toml,
                    format!(
                        "candle.architecture: unknown architecture `{other}` (expected mlp; transformer: the \
                         architecture its config.json names; or clip, for CLIP and SigLIP)"
                    ),
                ))
            }
        };
        // Read everything that can be wrong with the files before a device is touched.
        if !config.file.is_file() {
            return Err(Error::config(&config.file, "the weights file named by `file` does not exist"));
        }
        let plan = text.as_ref().map(|_| Plan::read(&config.dir)).transpose()?;
        let clip = options.architecture == "clip";
        let activations = match text {
            None if !clip => mlp_shape(options).map_err(|m| Error::config(toml, m))?,
            _ => Vec::new(),
        };
        let device = select_device(config.device, &config.name)?;
        let precision = match config.precision {
            Some(p) => p,
            None if device.is_cuda() => default_precision,
            None => Precision::Fp32,
        };
        let dtype = dtype_of(precision);
        let weight_bytes = memory::weights_bytes(&config.file, dtype)?;
        if let Some(memory) = memory::gpu_memory(&device) {
            memory::check_fits(&config.name, weight_bytes, precision, &device_name(&device), memory)?;
        }
        memory::log_gpu_free(&device, &config.name, "device ready");
        let (model, inputs, outputs, text) = match (text, plan) {
            (Some(settings), Some(plan)) => {
                let model = plan.load(&config.file, wants, settings.pooling, dtype, &device)?;
                let token = |name: &str| TensorSpec {
                    name: name.into(),
                    datatype: DataType::Int64,
                    shape: vec![-1, -1],
                    optional: false,
                };
                let inputs = vec![token(INPUT_IDS), token(ATTENTION_MASK), token(TOKEN_TYPE_IDS)];
                let dims = model.dims();
                let mut info = settings.info(config, model.contracts().to_vec(), dims.hidden, model.head_labels())?;
                info.vocab_size = Some(dims.vocab);
                let first = wants[0];
                let outputs = vec![contract_output(first, info.width(first).unwrap_or(0))];
                (Architecture::Text(model), inputs, outputs, Some(info))
            }
            _ if clip => {
                let (towers, inputs, outputs) = towers::load(config, dtype, &device)?;
                (Architecture::Pictures(towers), inputs, outputs, None)
            }
            _ => {
                let mlp = load_mlp(&config.file, options, &activations, dtype, &device)?;
                let (inputs, outputs) = mlp_specs(config, options).map_err(|m| Error::config(toml, m))?;
                (Architecture::Mlp(mlp), inputs, outputs, None)
            }
        };
        memory::log_gpu_free(&device, &config.name, "weights loaded");
        Ok(CandleEngine {
            metadata: ModelMetadata {
                inputs,
                outputs,
                device: device_name(&device),
                precision,
                platform: "candle",
                text,
            },
            device,
            dtype,
            model,
            weight_bytes,
        })
    }
}

/// Checks `layers` and `activations`; returns the activations.
fn mlp_shape(options: &CandleOptions) -> std::result::Result<Vec<Activation>, String> {
    if options.layers.len() < 2 || options.layers.contains(&0) {
        return Err(format!(
            "candle.layers: an mlp needs at least two non-zero widths (input and output), got {:?}",
            options.layers
        ));
    }
    if options.activations.len() != options.layers.len() - 1 {
        return Err(format!(
            "candle.activations: one per linear layer ({}), got {}",
            options.layers.len() - 1,
            options.activations.len()
        ));
    }
    options
        .activations
        .iter()
        .enumerate()
        .map(|(i, a)| {
            Activation::parse(a).ok_or_else(|| {
                format!(
                    "candle.activations[{i}]: unknown activation `{a}` (expected relu, gelu, tanh, sigmoid or none)"
                )
            })
        })
        .collect()
}

/// Inputs and outputs: as declared, or `input`/`output` FP32 with the first and last widths.
fn mlp_specs(
    config: &ModelConfig,
    options: &CandleOptions,
) -> std::result::Result<(Vec<TensorSpec>, Vec<TensorSpec>), String> {
    let (first, last) = (options.layers[0] as i64, options.layers[options.layers.len() - 1] as i64);
    let one = |kind: &str, declared: &[TensorSpec], width: i64| -> std::result::Result<TensorSpec, String> {
        let spec = match declared {
            [] => {
                TensorSpec { name: kind.to_owned(), datatype: DataType::Fp32, shape: vec![-1, width], optional: false }
            }
            [spec] => spec.clone(),
            _ => return Err(format!("{kind}: an mlp has exactly one {kind}, {} are declared", declared.len())),
        };
        if spec.shape != [-1, width] {
            return Err(format!("{kind}[0].shape: an mlp with these layers needs [-1, {width}], got {:?}", spec.shape));
        }
        if !matches!(spec.datatype, DataType::Fp32 | DataType::Fp16 | DataType::Bf16) {
            return Err(format!("{kind}[0].datatype: an mlp takes FP32, FP16 or BF16, not {}", spec.datatype));
        }
        Ok(spec)
    };
    Ok((vec![one("input", &config.inputs, first)?], vec![one("output", &config.outputs, last)?]))
}

fn load_mlp(
    file: &Path,
    options: &CandleOptions,
    activations: &[Activation],
    dtype: DType,
    device: &Device,
) -> Result<Mlp> {
    let weights = |e: candle_core::Error| Error::config(file, format!("cannot load the weights: {e}"));
    // SAFETY: the file is memory-mapped only while the weights are copied onto the device (VarBuilder casts and
    // copies every tensor it hands out); inferd never writes model files, and the map is dropped on return.
    #[allow(unsafe_code)]
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[file], dtype, device) }.map_err(weights)?;
    let layers = options
        .layers
        .windows(2)
        .zip(activations)
        .enumerate()
        .map(|(i, (io, &activation))| {
            candle_nn::linear(io[0], io[1], vb.pp(format!("fc{}", i + 1))).map(|l| (l, activation)).map_err(weights)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Mlp { layers })
}

fn to_candle(t: &Tensor, device: &Device) -> Result<candle_core::Tensor> {
    let shape = t.shape().to_vec();
    let tensor = match t.dtype() {
        DataType::Fp32 => candle_core::Tensor::from_vec(t.to_vec::<f32>()?, shape, device),
        DataType::Fp16 => candle_core::Tensor::from_vec(t.to_vec::<half::f16>()?, shape, device),
        DataType::Bf16 => candle_core::Tensor::from_vec(t.to_vec::<half::bf16>()?, shape, device),
        other => return Err(Error::InvalidInput(format!("candle models take float inputs, not {other}"))),
    };
    tensor.map_err(Error::engine)
}

fn from_candle(t: &candle_core::Tensor, datatype: DataType) -> Result<Tensor> {
    let shape = t.dims().to_vec();
    let flat = t.flatten_all().map_err(Error::engine)?;
    match datatype {
        DataType::Fp32 => Tensor::from_slice(shape, &flat.to_vec1::<f32>().map_err(Error::engine)?),
        DataType::Fp16 => Tensor::from_slice(shape, &flat.to_vec1::<half::f16>().map_err(Error::engine)?),
        DataType::Bf16 => Tensor::from_slice(shape, &flat.to_vec1::<half::bf16>().map_err(Error::engine)?),
        other => Err(Error::Engine(format!("candle models give float outputs, not {other}"))),
    }
}

impl Engine for CandleEngine {
    fn metadata(&self) -> &ModelMetadata {
        &self.metadata
    }

    fn weight_bytes(&self) -> Option<u64> {
        Some(self.weight_bytes)
    }

    fn release_cached_memory(&mut self) {
        memory::release_pooled(&self.device);
    }

    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        match &self.model {
            Architecture::Mlp(mlp) => {
                let input = inputs.first().ok_or_else(|| Error::InvalidInput("an mlp takes one input".into()))?;
                let x = to_candle(input, &self.device)?.to_dtype(self.dtype).map_err(Error::engine)?;
                let y = mlp.forward(x).map_err(Error::engine)?;
                let out = &self.metadata.outputs[0];
                // Cast back on the device, before the copy to the host.
                let y = y.to_dtype(dtype_of_output(out.datatype)).map_err(Error::engine)?;
                Ok(vec![from_candle(&y, out.datatype)?])
            }
            Architecture::Text(model) => Ok(vec![self.run_text(model.contracts()[0], inputs)?]),
            Architecture::Pictures(towers) => {
                let [pixels] = inputs else {
                    return Err(Error::InvalidInput(format!("pictures come as one input, {}", towers::PIXEL_VALUES)));
                };
                Ok(vec![towers::embed_pictures(&towers.model, pixels, self.dtype, &self.device)?])
            }
            Architecture::Texts(_) => Ok(vec![self.run_text(Contract::Pooled, inputs)?]),
        }
    }

    fn text_tower(&self) -> Option<Box<dyn Engine>> {
        let Architecture::Pictures(towers) = &self.model else { return None };
        Some(Box::new(CandleEngine {
            metadata: towers::text_metadata(&self.metadata, &towers.texts),
            device: self.device.clone(),
            dtype: self.dtype,
            model: Architecture::Texts(towers.model.clone()),
            // The weights are the pictures' engine's, counted there.
            weight_bytes: 0,
        }))
    }

    fn run_text(&mut self, contract: Contract, inputs: &[Tensor]) -> Result<Tensor> {
        match &self.model {
            Architecture::Text(model) if model.contracts().contains(&contract) => {
                let batch = self.batch(model.as_ref(), inputs)?;
                let out = model.run(contract, &batch).map_err(Error::engine)?;
                from_candle(&out, DataType::Fp32)
            }
            Architecture::Texts(model) if contract == Contract::Pooled => {
                towers::embed_texts(model, inputs, &self.device)
            }
            _ => Err(Error::Unsupported(format!("this model gives no {}", contract.as_str()))),
        }
    }
}

impl Drop for CandleEngine {
    /// On a GPU the weights' memory would stay in CUDA's memory pool, counted as this process's, until some later
    /// batch of another model synchronises: an unloaded model gives it back at once.
    fn drop(&mut self) {
        // The thread that drops an engine may never have run a batch: without the GPU's context current there,
        // freeing a tensor would fail, unseen.
        memory::bind_context(&self.device);
        self.model = Architecture::Mlp(Mlp { layers: Vec::new() });
        memory::release_pooled(&self.device);
    }
}

impl CandleEngine {
    /// A text model's token inputs as a batch on its device, the ids checked against its vocabularies.
    fn batch(&self, model: &dyn TextModel, inputs: &[Tensor]) -> Result<Batch> {
        let [ids, mask, types] = inputs else {
            return Err(Error::InvalidInput("a text model takes input_ids, attention_mask and token_type_ids".into()));
        };
        let dims = model.dims();
        let ids = token_ids(ids, dims.vocab as i64, INPUT_IDS)?;
        // A model with one token type (or none) takes none from the tokenizer (RoBERTa's marks a pair's second
        // text).
        let types = match dims.token_types {
            0 | 1 => vec![0; ids.len()],
            n => token_ids(types, n as i64, TOKEN_TYPE_IDS)?,
        };
        let [rows, seq] = inputs[0].shape()[..] else {
            return Err(Error::InvalidInput(format!("{INPUT_IDS} must be [rows, tokens]")));
        };
        let mask = mask.to_vec::<i64>()?;
        if mask.len() != ids.len() {
            return Err(Error::InvalidInput(format!("{ATTENTION_MASK} must have the shape of {INPUT_IDS}")));
        }
        Batch::new(ids, types, &mask, rows, seq, &self.device).map_err(Error::engine)
    }
}

/// A token input's values, each checked to be below `limit`: an id out of range is the client's fault.
fn token_ids(t: &Tensor, limit: i64, name: &str) -> Result<Vec<u32>> {
    let values = t.to_vec::<i64>()?;
    match values.iter().find(|&&v| !(0..limit).contains(&v)) {
        Some(bad) => Err(Error::InvalidInput(format!("{name}: {bad} is not in the model's range 0 to {}", limit - 1))),
        // Below a usize vocabulary's size, and vocabularies are far below u32::MAX.
        None => Ok(values.into_iter().map(|v| v as u32).collect()),
    }
}

fn dtype_of_output(datatype: DataType) -> DType {
    match datatype {
        DataType::Fp16 => DType::F16,
        DataType::Bf16 => DType::BF16,
        _ => DType::F32,
    }
}
