//! inferd-onnx: the [`Engine`] on ONNX Runtime, loaded from a shared library at run time, with the CPU, CUDA
//! and TensorRT execution providers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use inferd_core::text::{
    contract_output, pool, splade, Contract, TextSettings, ATTENTION_MASK, INPUT_IDS, TOKEN_INPUTS,
};
use inferd_core::{
    DataType, DeviceSpec, Engine, Error, ModelConfig, ModelMetadata, Pooling, Precision, Result, Tensor, TensorSpec,
};
use ort::ep::{self, ExecutionProvider};
use ort::session::{Session, SessionInputValue};
use ort::value::{DynValue, TensorElementType, ValueType};

mod busy;
mod graph;
mod late;
mod session;
mod values;

use crate::busy::{Busy, HeldFile, OpenWide};
use crate::session::{fold_constants, open_session, runtime, tensorrt_fp16, Placement, SessionOptions};
use crate::values::{from_ort, to_ort, Held};

/// How ONNX models are loaded: the server's settings that are not in `model.toml`.
#[derive(Debug, Clone)]
pub struct OnnxSettings {
    /// `libonnxruntime.so` to load (once per process: the first that loads wins).
    pub library: PathBuf,
    /// Threads of the one pool that every session shares unless its `[onnx] intra_op_threads` gives it its own:
    /// a busy model uses them all, and busy models share them. Fixed by the first model to load.
    pub shared_threads: usize,
}

/// Bytes of the initializers `file`'s graph stores, read without ONNX Runtime; `None` where it cannot be read so.
pub fn stored_weight_bytes(file: &Path) -> Option<u64> {
    graph::stored(file).map(|s| s.weight_bytes)
}

/// One ONNX Runtime session: what one worker thread owns.
pub struct OnnxEngine {
    session: Session,
    metadata: ModelMetadata,
    /// The graph's initializers as stored; `None` where the file could not be read apart from ONNX Runtime.
    weight_bytes: Option<u64>,
    /// A text model: which graph output serves each contract, and how.
    text: Option<TextGraph>,
    /// A graph with narrow weights on the CPU: the session that widened them, while the model is busy.
    busy: Option<Busy>,
}

/// How a text graph's outputs serve its contracts.
#[derive(Debug, Clone)]
struct TextGraph {
    /// Each contract the graph serves, and the graph output that serves it, in the order asked.
    outputs: Vec<(Contract, TensorSpec)>,
    /// How a last hidden state `[rows, seq, dim]` is pooled into a vector.
    pooling: Pooling,
    /// The position of `attention_mask` among the inputs.
    mask: usize,
}

impl std::fmt::Debug for OnnxEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxEngine").field("metadata", &self.metadata).finish_non_exhaustive()
    }
}

