//! The workers: each owns one engine and runs the batches the queue cuts for it (or a lone request, inline, on its
//! caller's thread), isolating the requests that make a batch fail, and checks and splits the engine's outputs back
//! into the requests' answers.

use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use inferd_core::text::Contract;
use inferd_core::{DataType, Engine, Tensor};

use crate::queue::{drop_dead_requests, Next, Pending, Queue};
use crate::request::{BatchError, BatchObserver, BatchRun, InferResponse};

/// One engine and what runs batches on it. Its worker thread holds it for each batch it runs; a request's caller
/// holds it instead to run a lone request inline (see [`crate::queue::Queue::admit`]), which is why it sits behind a
/// mutex. The worker thread owns the only strong reference, so the engine is dropped on that thread when it exits.
pub(crate) struct Worker {
    /// Its slot in the queue's record of running batches.
    index: usize,
    /// Shared with the handles, the scheduler and the other workers; batches come from here.
    queue: Arc<Queue>,
    /// Shared with the handles and the other workers; told of every batch this worker runs.
    observer: Arc<dyn BatchObserver>,
    /// Used by whoever holds the worker's lock, which is why `Engine::run` may take `&mut self`.
    engine: Box<dyn Engine>,
    /// When its last batch ended, inline or not: what its idle spell counts from.
    last_batch: Option<Instant>,
}

