//! A model's metadata, readiness and configuration, and the server's own metadata and readiness, as KServe v2's
//! wire types (their home is the codec's `v2::models`): the v2 routes serialise them as they are, the gRPC service
//! converts them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use inferd_core::TensorSpec;

use crate::codec::v2::models::{
    config_type, ConfigParameters, DynamicBatching, InferStats, InstanceGroup, ModelStats, QueuePolicy, StatDuration,
    TritonModelConfig, TritonTensorConfig, V2ModelMetadata, V2ServerMetadata, V2TensorMetadata, V2TextParameters,
};
use crate::error::AppError;
use crate::registry::ModelEntry;
use crate::state::AppState;

/// The KServe v2 / Triton extensions the server serves, by Triton's names: the same list on HTTP and gRPC, as Triton
/// gives it. perf_analyzer reads `statistics`, and then calls `ModelStatistics` around each measurement.
pub const EXTENSIONS: &[&str] = &["binary_tensor_data", "model_repository", "model_configuration", "statistics"];

/// The server's metadata.
pub fn server_metadata() -> V2ServerMetadata {
    V2ServerMetadata { name: "inferd", version: env!("CARGO_PKG_VERSION"), extensions: EXTENSIONS }
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
    let tensors = |specs: &[TensorSpec], inputs: bool| {
        let dims = |s: &TensorSpec| if batching.max_batch_size > 0 { s.row_dims().to_vec() } else { s.shape.clone() };
        specs
            .iter()
            .map(|s| TritonTensorConfig {
                name: s.name.clone(),
                data_type: config_type(s.datatype),
                dims: dims(s),
                optional: inputs.then_some(s.optional),
            })
            .collect()
    };
    Ok(TritonModelConfig {
        name: model.name().to_owned(),
        platform: meta.platform,
        backend: model.config.backend.triton_name(),
        max_batch_size: batching.max_batch_size,
        input: tensors(&meta.inputs, true),
        output: tensors(&meta.outputs, false),
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
