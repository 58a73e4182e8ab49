//! A model's metadata, readiness and configuration, and the server's own metadata and readiness, as KServe v2's
//! wire types (their home is the codec's `v2::models`): the v2 routes serialise them as they are, the gRPC service
//! converts them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};

use inferd_core::{Labels, ModelConfig, OutputConfig, TensorSpec, VersionPolicy};

use crate::codec::v2::models::{
    config_type, BatchStats, DynamicBatching, Enable, InferStats, InstanceGroup, MemoryUsage, ModelStats, Optimization,
    ParameterValue, QueuePolicy, StatDuration, TritonInputConfig, TritonModelConfig, TritonOutputConfig,
    V2ModelMetadata, V2ServerMetadata, V2TensorMetadata, V2TextParameters, VersionPolicyConfig, WarmupConfig,
    WarmupInputConfig,
};
use crate::error::AppError;
use crate::registry::ModelEntry;
use crate::state::AppState;

/// The KServe v2 / Triton extensions every build serves, by Triton's names: the same list on HTTP and gRPC, as
/// Triton gives it. perf_analyzer reads `statistics`, and then calls `ModelStatistics` around each measurement.
pub const EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "classification",
    "model_repository",
    "model_configuration",
    "system_shared_memory",
    "statistics",
    "trace",
    "logging",
];

/// The server's metadata: the extensions this build serves.
pub fn server_metadata() -> V2ServerMetadata {
    // CUDA shared memory too, where this build serves it.
    static SERVED: std::sync::LazyLock<Vec<&str>> = std::sync::LazyLock::new(|| {
        let cuda = inferd_candle::ipc::SUPPORTED.then_some("cuda_shared_memory");
        EXTENSIONS.iter().copied().chain(cuda).collect()
    });
    V2ServerMetadata { name: "inferd", version: env!("CARGO_PKG_VERSION"), extensions: &SERVED }
}

/// The server takes traffic, or the 503 that says why not.
pub fn server_ready(state: &AppState) -> Result<(), AppError> {
    state.readiness().map_or(Ok(()), |reason| Err(AppError::unavailable(reason)))
}