/// Locks a worker. A panic while a batch ran left nothing half-done that the next batch depends on.
pub(crate) fn lock(worker: &Mutex<Worker>) -> MutexGuard<'_, Worker> {
    worker.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Worker {
    pub(crate) fn new(
        index: usize,
        queue: Arc<Queue>,
        observer: Arc<dyn BatchObserver>,
        engine: Box<dyn Engine>,
    ) -> Self {
        Worker { index, queue, observer, engine, last_batch: None }
    }

    /// The worker thread's body: runs a batch whenever one is cut for it, until the queue stops. Once idle for the
    /// queue's `release_after_idle` after a batch, it has its engine give back what it keeps cached, and waits on.
    pub(crate) fn run(worker: Arc<Mutex<Worker>>) {
        let (index, queue) = {
            let w = lock(&worker);
            (w.index, w.queue.clone())
        };
        loop {
            let last_batch = lock(&worker).last_batch;
            let idle_until = last_batch.zip(queue.release_after_idle).map(|(at, after)| at + after);
            match queue.next_batch(index, idle_until) {
                Next::Batch(batch) => {
                    lock(&worker).run_batch(batch);
                }
                Next::Idle => lock(&worker).release_if_idle(),
                Next::Stop => return,
            }
        }
    }

    /// Has the engine give back its cached memory, unless a batch ran inline since the worker thread began to wait.
    fn release_if_idle(&mut self) {
        let after = self.queue.release_after_idle.unwrap_or_default();
        if self.last_batch.is_some_and(|at| at.elapsed() < after) {
            return;
        }
        self.last_batch = None;
        let released = catch_unwind(AssertUnwindSafe(|| self.engine.release_cached_memory()));
        if released.is_err() {
            let model = &self.queue.model.name;
            tracing::error!(%model, "the engine panicked giving back its cached memory");
        }
        self.observer.worker_idle();
    }

    /// Runs `batch`, unless every request in it is dead; tells the queue how long its engine runs took. Answering is
    /// left out: it wakes the requests' tasks, and on a busy machine a woken thread may take the core mid-answer, which
    /// would count as the batch's and keep lone requests from running inline after it.
    pub(crate) fn run_batch(&mut self, mut batch: Vec<Pending>) {
        let started = Instant::now();
        drop_dead_requests(&mut batch, started);
        if batch.is_empty() {
            return;
        }
        let rows: usize = batch.iter().map(|p| p.rows).sum();
        let span =
            tracing::debug_span!(parent: None, "batch", model = %self.queue.model.name, rows, requests = batch.len());
        for p in &batch {
            span.follows_from(&p.span);
        }
        let _entered = span.enter();
        for p in &batch {
            self.observer.request_started(started.saturating_duration_since(p.enqueued_at));
        }
        let took = self.run_isolating(batch, started);
        self.last_batch = Some(Instant::now());
        self.queue.batch_took(took, rows);
    }

    /// Runs `batch` and answers its requests. A batch that fails while holding more than one request runs again
    /// in halves, and those in halves, so that only the requests that make the engine fail (an input it refuses,
    /// a panic) get its error, and the others their outputs: a poisoned request costs about 2·log2(n) runs of
    /// smaller batches, never its neighbours' answers. Returns the time its engine runs took: inputs joined, the run,
    /// outputs split, summed over the halves.
    fn run_isolating(&mut self, mut batch: Vec<Pending>, started: Instant) -> Duration {
        let ran = Instant::now();
        let rows: usize = batch.iter().map(|p| p.rows).sum();
        let result = self.execute(&batch);
        let compute_time = ran.elapsed();
        let name = &self.queue.model.name;
        match result {
            Ok(per_request) => {
                for (p, outputs) in batch.into_iter().zip(per_request) {
                    let queue_time = started.saturating_duration_since(p.enqueued_at);
                    tracing::debug!(
                        parent: &p.span,
                        model = %name,
                        batch_rows = rows,
                        queue_us = queue_time.as_micros() as u64,
                        compute_us = compute_time.as_micros() as u64,
                        "served"
                    );
                    self.observer.request_answered(p.rows, p.enqueued_at.elapsed(), true);
                    let _ = p.reply.send(Ok(InferResponse { outputs, batch_rows: rows, queue_time, compute_time }));
                }
                compute_time
            }
            Err(error) if batch.len() == 1 => {
                for p in batch {
                    tracing::warn!(parent: &p.span, model = %name, %error, "the request failed");
                    self.observer.request_answered(p.rows, p.enqueued_at.elapsed(), false);
                    let _ = p.reply.send(Err(error.clone()));
                }
                compute_time
            }
            Err(error) => {
                tracing::warn!(
                    model = %name,
                    rows,
                    requests = batch.len(),
                    %error,
                    "batch failed: running its halves apart, to fail only the requests that cause it"
                );
                // Requests whose client has gone are not run again.
                batch.retain(|p| !p.abandoned());
                compute_time
                    + match batch.len() {
                        0 => Duration::ZERO,
                        1 => self.run_isolating(batch, started),
                        n => {
                            let second = batch.split_off(n / 2);
                            self.run_isolating(batch, started) + self.run_isolating(second, started)
                        }
                    }
            }
        }
    }

    /// One engine run over the batch's joined inputs, reported to the observer; returns each request's outputs.
    fn execute(&mut self, batch: &[Pending]) -> Result<Vec<Vec<Tensor>>, BatchError> {
        let counts: Vec<usize> = batch.iter().map(|p| p.rows).collect();
        let rows: usize = counts.iter().sum();
        let sequences = self.queue.model.sequences;
        if sequences {
            let real: usize = batch.iter().map(|p| p.rows * p.seq_len).sum();
            let padded = rows * batch.iter().map(|p| p.seq_len).max().unwrap_or(0);
            self.observer.tokens_batched(real, padded);
        }
        // A batch's requests share their key, and with it which engine call serves them.
        let contract = batch.first().and_then(|p| p.contract);
        let engine = self.engine.as_mut();
        let mut run = |inputs: &[Tensor]| match contract {
            None => run_engine(&mut *engine, |e| e.run(inputs)),
            Some(c) => run_engine(&mut *engine, |e| e.run_text(c, inputs).map(|t| vec![t])),
        };
        let started = Instant::now();
        let inputs = match batch {
            [one] => Ok(Cow::Borrowed(one.inputs.as_slice())),
            _ => concat_inputs(batch, sequences).map(Cow::Owned),
        };
        let input = started.elapsed();
        let started = Instant::now();
        let result = inputs.and_then(|inputs| run(&inputs));
        let infer = started.elapsed();
        let started = Instant::now();
        let result = result.and_then(|outputs| match contract {
            None => self.split_outputs(outputs, rows, &counts),
            Some(c) => split_contract(outputs, c, self.width_of(c), rows, &counts),
        });
        let output = started.elapsed();
        let ok = result.is_ok();
        let run = BatchRun { worker: self.index, requests: batch.len(), rows, input, infer, output, ok };
        self.observer.batch_done(&run);
        result
    }

    /// The last dimension of `contract`'s output, where the model says.
    fn width_of(&self, contract: Contract) -> Option<usize> {
        self.queue.model.metadata.text.as_ref().and_then(|t| t.width(contract))
    }

    /// Checks the engine's outputs against the model's, and splits each back into the requests' rows:
    /// `result[request][output]`.
    fn split_outputs(
        &self,
        outputs: Vec<Tensor>,
        rows: usize,
        counts: &[usize],
    ) -> Result<Vec<Vec<Tensor>>, BatchError> {
        let model = &self.queue.model;
        let specs = &model.metadata.outputs;
        if outputs.len() != specs.len() {
            return Err(BatchError::Engine(format!(
                "the engine returned {} outputs, expected {}",
                outputs.len(),
                specs.len()
            )));
        }
        for (output, spec) in outputs.iter().zip(specs) {
            // The batch dimension is the batch's rows whatever the graph declares; the others are the model's.
            let fits = output.dtype() == spec.datatype
                && match model.unbatched {
                    true => spec.accepts(output.shape()),
                    false => {
                        output.shape().len() == spec.shape.len()
                            && output.rows() == rows
                            && spec
                                .row_dims()
                                .iter()
                                .zip(output.shape().get(1..).unwrap_or(&[]))
                                .all(|(&d, &n)| d < 0 || d as usize == n)
                    }
                };
            if !fits {
                return Err(BatchError::Engine(format!(
                    "the engine returned output `{}` as {} {:?} for a batch of {rows}; the model declares {} {:?}",
                    spec.name,
                    output.dtype(),
                    output.shape(),
                    spec.datatype,
                    spec.shape
                )));
            }
        }
        if model.unbatched {
            // One request, whose outputs are the engine's as they are.
            return Ok(vec![outputs]);
        }
        let mut per_request: Vec<Vec<Tensor>> = counts.iter().map(|_| Vec::with_capacity(outputs.len())).collect();
        for output in outputs {
            let pieces = output.split_rows(counts).map_err(|e| BatchError::Engine(e.to_string()))?;
            for (request, piece) in per_request.iter_mut().zip(pieces) {
                request.push(piece);
            }
        }
        Ok(per_request)
    }
}

