//! Prometheus metrics: every name defined here, once; a recorder of the server's own rather than a process-wide
//! global (two servers in one process keep their figures apart); every series registered at start-up, so that it
//! reads zero before the first request instead of being missing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use inferd_models::ModelMemory;
use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::gpu::GpuInfo;

mod batch;

pub use batch::{BatchCounts, BatchMetrics, SizeCounts};

/// The metric names, with Prometheus unit suffixes.
pub mod names {
    /// Inference requests answered, by `model`, `protocol` and `code`.
    pub const REQUESTS: &str = "inferd_requests_total";
    /// Inference requests being handled now, by `model` and `protocol`.
    pub const REQUESTS_IN_FLIGHT: &str = "inferd_requests_in_flight";
    /// Seconds from a request's arrival to its answer, by `model` and `protocol`.
    pub const REQUEST_DURATION: &str = "inferd_request_duration_seconds";
    /// Seconds a request waited in its model's queue before its batch started, by `model`.
    pub const QUEUE_DURATION: &str = "inferd_queue_duration_seconds";
    /// Seconds a request spent in one step of its model's task before the queue, by `model` and `stage` (a vision
    /// model's `decode`: the files to pixels; `resize`: the pixels to the input tensor).
    pub const PREPARE_DURATION: &str = "inferd_prepare_duration_seconds";
    /// Seconds the engine spent on one batch, by `model`.
    pub const COMPUTE_DURATION: &str = "inferd_compute_duration_seconds";
    /// Rows in one batch, by `model`.
    pub const BATCH_SIZE: &str = "inferd_batch_size_rows";
    /// Batches whose engine call failed or panicked, by `model`.
    pub const BATCH_FAILURES: &str = "inferd_batch_failures_total";
    /// Seconds one worker (an engine instance) spent on one batch, by `model` and `instance`: its `_sum` is the
    /// time that worker held the cores or the GPU.
    pub const WORKER_BUSY: &str = "inferd_worker_busy_seconds";
    /// Text models: real tokens batched, by `model`.
    pub const BATCH_TOKENS: &str = "inferd_batch_tokens_total";
    /// Text models: tokens batched once padded to each batch's longest sequence, by `model`. Over
    /// `inferd_batch_tokens_total`, the padding waste.
    pub const BATCH_PADDED_TOKENS: &str = "inferd_batch_padded_tokens_total";
    /// Requests waiting for a worker, by `model`.
    pub const QUEUE_DEPTH: &str = "inferd_queue_depth";
    /// 1 when the model is loaded, warmed and serving; 0 otherwise. By `model`.
    pub const MODEL_READY: &str = "inferd_model_ready";
    /// GPUs visible through NVML.
    pub const GPUS: &str = "inferd_gpus";
    /// By `gpu` (index) and `name`.
    pub const GPU_MEMORY_USED: &str = "inferd_gpu_memory_used_bytes";
    pub const GPU_MEMORY_TOTAL: &str = "inferd_gpu_memory_total_bytes";
    /// The share of the last sample period a kernel ran, 0 to 1.
    pub const GPU_UTILIZATION: &str = "inferd_gpu_utilization_ratio";
    pub const GPU_TEMPERATURE: &str = "inferd_gpu_temperature_celsius";
    /// The process's resident memory.
    pub const RESIDENT_MEMORY: &str = "process_resident_memory_bytes";
    /// A model's weights as its engines hold them (its versions' and instances' together), by `model`.
    pub const MODEL_WEIGHTS: &str = "inferd_model_weight_bytes";
    /// GPU memory a model's load and warm-up took (its versions' together), by `model`; GPU models only.
    pub const MODEL_DEVICE_MEMORY: &str = "inferd_model_device_memory_bytes";
    /// System shared-memory regions that clients registered.
    pub const SHARED_MEMORY_REGIONS: &str = "inferd_shared_memory_regions";
    /// Their bytes, all together.
    pub const SHARED_MEMORY_BYTES: &str = "inferd_shared_memory_bytes";
}

/// The protocol an inference request came in: the `protocol` label. Known from the route that served it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `/predict` and `/models/{model}/predict`.
    Predict,
    /// The KServe v2 `infer` routes.
    V2,
    /// TEI's routes: `/embed`, `/rerank`, `/`, TEI's `/predict` on its own routes.
    Tei,
    /// OpenAI's `/v1/embeddings`.
    OpenAi,
    /// KServe v2 over gRPC: `ModelInfer`, and each request on a `ModelStreamInfer` stream.
    Grpc,
    /// Cohere's and Jina's `/v1/rerank`, `/v2/rerank`.
    Cohere,
}