impl OnnxEngine {
    /// Loads one session of the model: a text model computing `wants` (its task's contracts: the first it must
    /// serve, the others where its graph can), or a tensor model when `wants` is empty. `default_precision` applies
    /// when `model.toml` does not name one.
    pub fn load(
        config: &ModelConfig,
        settings: &OnnxSettings,
        default_precision: Precision,
        wants: &[Contract],
    ) -> Result<OnnxEngine> {
        let runtime = runtime(&settings.library, settings.shared_threads)?;
        let placement = match config.device {
            DeviceSpec::Cpu => Placement::Cpu,
            DeviceSpec::Cuda(device) => Placement::Gpu { device, required: true },
            DeviceSpec::Auto => match ep::CUDA::is_available() {
                Ok(true) => Placement::Gpu { device: 0, required: false },
                _ => {
                    tracing::warn!(
                        model = %config.name,
                        library = %runtime.library.display(),
                        "this ONNX Runtime has no CUDA execution provider: the model runs on the CPU"
                    );
                    Placement::Cpu
                }
            },
        };
        // Read through a handle kept open for a busy model's wide session (see `busy`).
        let mut file = std::fs::File::open(&config.file).ok();
        let bytes = file.as_mut().and_then(|f| {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(f, &mut bytes).ok().map(|_| bytes)
        });
        let stored = bytes.as_deref().and_then(graph::stored_in);
        // Narrow weights kept narrow by default are widened once, in a second session, while the model is busy on
        // the CPU (on a GPU widening is a small part of a batch), and given back when it is idle: not where it never
        // is (`release_after_idle_ms = 0`), nor where the weights are in files beside the graph.
        let narrow_bytes = stored.filter(|s| !s.external).map_or(0, |s| s.widened_bytes);
        let may_widen = narrow_bytes > 0
            && config.onnx.fold_constants.is_none()
            && config.batching.release_after_idle_ms > 0
            && !matches!(placement, Placement::Gpu { required: true, .. });
        let held = file.zip(bytes.as_deref()).filter(|_| may_widen).map(|(file, bytes)| HeldFile::new(file, bytes));
        let fold_constants = fold_constants(config, stored);
        // Without folding, a narrow table is widened on every run: only the rows a batch reads are, instead.
        let rewritten = bytes.filter(|_| !fold_constants).and_then(|bytes| late::gather_before_widening(&bytes));
        if let Some((_, tables)) = &rewritten {
            tracing::info!(model = %config.name, tables, "narrow lookup tables are widened after the lookup, row by row");
        }
        let options = SessionOptions {
            own_threads: config.onnx.intra_op_threads,
            fold_constants,
            default_precision,
            model: rewritten.as_ref().map(|(bytes, _)| bytes.as_slice()),
        };
        let (session, placement) = match open_session(runtime, config, &options, placement) {
            Ok(session) => (session, placement),
            Err(e) if placement == (Placement::Gpu { device: 0, required: false }) => {
                tracing::warn!(model = %config.name, error = %e, "no usable GPU for ONNX Runtime: the model runs on the CPU");
                (open_session(runtime, config, &options, Placement::Cpu)?, Placement::Cpu)
            }
            Err(e) => return Err(e),
        };
        let inputs =
            specs_from_graph(config, "input", session.inputs().iter().map(|o| (o.name(), o.dtype())), &config.inputs)?;
        let mut outputs = specs_from_graph(
            config,
            "output",
            session.outputs().iter().map(|o| (o.name(), o.dtype())),
            &config.outputs,
        )?;
        let graph_precision = graph_precision(&inputs, &outputs);
        let tensorrt_fp16 = tensorrt_fp16(config, default_precision);
        let precision = match (placement, config.precision) {
            (Placement::Gpu { .. }, _) if tensorrt_fp16 => Precision::Fp16,
            (_, Some(asked)) if asked != graph_precision => {
                return Err(Error::Unsupported(format!(
                    "model `{}`: precision = \"{asked}\", but the ONNX graph computes in {graph_precision}; export the \
                     graph in {asked}, or use the TensorRT execution provider (tensorrt = true) on a GPU",
                    config.name
                )))
            }
            _ => graph_precision,
        };
        let device = match placement {
            Placement::Cpu => "cpu".to_owned(),
            Placement::Gpu { device, .. } => format!("cuda:{device}"),
        };
        let busy = held.filter(|_| placement == Placement::Cpu).map(|held| {
            let (wide_config, options) =
                (config.clone(), SessionOptions { fold_constants: true, model: None, ..options });
            let open: OpenWide = Arc::new(move || {
                let bytes = held.bytes()?;
                let options = SessionOptions { model: Some(&bytes), ..options };
                open_session(runtime, &wide_config, &options, Placement::Cpu)
            });
            Busy::new(&config.name, narrow_bytes, open)
        });
        let (text, text_graph) = match wants.first() {
            None => (None, None),
            Some(&first) => {
                let settings = TextSettings::resolve(config, wants)?;
                let graph = text_graph(config, &inputs, &outputs, wants, settings.pooling, settings.vocab_size)?;
                let width = |c: Contract| graph.width(c);
                let dimensions = [Contract::Pooled, Contract::TokenStates].into_iter().find_map(width).unwrap_or(0);
                let head = [Contract::SequenceScores, Contract::TokenScores].into_iter().find_map(width);
                let mut info = settings.info(config, graph.contracts(), dimensions, head)?;
                if let Some(vocab) = width(Contract::SparseWeights) {
                    info.vocab_size = Some(vocab);
                }
                outputs = vec![contract_output(first, width(first).unwrap_or(0))];
                (Some(info), Some(graph))
            }
        };
        Ok(OnnxEngine {
            session,
            weight_bytes: stored.map(|s| s.weight_bytes),
            metadata: ModelMetadata { inputs, outputs, device, precision, platform: "onnxruntime_onnx", text },
            text: text_graph,
            busy,
        })
    }

