//! A model's metadata, readiness and configuration, and the server's own metadata and readiness, typed: the
//! KServe v2 routes serialise them as they are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use inferd_core::{DataType, TensorSpec};
use serde::Serialize;

use crate::error::AppError;
use crate::registry::ModelEntry;
use crate::state::AppState;

/// The server: its name, version and the protocol extensions it serves.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct V2ServerMetadata {
    pub name: &'static str,
    pub version: &'static str,
    pub extensions: &'static [&'static str],
}

/// The server's metadata.
pub fn server_metadata() -> V2ServerMetadata {
    V2ServerMetadata {
        name: "inferd",
        version: env!("CARGO_PKG_VERSION"),
        extensions: &["binary_tensor_data", "model_repository", "statistics"],
    }
}

/// The server takes traffic, or the 503 that says why not.
pub fn server_ready(state: &AppState) -> Result<(), AppError> {
    state.readiness().map_or(Ok(()), |reason| Err(AppError::unavailable(reason)))
}

/// A model version is loaded and serving, or the 503 that says why not.
pub fn model_ready(model: &ModelEntry) -> Result<(), AppError> {
    model.serving().map(drop)
}

/// A tensor's name, KServe data type and shape (`-1` for a variable dimension).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct V2TensorMetadata {
    pub name: String,
    #[schema(value_type = String)]
    pub datatype: DataType,
    pub shape: Vec<i64>,
}

impl V2TensorMetadata {
    fn all(specs: &[TensorSpec]) -> Vec<Self> {
        specs
            .iter()
            .map(|s| V2TensorMetadata { name: s.name.clone(), datatype: s.datatype, shape: s.shape.clone() })
            .collect()
    }
}

/// A model's inputs and outputs as the protocols see them, and the versions ready to serve.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct V2ModelMetadata {
    pub name: String,
    /// The versions ready to serve.
    pub versions: Vec<String>,
    pub platform: &'static str,
    pub inputs: Vec<V2TensorMetadata>,
    pub outputs: Vec<V2TensorMetadata>,
    /// Text models: what they embed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<V2TextParameters>,
}

/// A text model's task, embedding length and longest text in tokens.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct V2TextParameters {
    /// `embed`.
    pub task: &'static str,
    pub dimensions: usize,
    pub max_seq_len: usize,
}

/// The metadata of a loaded model version.
pub fn model_metadata(state: &AppState, model: &ModelEntry) -> Result<V2ModelMetadata, AppError> {
    let loaded = model.serving()?;
    let meta = loaded.metadata();
    let models = state.registry().snapshot();
    let versions = models
        .iter()
        .filter(|m| m.name() == model.name() && m.loaded().is_some())
        .map(|m| m.version().to_string())
        .collect();
    Ok(V2ModelMetadata {
        name: model.name().to_owned(),
        versions,
        platform: meta.platform,
        inputs: V2TensorMetadata::all(&meta.inputs),
        outputs: V2TensorMetadata::all(&meta.outputs),
        parameters: meta.text.as_ref().map(|t| V2TextParameters {
            task: model.config.task.as_str(),
            dimensions: t.dimensions,
            max_seq_len: t.max_seq_len,
        }),
    })
}

/// A model's configuration in Triton's terms (`model_config.proto`'s fields that inferd has), as Triton's clients
/// and tools read it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TritonModelConfig {
    pub name: String,
    pub platform: &'static str,
    pub backend: &'static str,
    /// Rows per batch at most; 0 for a model that takes each request as sent.
    pub max_batch_size: usize,
    pub input: Vec<TritonTensorConfig>,
    pub output: Vec<TritonTensorConfig>,
    pub dynamic_batching: DynamicBatching,
    pub instance_group: Vec<InstanceGroup>,
    pub parameters: ConfigParameters,
}

