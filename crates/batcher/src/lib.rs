//! inferd-batcher: admission into a bounded per-model queue, dynamic batching, and the worker threads that own
//! the engines.
//!
//! One model is one [`Batcher`]: a cheap `Clone` handle for async code over the model's queue, which cuts
//! batches with [`policy::decide`], a scheduler thread for the queue's timers, and one worker thread per engine
//! instance. Requests come back on `oneshot` channels, so a handler that goes away (its client disconnected)
//! leaves a closed channel behind, and the request is dropped before it costs compute. What happens is told to
//! one [`BatchObserver`], the crate's only source of counts.
//!
//! - `request`: what callers hand in and get back.
//! - `admission`: the checks a request passes before it queues, and its split into pieces.
//! - `queue`: admission, the one place batches are cut, and its triggers; lending an idle worker to the caller of a
//!   lone request of a quick model, who runs it inline (`queue::lending`).
//! - `worker`: running batches, isolating the requests that fail them, checking and splitting outputs.
//! - [`policy`]: the batching decision, a pure function.

mod admission;
pub mod policy;
mod queue;
mod request;
mod worker;

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use inferd_core::{BatchingConfig, Engine, ModelMetadata, Tensor};

use crate::queue::{Admitted, Inline, Queue};
use crate::worker::Worker;

pub use crate::request::{
    BatchError, BatchObserver, BatchRun, InferRequest, InferResponse, Inputs, NoObserver, Pieces,
};

/// What every part knows of the model, fixed at start.
pub(crate) struct Model {
    pub(crate) name: String,
    pub(crate) metadata: ModelMetadata,
    /// A text model: inputs are token sequences, padded along dim 1 when batched.
    pub(crate) sequences: bool,
    /// `max_batch_size = 0`: each request runs alone, its tensors as sent (counted as one row).
    pub(crate) unbatched: bool,
}

/// The handle to one model's queue and workers. Cloning is cheap; when the last clone is dropped the threads
/// finish what is queued and exit.
#[derive(Clone)]
pub struct Batcher {
    /// Shared with the scheduler and worker threads.
    queue: Arc<Queue>,
    /// Told of each request queued; the workers hold clones for what they do.
    observer: Arc<dyn BatchObserver>,
    /// The workers, by index, for the lone requests that run inline on one lent to them. Each worker's thread holds
    /// the only strong reference, so that its engine is dropped on that thread as it exits.
    workers: Arc<[Weak<Mutex<Worker>>]>,
    /// Stops the threads when the last handle goes; the threads themselves hold only the queue.
    _stop_on_drop: Arc<StopOnDrop>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("model", &self.queue.model.name).finish_non_exhaustive()
    }
}

struct StopOnDrop(Arc<Queue>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.begin_stop();
    }
}

impl Batcher {
    /// Starts the scheduler and one worker thread per engine. The engines are loaded (and warmed) already;
    /// `metadata` is theirs. `observer` is told everything the batcher does ([`NoObserver`] to count nothing).
    pub fn start(
        name: &str,
        config: &BatchingConfig,
        engines: Vec<Box<dyn Engine>>,
        observer: Arc<dyn BatchObserver>,
    ) -> std::io::Result<Batcher> {
        let Some(first) = engines.first() else {
            return Err(std::io::Error::other(format!("model `{name}`: no engine instance to run")));
        };
        let metadata = first.metadata().clone();
        let model = Model {
            name: name.to_owned(),
            sequences: metadata.text.is_some(),
            unbatched: config.max_batch_size == 0,
            metadata,
        };
        let queue = Arc::new(Queue::new(model, config, engines.len()));
        let workers: Vec<Arc<Mutex<Worker>>> = engines
            .into_iter()
            .enumerate()
            .map(|(i, engine)| Arc::new(Mutex::new(Worker::new(i, queue.clone(), observer.clone(), engine))))
            .collect();
        // Made first, so that a thread that fails to start stops those already started as `batcher` drops.
        let batcher = Batcher {
            queue: queue.clone(),
            observer: observer.clone(),
            workers: workers.iter().map(Arc::downgrade).collect(),
            _stop_on_drop: Arc::new(StopOnDrop(queue.clone())),
        };
        let timer = queue.clone();
        queue.spawn(format!("inferd-sched-{name}"), move || timer.run_timer())?;
        for (i, worker) in workers.into_iter().enumerate() {
            queue.spawn(format!("inferd-{name}-{i}"), move || Worker::run(worker))?;
        }
        Ok(batcher)
    }