/// A model version is loaded and serving, or the 503 that says why not.
pub fn model_ready(model: &ModelEntry) -> Result<(), AppError> {
    model.serving().map(drop)
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

/// The configuration of a loaded model version.
pub fn model_config(model: &ModelEntry) -> Result<TritonModelConfig, AppError> {
    let loaded = model.serving()?;
    let meta = loaded.metadata();
    let batching = &loaded.batching;
    let config = &model.config;
    let batched = batching.max_batch_size > 0;
    let dims = |s: &TensorSpec| if batched { s.row_dims().to_vec() } else { s.shape.clone() };
    let input = meta.inputs.iter().map(|s| TritonInputConfig {
        name: s.name.clone(),
        data_type: config_type(s.datatype),
        format: "FORMAT_NONE",
        dims: dims(s),
        is_shape_tensor: false,
        allow_ragged_batch: false,
        optional: s.optional,
    });
    let labels = |name: &str| match config.postprocess.iter().find(|(output, _)| output == name) {
        Some((_, OutputConfig { labels: Some(Labels::File(path)), .. })) => file_name(path),
        _ => String::new(),
    };
    let output = meta.outputs.iter().map(|s| TritonOutputConfig {
        name: s.name.clone(),
        data_type: config_type(s.datatype),
        dims: dims(s),
        label_filename: labels(&s.name),
        is_shape_tensor: false,
    });
    let queue_policy = |max_queue_size| QueuePolicy {
        timeout_action: "REJECT",
        default_timeout_microseconds: batching.timeout_ms.saturating_mul(1000),
        allow_timeout_override: true,
        max_queue_size,
    };
    let unpinned = || Enable { enable: false };
    let parameter = |value: String| ParameterValue { string_value: value };
    Ok(TritonModelConfig {
        name: model.name().to_owned(),
        platform: meta.platform,
        backend: config.backend.triton_name(),
        runtime: "",
        version_policy: match &config.version_policy {
            VersionPolicy::Latest(n) => VersionPolicyConfig::Latest { num_versions: *n as u64 },
            VersionPolicy::All => VersionPolicyConfig::All {},
            VersionPolicy::Specific(versions) => VersionPolicyConfig::Specific { versions: versions.clone() },
        },
        max_batch_size: batching.max_batch_size,
        input: input.collect(),
        output: output.collect(),
        batch_input: Vec::new(),
        batch_output: Vec::new(),
        optimization: Optimization {
            priority: "PRIORITY_DEFAULT",
            input_pinned_memory: unpinned(),
            output_pinned_memory: unpinned(),
            gather_kernel_buffer_threshold: 0,
            eager_batching: false,
        },
        dynamic_batching: DynamicBatching {
            preferred_batch_size: batching.preferred_batch_sizes.clone(),
            max_queue_delay_microseconds: batching.max_queue_delay_us,
            preserve_ordering: false,
            priority_levels: 0,
            default_priority_level: 0,
            default_queue_policy: queue_policy(batching.max_queue_size),
            priority_queue_policy: BTreeMap::new(),
        },
        instance_group: vec![InstanceGroup {
            name: model.name().to_owned(),
            kind: if meta.on_gpu() { "KIND_GPU" } else { "KIND_CPU" },
            count: config.instances,
            gpus: meta.gpu().into_iter().map(|n| n as i64).collect(),
            secondary_devices: Vec::new(),
            profile: Vec::new(),
            passive: false,
            host_policy: String::new(),
        }],
        default_model_filename: file_name(&config.file),
        cc_model_filenames: BTreeMap::new(),
        metric_tags: BTreeMap::new(),
        parameters: BTreeMap::from([
            ("device", parameter(meta.device.clone())),
            ("precision", parameter(meta.precision.as_str().to_owned())),
        ]),
        model_warmup: warmup_config(config, &loaded.engine_metadata().inputs, batched),
    })
}

/// A path's last part, for Triton's file-name fields.
fn file_name(path: &std::path::Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The warm-up run `[warmup.inputs]` describes, in Triton's terms, of the engine's `inputs`; none where the model
/// warms with zeros of its own shapes (or not at all).
fn warmup_config(config: &ModelConfig, inputs: &[TensorSpec], batched: bool) -> Vec<WarmupConfig> {
    let warmup = &config.warmup;
    if warmup.skip || warmup.inputs.is_empty() {
        return Vec::new();
    }
    let batch_size = match batched {
        true => warmup.inputs.values().next().and_then(|i| i.shape.first()).copied().unwrap_or(1) as u64,
        false => 1,
    };
    let described = warmup
        .inputs
        .iter()
        .map(|(name, input)| {
            let dims = input.shape.iter().skip(usize::from(batched)).map(|&d| d as i64).collect();
            let datatype = inputs.iter().find(|s| &s.name == name).map(|s| s.datatype);
            let config = WarmupInputConfig {
                data_type: datatype.map(config_type).unwrap_or_default(),
                dims,
                zero_data: input.file.is_none().then_some(true),
                input_data_file: input.file.as_deref().map(file_name),
            };
            (name.clone(), config)
        })
        .collect();
    vec![WarmupConfig { name: "warmup".into(), batch_size, inputs: described, count: 1 }]
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
    stats.last_inference = get(&c.last_answer_ms);
    stats.inference_count = get(&c.succeeded_rows);
    stats.execution_count = get(&c.batches);
    // The engine's own copies (onto a GPU, into ONNX Runtime's values) are inside its run: compute input and output
    // are the batch's joining and splitting around it.
    let computed = get(&c.computed);
    stats.inference_stats = InferStats {
        success: StatDuration { count: get(&c.succeeded), ns: get(&c.succeeded_ns) },
        fail: StatDuration { count: get(&c.failed), ns: get(&c.failed_ns) },
        queue: StatDuration { count: get(&c.started), ns: get(&c.queue_ns) },
        compute_input: StatDuration { count: computed, ns: get(&c.compute_input_ns) },
        compute_infer: StatDuration { count: computed, ns: get(&c.compute_infer_ns) },
        compute_output: StatDuration { count: computed, ns: get(&c.compute_output_ns) },
        ..InferStats::default()
    };
    let sizes = c.by_batch_size.lock().unwrap_or_else(PoisonError::into_inner).clone();
    stats.batch_stats = sizes
        .into_iter()
        .map(|(size, s)| BatchStats {
            batch_size: size as u64,
            compute_input: StatDuration { count: s.runs, ns: s.input_ns },
            compute_infer: StatDuration { count: s.runs, ns: s.infer_ns },
            compute_output: StatDuration { count: s.runs, ns: s.output_ns },
        })
        .collect();
    if let Some(loaded) = model.loaded() {
        // On a GPU, what the device lost while the model loaded, else its weights by the engines' account.
        let bytes = loaded.memory.device_bytes.or(loaded.memory.weight_bytes);
        stats.memory_usage = match (bytes, loaded.engine_metadata().gpu()) {
            (Some(byte_size), Some(n)) => vec![MemoryUsage { kind: "GPU", id: n as i64, byte_size }],
            (Some(byte_size), None) => vec![MemoryUsage { kind: "CPU", id: 0, byte_size }],
            (None, _) => Vec::new(),
        };
    }
    stats
}
