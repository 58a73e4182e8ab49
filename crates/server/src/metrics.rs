//! Prometheus metrics: every name defined here, once; a recorder of the server's own rather than a process-wide
//! global (two servers in one process keep their figures apart); every series registered at start-up, so that it
//! reads zero before the first request instead of being missing.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use inferd_batcher::{BatchObserver, BatchRun};
use inferd_models::ModelMemory;
use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::gpu::GpuInfo;

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

/// One model version's batch-side figures, fed by its batcher from the worker threads: the model's Prometheus
/// series (which its versions share), and the version's own counts, which `/health` shows. The one place these
/// events are counted.
pub struct BatchMetrics {
    /// One per worker, by its instance number.
    busy: Vec<Histogram>,
    queue: Histogram,
    compute: Histogram,
    rows: Histogram,
    failures: Counter,
    tokens: Counter,
    padded_tokens: Counter,
    pub counts: BatchCounts,
}

/// One model version's counts since it loaded: what `/health` shows, and the statistics Triton's clients read.
#[derive(Debug, Default)]
pub struct BatchCounts {
    /// Requests queued.
    pub requests: AtomicU64,
    /// Engine runs, and their time in all.
    pub batches: AtomicU64,
    pub compute_ns: AtomicU64,
    /// Rows run.
    pub rows: AtomicU64,
    /// Requests (or pieces of split ones) whose batch started, and their time in the queue in all.
    pub started: AtomicU64,
    pub queue_ns: AtomicU64,
    /// Requests answered with outputs, their rows, and their time from queue to answer in all.
    pub succeeded: AtomicU64,
    pub succeeded_rows: AtomicU64,
    pub succeeded_ns: AtomicU64,
    /// Requests answered with their engine's error, and their time from queue to answer in all.
    pub failed: AtomicU64,
    pub failed_ns: AtomicU64,
    /// Requests (or pieces) in engine runs that succeeded, and their runs' steps, each request counting its whole
    /// run as Triton counts them: joining the inputs, the engine's run, splitting the outputs.
    pub computed: AtomicU64,
    pub compute_input_ns: AtomicU64,
    pub compute_infer_ns: AtomicU64,
    pub compute_output_ns: AtomicU64,
    /// The successful runs by their rows: how many, and their steps' time in all.
    pub by_batch_size: Mutex<BTreeMap<usize, SizeCounts>>,
    /// When the last request was answered, in milliseconds since the Unix epoch; 0 before the first.
    pub last_answer_ms: AtomicU64,
}

/// A batch size's engine runs: how many, and their steps' nanoseconds in all.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SizeCounts {
    pub runs: u64,
    pub input_ns: u64,
    pub infer_ns: u64,
    pub output_ns: u64,
}

/// Nanoseconds of `d`, saturated.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl BatchObserver for BatchMetrics {
    /// The idle worker's allocator cache goes back too: a thread that waits keeps what it cached for ever, and
    /// with it the pages under those blocks (benches/README.md, "Small thread caches").
    fn worker_idle(&self) {
        crate::alloc::flush_thread_cache();
    }

    fn request_queued(&self, _depth: usize) {
        self.counts.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn request_started(&self, queue_time: Duration) {
        self.queue.record(queue_time.as_secs_f64());
        self.counts.started.fetch_add(1, Ordering::Relaxed);
        self.counts.queue_ns.fetch_add(nanos(queue_time), Ordering::Relaxed);
    }

    fn request_answered(&self, rows: usize, elapsed: Duration, ok: bool) {
        let c = &self.counts;
        if ok {
            c.succeeded.fetch_add(1, Ordering::Relaxed);
            c.succeeded_rows.fetch_add(rows as u64, Ordering::Relaxed);
            c.succeeded_ns.fetch_add(nanos(elapsed), Ordering::Relaxed);
        } else {
            c.failed.fetch_add(1, Ordering::Relaxed);
            c.failed_ns.fetch_add(nanos(elapsed), Ordering::Relaxed);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        c.last_answer_ms.store(u64::try_from(now.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn batch_done(&self, run: &BatchRun) {
        let compute_time = run.compute_time();
        if let Some(busy) = self.busy.get(run.worker) {
            busy.record(compute_time.as_secs_f64());
        }
        let c = &self.counts;
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.compute_ns.fetch_add(nanos(compute_time), Ordering::Relaxed);
        c.rows.fetch_add(run.rows as u64, Ordering::Relaxed);
        self.rows.record(run.rows as f64);
        self.compute.record(compute_time.as_secs_f64());
        if !run.ok {
            self.failures.increment(1);
            return;
        }
        let requests = run.requests as u64;
        let (input, infer, output) = (nanos(run.input), nanos(run.infer), nanos(run.output));
        c.computed.fetch_add(requests, Ordering::Relaxed);
        c.compute_input_ns.fetch_add(input.saturating_mul(requests), Ordering::Relaxed);
        c.compute_infer_ns.fetch_add(infer.saturating_mul(requests), Ordering::Relaxed);
        c.compute_output_ns.fetch_add(output.saturating_mul(requests), Ordering::Relaxed);
        let mut sizes = c.by_batch_size.lock().unwrap_or_else(PoisonError::into_inner);
        let size = sizes.entry(run.rows).or_default();
        size.runs += 1;
        size.input_ns = size.input_ns.saturating_add(input);
        size.infer_ns = size.infer_ns.saturating_add(infer);
        size.output_ns = size.output_ns.saturating_add(output);
    }

    fn tokens_batched(&self, real: usize, padded: usize) {
        self.tokens.increment(real as u64);
        self.padded_tokens.increment(padded as u64);
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