    /// Runs `batch` on the session that takes batches now (see [`Busy`]), and counts it into the model's busy spell.
    fn on_session<T>(
        &mut self,
        batch: impl FnOnce(&mut Session, &ModelMetadata, Option<&TextGraph>) -> Result<T>,
    ) -> Result<T> {
        let session = match self.busy.as_mut().and_then(Busy::before_batch) {
            Some(wide) => wide,
            None => &mut self.session,
        };
        let result = batch(session, &self.metadata, self.text.as_ref());
        if let Some(busy) = &mut self.busy {
            busy.after_batch();
        }
        result
    }
}

fn data_type(ty: TensorElementType) -> Option<DataType> {
    Some(match ty {
        TensorElementType::Bool => DataType::Bool,
        TensorElementType::Uint8 => DataType::Uint8,
        TensorElementType::Uint16 => DataType::Uint16,
        TensorElementType::Uint32 => DataType::Uint32,
        TensorElementType::Uint64 => DataType::Uint64,
        TensorElementType::Int8 => DataType::Int8,
        TensorElementType::Int16 => DataType::Int16,
        TensorElementType::Int32 => DataType::Int32,
        TensorElementType::Int64 => DataType::Int64,
        TensorElementType::Float16 => DataType::Fp16,
        TensorElementType::Float32 => DataType::Fp32,
        TensorElementType::Float64 => DataType::Fp64,
        TensorElementType::Bfloat16 => DataType::Bf16,
        TensorElementType::String => DataType::Bytes,
        _ => return None,
    })
}

/// The graph's inputs (or outputs), in graph order, narrowed by what `model.toml` declares.
fn specs_from_graph<'a>(
    config: &ModelConfig,
    kind: &str,
    graph: impl Iterator<Item = (&'a str, &'a ValueType)>,
    declared: &[TensorSpec],
) -> Result<Vec<TensorSpec>> {
    let bad = |message: String| Error::Unsupported(format!("model `{}`: {message}", config.name));
    let mut specs = Vec::new();
    for (name, value_type) in graph {
        let ValueType::Tensor { ty, shape, .. } = value_type else {
            return Err(bad(format!("{kind} `{name}` is not a tensor")));
        };
        let datatype = data_type(*ty)
            .ok_or_else(|| bad(format!("{kind} `{name}` has element type {ty:?}, which inferd does not serve")))?;
        // A fixed first dimension (a graph exported with a batch of 1, say) means no batch dimension: the server
        // then runs each request's tensors as sent (`max_batch_size = 0`).
        let graph_shape: Vec<i64> = shape.iter().copied().collect();
        let shape = match declared.iter().find(|d| d.name == name) {
            None => graph_shape,
            Some(d) => {
                let fits = d.datatype == datatype
                    && d.shape.len() == graph_shape.len()
                    && d.shape.iter().zip(&graph_shape).all(|(&want, &graph)| graph == -1 || want == graph);
                if !fits {
                    return Err(Error::config(
                        &config.config_file,
                        format!(
                            "{kind} `{name}`: declared {} {:?}, but the graph has {datatype} {graph_shape:?}",
                            d.datatype, d.shape
                        ),
                    ));
                }
                d.shape.clone()
            }
        };
        specs.push(TensorSpec { name: name.to_owned(), datatype, shape, optional: false });
    }
    if let Some(extra) = declared.iter().find(|d| !specs.iter().any(|s| s.name == d.name)) {
        return Err(Error::config(
            &config.config_file,
            format!("{kind} `{}` is declared but the graph has no such {kind}", extra.name),
        ));
    }
    Ok(specs)
}