impl Protocol {
    pub const ALL: [Protocol; 6] =
        [Protocol::Predict, Protocol::V2, Protocol::Tei, Protocol::OpenAi, Protocol::Grpc, Protocol::Cohere];

    pub fn label(self) -> &'static str {
        match self {
            Protocol::Predict => "predict",
            Protocol::V2 => "v2",
            Protocol::Tei => "tei",
            Protocol::OpenAi => "openai",
            Protocol::Grpc => "grpc",
            Protocol::Cohere => "cohere",
        }
    }
}

/// The codes inference routes answer with; their series exist from start-up.
const CODES: [u16; 8] = [200, 400, 401, 404, 413, 429, 500, 503];

/// How often the server folds histogram samples into buckets ([`Metrics::upkeep`]): at 40k requests/s, about
/// 2 MB of samples wait in between.
pub const UPKEEP_PERIOD: Duration = Duration::from_secs(1);

/// Histogram buckets for durations: 50 µs to 10 s.
const SECONDS_BUCKETS: [f64; 17] =
    [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Histogram buckets for batch rows.
const ROWS_BUCKETS: [f64; 12] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

static METADATA: Metadata<'static> = Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The server's metrics. Cheap to share behind the app state; handles are cheap to clone.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// The request-side series of each model, one per protocol (in `Protocol::ALL` order), registered at
    /// start-up so that a request costs no registry lookup or label allocation.
    routes: HashMap<String, [RouteSeries; Protocol::ALL.len()]>,
}

/// One model's series over one protocol.
struct RouteSeries {
    in_flight: Gauge,
    duration: Histogram,
    /// The counter of each code in `CODES`.
    codes: Vec<(u16, Counter)>,
}