    pub fn name(&self) -> &str {
        &self.queue.model.name
    }

    pub fn metadata(&self) -> &ModelMetadata {
        &self.queue.model.metadata
    }

    /// How long the longest-running batch has run so far, if a worker is running one (or is having its engine
    /// give back its cached memory, see `release_after_idle_ms`): what tells a stalled engine from a busy one.
    pub fn longest_running(&self) -> Option<Duration> {
        self.queue.longest_running()
    }

    /// Requests waiting for a worker (queued, or in a batch that has not started); a split request counts
    /// each of its pieces.
    pub fn queue_depth(&self) -> usize {
        self.queue.depth()
    }

    /// Queues a request and waits for its answer. A request with more rows than `max_batch_size` is split into
    /// pieces that are batched separately, as are a text request's sequences; their outputs are put back
    /// together in order.
    ///
    /// The inputs must fit the model's specs (data types, ranks, fixed dimensions): the caller checks them, as
    /// the server's codec does while decoding, and the batcher does not again. It refuses only what it cannot
    /// batch (see [`InferRequest`]); an engine that refuses an input answers that request alone with
    /// [`BatchError::InvalidInput`].
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, BatchError> {
        let pieces = request.pieces;
        let Admitted { answers: pending, depth, inline } = self.queue.admit(request)?;
        self.observer.request_queued(depth);
        if let Some(inline) = inline {
            self.run_inline(inline);
        }

        let mut answers = Vec::with_capacity(pending.len());
        for answer in pending {
            // A dropped sender means a worker went away without answering: a bug, reported as an engine error.
            let answer = answer
                .await
                .unwrap_or_else(|_| Err(BatchError::Engine("the worker stopped without answering".into())))?;
            answers.push(answer);
        }
        if answers.len() == 1 {
            return answers.pop().ok_or_else(|| BatchError::Engine("no answer".into()));
        }
        let outputs = match pieces {
            Pieces::Apart => answers.iter_mut().flat_map(|a| std::mem::take(&mut a.outputs)).collect(),
            Pieces::Joined => join_pieces(&answers)?,
        };
        Ok(InferResponse {
            outputs,
            batch_rows: answers.iter().map(|a| a.batch_rows).max().unwrap_or(0),
            queue_time: answers.iter().map(|a| a.queue_time).max().unwrap_or_default(),
            compute_time: answers.iter().map(|a| a.compute_time).sum(),
        })
    }

    /// Runs a lone request's batch on this thread, on the engine of the idle worker lent to it, as the worker would.
    fn run_inline(&self, mut inline: Inline<'_>) {
        let batch = inline.take_batch();
        // A lent worker's thread waits for its loan to end before anything else, exiting included: it is alive, and
        // it is its thread that drops the engine. The loan ends as `inline` drops, after the worker's lock.
        if let Some(lent) = self.workers.get(inline.worker).and_then(Weak::upgrade) {
            worker::lock(&lent).run_batch(batch);
        }
    }

    /// Draining: from now on batches are cut without waiting for a fuller one. Requests are still taken.
    pub fn flush(&self) {
        self.queue.flush();
    }

    /// Stops taking requests, lets the workers finish what is queued for up to `timeout`, then answers whatever
    /// is still queued with [`BatchError::Unavailable`]. Returns true if every thread finished in time. Blocks:
    /// call it from a blocking context.
    pub fn stop(&self, timeout: Duration) -> bool {
        self.queue.stop(timeout)
    }
}

/// A split request's outputs, each joined from its pieces' in order.
fn join_pieces(answers: &[InferResponse]) -> Result<Vec<Tensor>, BatchError> {
    let outputs = answers.first().map_or(0, |a| a.outputs.len());
    (0..outputs)
        .map(|i| {
            let parts: Vec<&Tensor> = answers.iter().filter_map(|a| a.outputs.get(i)).collect();
            Tensor::concat_rows(&parts).map_err(|e| BatchError::Engine(format!("reassembling a split request: {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests;