/// Checks that a text model's graph takes token inputs, and finds the output that serves each contract of `wants`:
/// the first must be served, the others are where the graph has them. Float outputs are told apart by their rank and
/// the contract asked for: `[batch, dim]` is a pooled vector (or a sequence head's logits, or sparse weights a graph
/// pooled itself); `[batch, sequence, dim]` is each token's state (or a token head's logits, or masked-LM logits over
/// a vocabulary of `vocab` entries), reduced here where the contract is per sequence.
fn text_graph(
    config: &ModelConfig,
    inputs: &[TensorSpec],
    outputs: &[TensorSpec],
    wants: &[Contract],
    pooling: Pooling,
    vocab: Option<usize>,
) -> Result<TextGraph> {
    let bad = |message: String| Error::Unsupported(format!("model `{}`: {message}", config.name));
    for spec in inputs {
        if !TOKEN_INPUTS.contains(&spec.name.as_str()) || spec.datatype != DataType::Int64 || spec.shape.len() != 2 {
            return Err(bad(format!(
                "a text model's graph takes INT64 [batch, sequence] token inputs named {}; it has {} `{}` {:?}",
                TOKEN_INPUTS.join(", "),
                spec.datatype,
                spec.name,
                spec.shape
            )));
        }
    }
    if !inputs.iter().any(|s| s.name == INPUT_IDS) {
        return Err(bad(format!("a text model's graph needs an `{INPUT_IDS}` input")));
    }
    let mask = inputs.iter().position(|s| s.name == ATTENTION_MASK).ok_or_else(|| {
        bad(format!(
            "a text model's graph needs an `{ATTENTION_MASK}` input: without one, padding would change its results"
        ))
    })?;
    let float = |rank: usize| {
        outputs.iter().filter(move |s| matches!(s.datatype, DataType::Fp32 | DataType::Fp16) && s.shape.len() == rank)
    };
    let last = |s: &TensorSpec| s.shape.last().and_then(|&d| usize::try_from(d).ok());
    let is_vocab = |s: &&TensorSpec| vocab.is_some_and(|v| last(s) == Some(v));
    let mut served = Vec::new();
    for (i, &contract) in wants.iter().enumerate() {
        let found = match contract {
            // A graph that pools by itself is used as it is; otherwise its hidden state is pooled here.
            Contract::Pooled => float(2).next().or_else(|| float(3).next()),
            Contract::TokenStates | Contract::TokenScores => float(3).next(),
            Contract::SequenceScores => float(2).next(),
            Contract::SparseWeights => float(2).find(is_vocab).or_else(|| float(3).find(is_vocab)),
        };
        match found {
            Some(spec) if last(spec).is_some() => served.push((contract, spec.clone())),
            Some(spec) if i == 0 => {
                return Err(bad(format!("output `{}` has no fixed last dimension: {:?}", spec.name, spec.shape)))
            }
            None if i == 0 => {
                let shape = match contract {
                    Contract::Pooled => "[batch, dim] or [batch, sequence, dim]".to_owned(),
                    Contract::TokenStates => "[batch, sequence, dim]".to_owned(),
                    Contract::SequenceScores => "[batch, labels]".to_owned(),
                    Contract::TokenScores => "[batch, sequence, labels]".to_owned(),
                    Contract::SparseWeights => format!(
                        "[batch, sequence, vocab] (masked-LM logits) or [batch, vocab], vocab being config.json's \
                         vocab_size ({})",
                        vocab.map_or_else(|| "not given".to_owned(), |v| v.to_string())
                    ),
                };
                return Err(bad(format!(
                    "its task needs {}: the graph needs an FP32 or FP16 output {shape}",
                    contract.as_str()
                )));
            }
            _ => {}
        }
    }
    Ok(TextGraph { outputs: served, pooling, mask })
}

impl TextGraph {
    fn contracts(&self) -> Vec<Contract> {
        self.outputs.iter().map(|(c, _)| *c).collect()
    }

    fn output(&self, contract: Contract) -> Option<&TensorSpec> {
        self.outputs.iter().find(|(c, _)| *c == contract).map(|(_, spec)| spec)
    }

    fn width(&self, contract: Contract) -> Option<usize> {
        self.output(contract).and_then(|s| s.shape.last()).and_then(|&d| usize::try_from(d).ok())
    }