impl Metrics {
    /// Registers every series for `models` at zero.
    pub fn new(models: &[impl AsRef<str>]) -> Metrics {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(names::BATCH_SIZE.into()), &ROWS_BUCKETS))
            .expect("the bucket lists are not empty; this is a bug");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let mut metrics = Metrics { recorder, handle, routes: HashMap::new() };
        metrics.describe();
        // Registering a series creates it at zero.
        for model in models {
            let model = model.as_ref();
            let series = Protocol::ALL.map(|protocol| RouteSeries {
                in_flight: metrics.register_in_flight(model, protocol),
                duration: metrics.request_duration(model, protocol),
                codes: CODES.iter().map(|&code| (code, metrics.requests(model, protocol, code))).collect(),
            });
            metrics.routes.insert(model.to_owned(), series);
            let m = || vec![Label::new("model", model.to_owned())];
            let _ = metrics.histogram(names::QUEUE_DURATION, m());
            let _ = metrics.histogram(names::COMPUTE_DURATION, m());
            let _ = metrics.histogram(names::BATCH_SIZE, m());
            let _ = metrics.counter(names::BATCH_FAILURES, m());
            let _ = metrics.counter(names::BATCH_TOKENS, m());
            let _ = metrics.counter(names::BATCH_PADDED_TOKENS, m());
            let _ = metrics.gauge(names::QUEUE_DEPTH, m());
            let _ = metrics.gauge(names::MODEL_READY, m());
        }
        let _ = metrics.gauge(names::GPUS, vec![]);
        let _ = metrics.gauge(names::RESIDENT_MEMORY, vec![]);
        metrics
    }

    fn describe(&self) {
        let describe = |name: &'static str, unit: Option<Unit>, help: &'static str| {
            self.recorder.describe_counter(name.into(), unit, SharedString::const_str(help));
        };
        describe(names::REQUESTS, None, "Inference requests answered, by model, protocol and status code.");
        describe(names::REQUESTS_IN_FLIGHT, None, "Inference requests being handled now.");
        describe(names::REQUEST_DURATION, Some(Unit::Seconds), "Time from a request's arrival to its answer.");
        describe(names::QUEUE_DURATION, Some(Unit::Seconds), "Time a request waited before its batch started.");
        describe(names::PREPARE_DURATION, Some(Unit::Seconds), "Time a request spent in one step before the queue.");
        describe(names::COMPUTE_DURATION, Some(Unit::Seconds), "Time the engine spent on one batch.");
        describe(names::BATCH_SIZE, None, "Rows in one batch.");
        describe(names::BATCH_FAILURES, None, "Batches whose engine call failed or panicked.");
        describe(
            names::WORKER_BUSY,
            Some(Unit::Seconds),
            "Each worker's (engine instance's) batches: its _sum is the time it held the cores or the GPU.",
        );
        describe(names::BATCH_TOKENS, None, "Text models: real tokens batched.");
        describe(names::BATCH_PADDED_TOKENS, None, "Text models: tokens batched, padding included.");
        describe(names::QUEUE_DEPTH, None, "Requests waiting for a worker.");
        describe(names::MODEL_READY, None, "1 when the model is loaded, warmed and serving.");
        describe(names::GPUS, None, "GPUs visible through NVML.");
        describe(names::GPU_MEMORY_USED, Some(Unit::Bytes), "GPU memory in use.");
        describe(names::GPU_MEMORY_TOTAL, Some(Unit::Bytes), "GPU memory in all.");
        describe(names::GPU_UTILIZATION, None, "Share of the last sample period a kernel ran, 0 to 1.");
        describe(names::GPU_TEMPERATURE, None, "GPU temperature in degrees Celsius.");
        describe(names::RESIDENT_MEMORY, Some(Unit::Bytes), "Resident memory of the inferd process.");
        describe(names::MODEL_WEIGHTS, Some(Unit::Bytes), "A model's weights as its engines hold them.");
        describe(names::MODEL_DEVICE_MEMORY, Some(Unit::Bytes), "GPU memory a model's load and warm-up took.");
        describe(
            names::SHARED_MEMORY_REGIONS,
            None,
            "Shared-memory regions that clients registered, by kind (system, cuda).",
        );
        describe(names::SHARED_MEMORY_BYTES, Some(Unit::Bytes), "The registered shared-memory regions' bytes.");
    }

    fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        self.recorder.register_counter(&Key::from_parts(name, labels), &METADATA)
    }

    fn gauge(&self, name: &'static str, labels: Vec<Label>) -> Gauge {
        self.recorder.register_gauge(&Key::from_parts(name, labels), &METADATA)
    }

    fn histogram(&self, name: &'static str, labels: Vec<Label>) -> Histogram {
        self.recorder.register_histogram(&Key::from_parts(name, labels), &METADATA)
    }

    fn requests(&self, model: &str, protocol: Protocol, code: u16) -> Counter {
        self.counter(
            names::REQUESTS,
            vec![
                Label::new("model", model.to_owned()),
                Label::new("protocol", protocol.label()),
                Label::new("code", code.to_string()),
            ],
        )
    }

    /// The series of `model` over `protocol`, if they were registered at start-up.
    fn route(&self, model: &str, protocol: Protocol) -> Option<&RouteSeries> {
        let i = Protocol::ALL.iter().position(|&p| p == protocol)?;
        self.routes.get(model).map(|series| &series[i])
    }

    /// The in-flight gauge of `model` over `protocol`.
    fn in_flight(&self, model: &str, protocol: Protocol) -> Gauge {
        match self.route(model, protocol) {
            Some(series) => series.in_flight.clone(),
            None => self.register_in_flight(model, protocol),
        }
    }

    /// Counts one request of `model` over `protocol` in flight until the guard is dropped: also when the request's
    /// future is dropped part-way (its client gone).
    pub fn enter(&self, model: &str, protocol: Protocol) -> InFlight {
        let gauge = self.in_flight(model, protocol);
        gauge.increment(1);
        InFlight(gauge)
    }

    fn register_in_flight(&self, model: &str, protocol: Protocol) -> Gauge {
        self.gauge(
            names::REQUESTS_IN_FLIGHT,
            vec![Label::new("model", model.to_owned()), Label::new("protocol", protocol.label())],
        )
    }

    fn request_duration(&self, model: &str, protocol: Protocol) -> Histogram {
        self.histogram(
            names::REQUEST_DURATION,
            vec![Label::new("model", model.to_owned()), Label::new("protocol", protocol.label())],
        )
    }

    /// Counts one answered inference request.
    pub fn request_done(&self, model: &str, protocol: Protocol, code: u16, elapsed: Duration) {
        let route = self.route(model, protocol);
        // A model or code not known at start-up (the `""` model, a rare status) is registered on first use.
        match route.and_then(|r| r.codes.iter().find(|(c, _)| *c == code)) {
            Some((_, counter)) => counter.increment(1),
            None => self.requests(model, protocol, code).increment(1),
        }
        match route {
            Some(r) => r.duration.record(elapsed.as_secs_f64()),
            None => self.request_duration(model, protocol).record(elapsed.as_secs_f64()),
        }
    }

    /// Records how long one step of a request's task took before the queue (a vision model's `decode`, `resize`).
    pub fn prepare_stage(&self, model: &str, stage: &'static str, took: Duration) {
        let labels = vec![Label::new("model", model.to_owned()), Label::new("stage", stage)];
        self.histogram(names::PREPARE_DURATION, labels).record(took.as_secs_f64());
    }

    /// Folds the histogram samples recorded since the last call into their buckets. The recorder keeps every
    /// sample until then (24 bytes each, two or more per request), so this must run often whether or not anyone
    /// scrapes /metrics; the server calls it every [`UPKEEP_PERIOD`].
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// What one version of `model`'s batcher, of `instances` workers, reports into: the model's series, and the
    /// version's own counts.
    pub fn batch_metrics(&self, model: &str, instances: usize) -> Arc<BatchMetrics> {
        let m = || vec![Label::new("model", model.to_owned())];
        let worker = |i: usize| vec![Label::new("model", model.to_owned()), Label::new("instance", i.to_string())];
        Arc::new(BatchMetrics {
            busy: (0..instances).map(|i| self.histogram(names::WORKER_BUSY, worker(i))).collect(),
            queue: self.histogram(names::QUEUE_DURATION, m()),
            compute: self.histogram(names::COMPUTE_DURATION, m()),
            rows: self.histogram(names::BATCH_SIZE, m()),
            failures: self.counter(names::BATCH_FAILURES, m()),
            tokens: self.counter(names::BATCH_TOKENS, m()),
            padded_tokens: self.counter(names::BATCH_PADDED_TOKENS, m()),
            counts: BatchCounts::default(),
        })
    }

    /// The registered shared-memory regions: how many, and their bytes together.
    pub fn shared_memory(&self, kind: &'static str, regions: usize, bytes: u64) {
        self.gauge(names::SHARED_MEMORY_REGIONS, vec![Label::new("kind", kind)]).set(regions as f64);
        self.gauge(names::SHARED_MEMORY_BYTES, vec![Label::new("kind", kind)]).set(bytes as f64);
    }

    /// The exposition text, with the gauges read now: queue depths, readiness, the GPU snapshot, resident memory.
    /// `versions` are each model version's (name, queue depth, loaded), sorted by name.
    pub fn render<'a>(
        &self,
        versions: impl IntoIterator<Item = (&'a str, usize, Option<ModelMemory>)>,
        gpus: &[GpuInfo],
    ) -> String {
        // A model's versions share its series: their queues and memory add up, and it is ready if one of them is.
        let mut by_name: Vec<(&str, usize, Option<ModelMemory>)> = Vec::new();
        for (model, depth, loaded) in versions {
            match by_name.last_mut() {
                Some((name, queued, memory)) if *name == model => {
                    *queued += depth;
                    *memory = match (*memory, loaded) {
                        (Some(a), Some(b)) => Some(ModelMemory {
                            weight_bytes: a.weight_bytes.zip(b.weight_bytes).map(|(a, b)| a + b),
                            device_bytes: a.device_bytes.zip(b.device_bytes).map(|(a, b)| a + b),
                        }),
                        (a, b) => a.or(b),
                    };
                }
                _ => by_name.push((model, depth, loaded)),
            }
        }
        for (name, depth, memory) in by_name {
            let m = || vec![Label::new("model", name.to_owned())];
            self.gauge(names::QUEUE_DEPTH, m()).set(depth as f64);
            // A model unloaded or not ready holds nothing: its figures drop to 0 rather than keep their last values.
            let loaded = memory.is_some();
            self.gauge(names::MODEL_READY, m()).set(if loaded { 1.0 } else { 0.0 });
            let memory = memory.unwrap_or_default();
            self.gauge(names::MODEL_WEIGHTS, m()).set(memory.weight_bytes.unwrap_or(0) as f64);
            match memory.device_bytes {
                Some(bytes) => self.gauge(names::MODEL_DEVICE_MEMORY, m()).set(bytes as f64),
                None if !loaded => self.gauge(names::MODEL_DEVICE_MEMORY, m()).set(0.0),
                None => {}
            }
        }
        self.gauge(names::GPUS, vec![]).set(gpus.len() as f64);
        for gpu in gpus {
            let g = || vec![Label::new("gpu", gpu.index.to_string()), Label::new("name", gpu.name.clone())];
            self.gauge(names::GPU_MEMORY_USED, g()).set(gpu.memory_used_bytes as f64);
            self.gauge(names::GPU_MEMORY_TOTAL, g()).set(gpu.memory_total_bytes as f64);
            if let Some(percent) = gpu.utilization_percent {
                self.gauge(names::GPU_UTILIZATION, g()).set(f64::from(percent) / 100.0);
            }
            if let Some(celsius) = gpu.temperature_celsius {
                self.gauge(names::GPU_TEMPERATURE, g()).set(f64::from(celsius));
            }
        }
        if let Some(bytes) = resident_memory_bytes() {
            self.gauge(names::RESIDENT_MEMORY, vec![]).set(bytes as f64);
        }
        self.handle.render()
    }
}

/// One request on an in-flight gauge ([`Metrics::enter`]), taken off when dropped.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1);
    }
}

/// The process's resident set, from `/proc/self/status` (Linux; `None` elsewhere).
pub(crate) fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
