//! KServe v2's (and Triton's) wire types beyond inference: the server's and a model's metadata, a model's
//! configuration in Triton's terms, statistics, and the repository's index and control. The operations build them
//! (`ops` in the server); the HTTP routes serialise them as they are, the gRPC service converts them to its messages.

use inferd_core::{DataType, TensorSpec};
use serde::{Deserialize, Serialize};

/// The server: its name, version and the protocol extensions it serves.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct V2ServerMetadata {
    pub name: &'static str,
    pub version: &'static str,
    pub extensions: &'static [&'static str],
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
    pub fn all(specs: &[TensorSpec]) -> Vec<Self> {
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
    /// An input's: whether a request may leave it out (Triton shows it on inputs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
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
pub fn config_type(datatype: DataType) -> String {
    match datatype {
        DataType::Bytes => "TYPE_STRING".into(),
        other => format!("TYPE_{}", other.as_str()),
    }
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

/// One model version in the repository index.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct V2IndexEntry {
    pub name: String,
    /// Empty for a model of the repository that was never loaded.
    pub version: String,
    /// `READY`, `LOADING` or `UNAVAILABLE`.
    pub state: &'static str,
    pub reason: String,
}

/// `POST /v2/repository/index` body (optional).
#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct V2IndexRequest {
    /// Only the models that are ready.
    #[serde(default)]
    pub ready: bool,
}

/// `POST /v2/repository/models/{model}/load` body (optional). Triton's clients may send a configuration or files
/// in `parameters`; inferd reads the model's folder instead, and refuses them.
#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct V2LoadRequest {
    #[serde(default)]
    #[schema(value_type = Object)]
    pub parameters: serde_json::Map<String, serde_json::Value>,
}

/// `GET /v2/models/stats` and the per-model routes: Triton's statistics extension.
#[derive(Serialize, utoipa::ToSchema)]
pub struct V2Statistics {
    pub model_stats: Vec<ModelStats>,
}