/// One input or output: Triton's `dims` leave out the batch dimension where the model batches.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TritonTensorConfig {
    pub name: String,
    /// `TYPE_FP32`, `TYPE_STRING`, ….
    pub data_type: String,
    pub dims: Vec<i64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DynamicBatching {
    pub max_queue_delay_microseconds: u64,
    pub preferred_batch_size: Vec<usize>,
    pub default_queue_policy: QueuePolicy,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct QueuePolicy {
    pub max_queue_size: usize,
    pub default_timeout_microseconds: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InstanceGroup {
    pub count: usize,
    /// `KIND_GPU` or `KIND_CPU`.
    pub kind: &'static str,
}

/// Where and how the model runs, beyond Triton's fields.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConfigParameters {
    pub device: String,
    pub precision: &'static str,
}

/// Triton's name for a data type in a model configuration.
fn config_type(datatype: DataType) -> String {
    match datatype {
        DataType::Bytes => "TYPE_STRING".into(),
        other => format!("TYPE_{}", other.as_str()),
    }
}

/// The configuration of a loaded model version.
pub fn model_config(model: &ModelEntry) -> Result<TritonModelConfig, AppError> {
    let loaded = model.serving()?;
    let meta = loaded.metadata();
    let batching = &loaded.batching;
    let tensors = |specs: &[TensorSpec]| {
        let dims = |s: &TensorSpec| if batching.max_batch_size > 0 { s.row_dims().to_vec() } else { s.shape.clone() };
        specs
            .iter()
            .map(|s| TritonTensorConfig { name: s.name.clone(), data_type: config_type(s.datatype), dims: dims(s) })
            .collect()
    };
    Ok(TritonModelConfig {
        name: model.name().to_owned(),
        platform: meta.platform,
        backend: model.config.backend.as_str(),
        max_batch_size: batching.max_batch_size,
        input: tensors(&meta.inputs),
        output: tensors(&meta.outputs),
        dynamic_batching: DynamicBatching {
            max_queue_delay_microseconds: batching.max_queue_delay_us,
            preferred_batch_size: batching.preferred_batch_sizes.clone(),
            default_queue_policy: QueuePolicy {
                max_queue_size: batching.max_queue_size,
                default_timeout_microseconds: batching.timeout_ms.saturating_mul(1000),
            },
        },
        instance_group: vec![InstanceGroup {
            count: model.config.instances,
            kind: if meta.on_gpu() { "KIND_GPU" } else { "KIND_CPU" },
        }],
        parameters: ConfigParameters { device: meta.device.clone(), precision: meta.precision.as_str() },
    })
}

/// A model version's statistics in Triton's terms, from its batcher's counts: the requests answered and their time
/// from queue to answer, their time in the queue, and the engine's runs and their time.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct ModelStats {
    pub name: String,
    pub version: String,
    /// When the last request was answered, in milliseconds since the Unix epoch; 0 before the first.
    pub last_inference: u64,
    /// Rows answered.
    pub inference_count: u64,
    /// Engine runs (batches).
    pub execution_count: u64,
    pub inference_stats: InferStats,
}

/// Counts and their total durations.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct InferStats {
    pub success: StatDuration,
    pub fail: StatDuration,
    pub queue: StatDuration,
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
}

/// How many times something happened, and the nanoseconds it took in all.
#[derive(Debug, Clone, Copy, Default, Serialize, utoipa::ToSchema)]
pub struct StatDuration {
    pub count: u64,
    pub ns: u64,
}

/// The statistics of `versions`, in order.
pub fn statistics(versions: &[Arc<ModelEntry>]) -> Vec<ModelStats> {
    versions.iter().map(|m| model_stats(m)).collect()
}

/// The model versions a statistics request names: every loaded version of every model (`name` none), every
/// version of one model (`version` none), or one version.
pub fn stats_of(state: &AppState, name: Option<&str>, version: Option<&str>) -> Result<Vec<Arc<ModelEntry>>, AppError> {
    let registry = state.registry();
    let models = registry.snapshot();
    Ok(match (name, version) {
        (None, _) => models.iter().filter(|m| m.loaded().is_some()).cloned().collect(),
        (Some(name), None) => {
            // An unknown name is a 404.
            crate::request::resolve_named(registry, name, "")?;
            models.iter().filter(|m| m.name() == name).cloned().collect()
        }
        (Some(name), Some(version)) => vec![crate::request::resolve_named(registry, name, version)?],
    })
}

fn model_stats(model: &ModelEntry) -> ModelStats {
    let mut stats =
        ModelStats { name: model.name().to_owned(), version: model.version().to_string(), ..ModelStats::default() };
    let Some(c) = model.counts() else { return stats };
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let batches = get(&c.batches);
    stats.last_inference = get(&c.last_answer_ms);
    stats.inference_count = get(&c.succeeded_rows);
    stats.execution_count = batches;
    stats.inference_stats = InferStats {
        success: StatDuration { count: get(&c.succeeded), ns: get(&c.succeeded_ns) },
        fail: StatDuration { count: get(&c.failed), ns: get(&c.failed_ns) },
        queue: StatDuration { count: get(&c.started), ns: get(&c.queue_ns) },
        // The engine's run is one step: its inputs' preparation and outputs' extraction are inside it.
        compute_input: StatDuration { count: batches, ns: 0 },
        compute_infer: StatDuration { count: batches, ns: get(&c.compute_ns) },
        compute_output: StatDuration { count: batches, ns: 0 },
    };
    stats
}