/// Joins the batch's inputs along dim 0; token sequences are padded with zeros to the batch's longest.
fn concat_inputs(batch: &[Pending], sequences: bool) -> Result<Vec<Tensor>, BatchError> {
    let n = batch.first().map_or(0, |p| p.inputs.len());
    (0..n)
        .map(|i| {
            let parts: Vec<&Tensor> = batch.iter().map(|p| &p.inputs[i]).collect();
            let joined = if sequences { Tensor::concat_rows_padded(&parts) } else { Tensor::concat_rows(&parts) };
            joined.map_err(|e| BatchError::Engine(format!("batching inputs: {e}")))
        })
        .collect()
}

/// Checks a contract's one output, FP32 `[rows, width]` or (per token) `[rows, seq, width]`, its width `width`
/// where the model says, and splits it into the requests' rows.
fn split_contract(
    outputs: Vec<Tensor>,
    contract: Contract,
    width: Option<usize>,
    rows: usize,
    counts: &[usize],
) -> Result<Vec<Vec<Tensor>>, BatchError> {
    let [output] = <[Tensor; 1]>::try_from(outputs)
        .map_err(|o| BatchError::Engine(format!("the engine returned {} outputs for one contract", o.len())))?;
    let rank = if contract.per_token() { 3 } else { 2 };
    let shape = output.shape();
    if output.dtype() != DataType::Fp32
        || shape.len() != rank
        || output.rows() != rows
        || width.is_some_and(|w| shape.last() != Some(&w))
    {
        return Err(BatchError::Engine(format!(
            "the engine returned its {} as {} {:?} for a batch of {rows}; expected FP32 of rank {rank}{}",
            contract.as_str(),
            output.dtype(),
            shape,
            width.map(|w| format!(" and width {w}")).unwrap_or_default()
        )));
    }
    let pieces = output.split_rows(counts).map_err(|e| BatchError::Engine(e.to_string()))?;
    Ok(pieces.into_iter().map(|piece| vec![piece]).collect())
}

/// Runs `call` on the engine. An input the engine refuses as invalid is the client's fault; any other error, or a
/// panic, is the engine's.
fn run_engine(
    engine: &mut dyn Engine,
    call: impl FnOnce(&mut dyn Engine) -> inferd_core::Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>, BatchError> {
    let failed = |message: String| BatchError::Engine(message);
    match catch_unwind(AssertUnwindSafe(|| call(engine))) {
        Ok(Ok(outputs)) => Ok(outputs),
        Ok(Err(inferd_core::Error::InvalidInput(m))) => {
            Err(BatchError::InvalidInput(format!("the engine refused the input: {m}")))
        }
        Ok(Err(e)) => Err(failed(format!("the engine failed: {e}"))),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown cause".into());
            Err(failed(format!("the engine panicked: {what}")))
        }
    }
}
