//! A model's metadata, readiness and configuration, and the server's own metadata and readiness, typed: the
//! KServe v2 routes serialise them as they are.

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
        extensions: &["binary_tensor_data", "model_repository"],
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
