//! KServe v2's (and Triton's) wire types beyond inference: the server's and a model's metadata, a model's
//! configuration in Triton's terms, statistics, and the repository's index and control. The operations build them
//! (`ops` in the server); the HTTP routes serialise them as they are, the gRPC service converts them to its messages.

use std::collections::BTreeMap;

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

/// A model's configuration in Triton's terms: every field of `model_config.proto` for the model kinds inferd
/// serves, with what inferd does where it has the concept and Triton's default where it has none, as Triton's
/// clients and tools read it (the scheduler is always the dynamic batcher).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TritonModelConfig {
    pub name: String,
    pub platform: &'static str,
    pub backend: &'static str,
    /// A backend's shared library, which inferd does not load: empty.
    pub runtime: &'static str,
    pub version_policy: VersionPolicyConfig,
    /// Rows per batch at most; 0 for a model that takes each request as sent.
    pub max_batch_size: usize,
    pub input: Vec<TritonInputConfig>,
    pub output: Vec<TritonOutputConfig>,
    /// Inputs and outputs the batcher makes itself (Triton's ragged batching): none.
    pub batch_input: Vec<Unused>,
    pub batch_output: Vec<Unused>,
    pub optimization: Optimization,
    pub dynamic_batching: DynamicBatching,
    pub instance_group: Vec<InstanceGroup>,
    /// The weights file, as the model's folder names it.
    pub default_model_filename: String,
    pub cc_model_filenames: BTreeMap<String, String>,
    pub metric_tags: BTreeMap<String, String>,
    pub parameters: BTreeMap<&'static str, ParameterValue>,
    pub model_warmup: Vec<WarmupConfig>,
}

/// An entry of a list Triton has that no inferd model fills (`batch_input`, `secondary_devices`): the lists are
/// always empty.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Unused {}

/// Which of a model's version folders are served.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VersionPolicyConfig {
    Latest { num_versions: u64 },
    All {},
    Specific { versions: Vec<u64> },
}

/// One input: Triton's `dims` leave out the batch dimension where the model batches.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TritonInputConfig {
    pub name: String,
    /// `TYPE_FP32`, `TYPE_STRING`, ….
    pub data_type: String,
    /// `FORMAT_NONE`: a picture's layout is the server's business (it takes the picture's file).
    pub format: &'static str,
    pub dims: Vec<i64>,
    pub is_shape_tensor: bool,
    pub allow_ragged_batch: bool,
    /// Whether a request may leave it out.
    pub optional: bool,
}

/// One output: `dims` as an input's.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TritonOutputConfig {
    pub name: String,
    pub data_type: String,
    pub dims: Vec<i64>,
    /// The labels file of a classifying output, where `model.toml` names one.
    pub label_filename: String,
    pub is_shape_tensor: bool,
}

/// Triton's optimisation settings: the defaults, but for pinned host buffers, which inferd does not use.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Optimization {
    /// `PRIORITY_DEFAULT`.
    pub priority: &'static str,
    pub input_pinned_memory: Enable,
    pub output_pinned_memory: Enable,
    pub gather_kernel_buffer_threshold: u32,
    pub eager_batching: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Enable {
    pub enable: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DynamicBatching {
    pub preferred_batch_size: Vec<usize>,
    pub max_queue_delay_microseconds: u64,
    /// Answers leave as their batches end, not in the order requests came.
    pub preserve_ordering: bool,
    pub priority_levels: u32,
    pub default_priority_level: u32,
    pub default_queue_policy: QueuePolicy,
    pub priority_queue_policy: BTreeMap<String, QueuePolicy>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct QueuePolicy {
    /// `REJECT`: a request past its timeout in the queue is answered with an error.
    pub timeout_action: &'static str,
    pub default_timeout_microseconds: u64,
    /// A request's own `timeout` parameter replaces the default.
    pub allow_timeout_override: bool,
    pub max_queue_size: usize,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InstanceGroup {
    pub name: String,
    /// `KIND_GPU` or `KIND_CPU`.
    pub kind: &'static str,
    pub count: usize,
    /// The GPU the instances run on; none on the CPU.
    pub gpus: Vec<i64>,
    pub secondary_devices: Vec<Unused>,
    pub profile: Vec<String>,
    pub passive: bool,
    pub host_policy: String,
}

/// A model parameter's value, as Triton writes it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ParameterValue {
    pub string_value: String,
}

/// A warm-up run `model.toml`'s `[warmup.inputs]` describes.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WarmupConfig {
    pub name: String,
    pub batch_size: u64,
    pub inputs: BTreeMap<String, WarmupInputConfig>,
    pub count: u32,
}

/// One warm-up input: zeros, or a file of raw elements.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WarmupInputConfig {
    pub data_type: String,
    pub dims: Vec<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero_data: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_data_file: Option<String>,
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
    /// A decoupled model's statistics per response count; inferd's models answer each request once: empty.
    pub response_stats: BTreeMap<String, ResponseStats>,
    /// The engine runs that succeeded, by their rows, smallest first.
    pub batch_stats: Vec<BatchStats>,
    /// What the version's weights hold, where its engines say.
    pub memory_usage: Vec<MemoryUsage>,
}

/// Counts and their total durations: requests answered, failed, queued, and (each request counting its whole
/// batch's step) the engine runs' three steps; inferd keeps no response cache.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct InferStats {
    pub success: StatDuration,
    pub fail: StatDuration,
    pub queue: StatDuration,
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
    pub cache_hit: StatDuration,
    pub cache_miss: StatDuration,
}

/// One batch size's engine runs: joining inputs, running, splitting outputs.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct BatchStats {
    pub batch_size: u64,
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
}

/// Triton's statistics of one response count of a decoupled model.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
pub struct ResponseStats {
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
    pub success: StatDuration,
    pub fail: StatDuration,
    pub empty_response: StatDuration,
    pub cancel: StatDuration,
}

/// Memory a model version holds: `type` `CPU` or `GPU`, the device's index, and the bytes.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MemoryUsage {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: i64,
    pub byte_size: u64,
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
