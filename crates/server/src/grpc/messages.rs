//! Triton's model configuration and statistics messages, made from the typed answers the HTTP routes serve as JSON
//! (`ops::models`), so that both protocols say the same.

use crate::codec::grpc::proto::*;
use crate::codec::v2::models::{self as v2, TritonModelConfig};

/// The model configuration the HTTP route serves as JSON, as Triton's message.
pub(super) fn model_config(config: TritonModelConfig) -> ModelConfig {
    let batching = config.dynamic_batching;
    let int = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    let queue = batching.default_queue_policy;
    let optimization = config.optimization;
    let pinned = |p: v2::Enable| Some(model_optimization_policy::PinnedMemoryBuffer { enable: p.enable });
    ModelConfig {
        name: config.name,
        platform: config.platform.to_owned(),
        backend: config.backend.to_owned(),
        version_policy: Some(ModelVersionPolicy {
            policy_choice: Some(match config.version_policy {
                v2::VersionPolicyConfig::Latest { num_versions } => {
                    model_version_policy::PolicyChoice::Latest(model_version_policy::Latest {
                        num_versions: u32::try_from(num_versions).unwrap_or(u32::MAX),
                    })
                }
                v2::VersionPolicyConfig::All {} => {
                    model_version_policy::PolicyChoice::All(model_version_policy::All {})
                }
                v2::VersionPolicyConfig::Specific { versions } => {
                    model_version_policy::PolicyChoice::Specific(model_version_policy::Specific {
                        versions: versions.into_iter().map(|v| i64::try_from(v).unwrap_or(i64::MAX)).collect(),
                    })
                }
            }),
        }),
        max_batch_size: int(config.max_batch_size),
        input: config
            .input
            .into_iter()
            .map(|t| ModelInput {
                name: t.name,
                data_type: config_type(&t.data_type),
                format: model_input::Format::from_str_name(t.format).unwrap_or_default() as i32,
                dims: t.dims,
                is_shape_tensor: t.is_shape_tensor,
                allow_ragged_batch: t.allow_ragged_batch,
                optional: t.optional,
            })
            .collect(),
        output: config
            .output
            .into_iter()
            .map(|t| ModelOutput {
                name: t.name,
                data_type: config_type(&t.data_type),
                dims: t.dims,
                label_filename: t.label_filename,
                is_shape_tensor: t.is_shape_tensor,
            })
            .collect(),
        instance_group: config
            .instance_group
            .into_iter()
            .map(|g| ModelInstanceGroup {
                name: g.name,
                count: int(g.count),
                gpus: g.gpus.into_iter().map(|n| i32::try_from(n).unwrap_or(i32::MAX)).collect(),
                kind: model_instance_group::Kind::from_str_name(g.kind).unwrap_or_default() as i32,
                profile: g.profile,
                passive: g.passive,
                host_policy: g.host_policy,
            })
            .collect(),
        default_model_filename: config.default_model_filename,
        cc_model_filenames: config.cc_model_filenames.into_iter().collect(),
        metric_tags: config.metric_tags.into_iter().collect(),
        scheduling_choice: Some(model_config::SchedulingChoice::DynamicBatching(ModelDynamicBatching {
            preferred_batch_size: batching.preferred_batch_size.into_iter().map(int).collect(),
            max_queue_delay_microseconds: batching.max_queue_delay_microseconds,
            preserve_ordering: batching.preserve_ordering,
            priority_levels: batching.priority_levels,
            default_priority_level: batching.default_priority_level,
            default_queue_policy: Some(ModelQueuePolicy {
                timeout_action: model_queue_policy::TimeoutAction::from_str_name(queue.timeout_action)
                    .unwrap_or_default() as i32,
                default_timeout_microseconds: queue.default_timeout_microseconds,
                allow_timeout_override: queue.allow_timeout_override,
                max_queue_size: u32::try_from(queue.max_queue_size).unwrap_or(u32::MAX),
            }),
        })),
        optimization: Some(ModelOptimizationPolicy {
            priority: model_optimization_policy::ModelPriority::from_str_name(optimization.priority).unwrap_or_default()
                as i32,
            input_pinned_memory: pinned(optimization.input_pinned_memory),
            output_pinned_memory: pinned(optimization.output_pinned_memory),
            gather_kernel_buffer_threshold: optimization.gather_kernel_buffer_threshold,
            eager_batching: optimization.eager_batching,
        }),
        parameters: config
            .parameters
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ModelParameter { string_value: v.string_value }))
            .collect(),
        model_warmup: config
            .model_warmup
            .into_iter()
            .map(|w| ModelWarmup {
                name: w.name,
                batch_size: u32::try_from(w.batch_size).unwrap_or(u32::MAX),
                inputs: w
                    .inputs
                    .into_iter()
                    .map(|(name, input)| {
                        let data = match (input.input_data_file, input.zero_data) {
                            (Some(file), _) => model_warmup::input::InputDataType::InputDataFile(file),
                            (None, zeros) => model_warmup::input::InputDataType::ZeroData(zeros.unwrap_or(true)),
                        };
                        let input = model_warmup::Input {
                            data_type: config_type(&input.data_type),
                            dims: input.dims,
                            input_data_type: Some(data),
                        };
                        (name, input)
                    })
                    .collect(),
                count: w.count,
            })
            .collect(),
    }
}

/// Triton's data type enum from its name in the JSON configuration (`TYPE_FP32`).
fn config_type(name: &str) -> i32 {
    DataType::from_str_name(name).unwrap_or_default() as i32
}

/// A model version's statistics as Triton's message.
pub(super) fn model_statistics(stats: v2::ModelStats) -> ModelStatistics {
    let d = |d: v2::StatDuration| Some(StatisticDuration { count: d.count, ns: d.ns });
    let i = stats.inference_stats;
    ModelStatistics {
        name: stats.name,
        version: stats.version,
        last_inference: stats.last_inference,
        inference_count: stats.inference_count,
        execution_count: stats.execution_count,
        inference_stats: Some(InferStatistics {
            success: d(i.success),
            fail: d(i.fail),
            queue: d(i.queue),
            compute_input: d(i.compute_input),
            compute_infer: d(i.compute_infer),
            compute_output: d(i.compute_output),
            cache_hit: d(i.cache_hit),
            cache_miss: d(i.cache_miss),
        }),
        batch_stats: stats
            .batch_stats
            .into_iter()
            .map(|b| InferBatchStatistics {
                batch_size: b.batch_size,
                compute_input: d(b.compute_input),
                compute_infer: d(b.compute_infer),
                compute_output: d(b.compute_output),
            })
            .collect(),
        memory_usage: stats
            .memory_usage
            .into_iter()
            .map(|m| MemoryUsage { r#type: m.kind.to_owned(), id: m.id, byte_size: m.byte_size })
            .collect(),
    }
}
