//! A model version's batch-side figures: its batcher's observer, which feeds the model's Prometheus series and the
//! version's own counts (what `/health` and Triton's statistics show).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use inferd_batcher::{BatchObserver, BatchRun};
use metrics::{Counter, Histogram};

/// One model version's batch-side figures, fed by its batcher from the worker threads: the model's Prometheus
/// series (which its versions share), and the version's own counts, which `/health` shows. The one place these
/// events are counted.
pub struct BatchMetrics {
    /// One per worker, by its instance number.
    pub(super) busy: Vec<Histogram>,
    pub(super) queue: Histogram,
    pub(super) compute: Histogram,
    pub(super) rows: Histogram,
    pub(super) failures: Counter,
    pub(super) tokens: Counter,
    pub(super) padded_tokens: Counter,
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