    /// `contract`'s FP32 output from the graph's `value` of it: as it is, or reduced from per-token values with the
    /// attention mask (pooled, or SPLADE's largest weight per vocabulary entry).
    fn serve(
        &self,
        contract: Contract,
        spec: &TensorSpec,
        value: DynValue,
        session: &Held,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let out = from_ort(spec, value, session)?;
        let values = f32_values(&out)?;
        match (contract, out.shape()) {
            (Contract::Pooled, &[rows, seq, dim]) => {
                let pooled = pool(&values, &mask.to_vec::<i64>()?, rows, seq, dim, self.pooling)?;
                Tensor::from_slice(vec![rows, dim], &pooled)
            }
            (Contract::SparseWeights, &[rows, seq, vocab]) => {
                let weights = splade(&values, &mask.to_vec::<i64>()?, rows, seq, vocab)?;
                Tensor::from_slice(vec![rows, vocab], &weights)
            }
            (_, shape) => Tensor::from_slice(shape.to_vec(), &values),
        }
    }
}

/// A graph output as FP32 values, whatever float type it came in.
fn f32_values(t: &Tensor) -> Result<Vec<f32>> {
    match t.dtype() {
        DataType::Fp16 => Ok(t.to_vec::<half::f16>()?.into_iter().map(f32::from).collect()),
        _ => t.to_vec::<f32>(),
    }
}

/// The precision a graph computes in: that of its first floating-point tensor.
fn graph_precision(inputs: &[TensorSpec], outputs: &[TensorSpec]) -> Precision {
    match inputs.iter().chain(outputs).map(|s| s.datatype).find(|d| d.is_float()) {
        Some(DataType::Fp16) => Precision::Fp16,
        Some(DataType::Bf16) => Precision::Bf16,
        _ => Precision::Fp32,
    }
}

/// An error of `Session::run`: ONNX Runtime's INVALID_ARGUMENT is the input's fault (an index out of range for a
/// `Gather`, say), everything else the engine's.
fn run_error(e: ort::Error) -> Error {
    match e.code() {
        ort::error::ErrorCode::InvalidArgument => Error::InvalidInput(e.message().to_owned()),
        _ => Error::engine(e),
    }
}

impl Engine for OnnxEngine {
    fn metadata(&self) -> &ModelMetadata {
        &self.metadata
    }

    fn weight_bytes(&self) -> Option<u64> {
        self.weight_bytes
    }

    fn release_cached_memory(&mut self) {
        if let Some(busy) = &mut self.busy {
            busy.release();
        }
    }

    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        if let Some(&(first, _)) = self.text.as_ref().and_then(|g| g.outputs.first()) {
            return Ok(vec![self.run_text(first, inputs)?]);
        }
        self.on_session(|session, metadata, _| {
            let values = session_inputs(&metadata.inputs, inputs)?;
            let held = session.inner();
            let mut outputs = session.run(values).map_err(run_error)?;
            metadata.outputs.iter().map(|spec| from_ort(spec, output_of(&mut outputs, &spec.name)?, &held)).collect()
        })
    }

    fn run_text(&mut self, contract: Contract, inputs: &[Tensor]) -> Result<Tensor> {
        let Some(spec) = self.text.as_ref().and_then(|g| g.output(contract)).cloned() else {
            return Err(Error::Unsupported(format!("this model's graph gives no {}", contract.as_str())));
        };
        self.on_session(|session, metadata, graph| {
            let graph =
                graph.ok_or_else(|| Error::Engine("a text contract without its graph: this is a bug".into()))?;
            let values = session_inputs(&metadata.inputs, inputs)?;
            let held = session.inner();
            let mut outputs = session.run(values).map_err(run_error)?;
            graph.serve(contract, &spec, output_of(&mut outputs, &spec.name)?, &held, &inputs[graph.mask])
        })
    }
}

/// A batch's tensors as the session's inputs, named by `specs`.
fn session_inputs<'a>(specs: &'a [TensorSpec], inputs: &'a [Tensor]) -> Result<Vec<(&'a str, SessionInputValue<'a>)>> {
    specs.iter().zip(inputs).map(|(spec, t)| Ok((spec.name.as_str(), to_ort(t)?))).collect()
}

/// The session's output `name`, taken from the outputs.
fn output_of(outputs: &mut ort::session::SessionOutputs<'_>, name: &str) -> Result<DynValue> {
    outputs.remove(name).ok_or_else(|| Error::Engine(format!("ONNX Runtime returned no output `{name}`")))
}
