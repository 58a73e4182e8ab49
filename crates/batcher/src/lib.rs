//! inferd-batcher: admission into a bounded per-model queue, dynamic batching, and the worker threads that own
//! the engines.
//!
//! One model is one [`Batcher`]: a cheap `Clone` handle for async code, a scheduler thread that cuts batches with
//! [`policy::decide`], and one worker thread per engine instance. Requests come back on `oneshot` channels, so a
//! handler that goes away (its client disconnected) leaves a closed channel behind, and the request is dropped
//! before it costs compute.

pub mod policy;

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use inferd_core::{BatchingConfig, DataType, Engine, ModelMetadata, Tensor};
use tokio::sync::oneshot;

use crate::policy::{decide, Candidate, Decision, Policy};

/// One request's inputs.
#[derive(Debug)]
pub enum Inputs {
    /// Inputs in the order of the model's metadata, all with the same rows along dim 0. A request with more rows
    /// than `max_batch_size` is split, and its pieces batched separately. With `max_batch_size = 0` the tensors
    /// run as they are, each request alone.
    Rows(Vec<Tensor>),
    /// A text model's sequences: for each, its token inputs in the order of the model's metadata, each
    /// `[rows, seq]` with its own `seq`. Each is queued on its own, so that the policy can batch it with
    /// sequences of a similar length; the outputs come back in order.
    Sequences(Vec<Vec<Tensor>>),
}

/// One request.
#[derive(Debug)]
pub struct InferRequest {
    pub inputs: Inputs,
    /// The latest instant the request may start running; it is answered [`BatchError::DeadlineExceeded`] after.
    pub deadline: Option<Instant>,
    /// The request's span (its request id, for one): the worker thread logs what happens to the request in it,
    /// and the span of the batch that runs it follows from it.
    pub span: tracing::Span,
}

impl InferRequest {
    /// A request with no deadline, in the current span.
    pub fn new(inputs: Vec<Tensor>) -> Self {
        InferRequest { inputs: Inputs::Rows(inputs), deadline: None, span: tracing::Span::current() }
    }

    /// A text model's request of one or more sequences, with no deadline, in the current span.
    pub fn sequences(sequences: Vec<Vec<Tensor>>) -> Self {
        InferRequest { inputs: Inputs::Sequences(sequences), deadline: None, span: tracing::Span::current() }
    }

    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }
}

/// Told what the workers do: how the server feeds its metrics without this crate knowing them. Called on the
/// worker threads, so it must be quick.
pub trait BatchObserver: Send + Sync {
    /// A request entered the queue, which now holds `depth` requests waiting for a worker. Called on the
    /// caller's thread; nothing by default.
    fn request_queued(&self, depth: usize) {
        let _ = depth;
    }
    /// A request's batch starts, after `queue_time` in the queue.
    fn request_started(&self, queue_time: Duration);
    /// `rows` ran for `compute_time`; `ok` is false when the engine failed or panicked.
    fn batch_done(&self, rows: usize, compute_time: Duration, ok: bool);
    /// A text batch is about to run: `real` tokens, padded to `padded`. Nothing by default.
    fn tokens_batched(&self, real: usize, padded: usize) {
        let _ = (real, padded);
    }
}

/// The answer to one request.
#[derive(Debug)]
pub struct InferResponse {
    /// Outputs in the order of the model's metadata, with the request's rows.
    pub outputs: Vec<Tensor>,
    /// Rows in the largest batch that served this request (its own rows included).
    pub batch_rows: usize,
    /// Time spent queued before the batch started (the longest, for a split request).
    pub queue_time: Duration,
    /// Time the engine spent on the batch(es) that served this request.
    pub compute_time: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The model's queue holds `max_queue_size` requests already.
    #[error("the queue of model `{model}` is full ({max_queue_size} requests); retry later")]
    QueueFull { model: String, max_queue_size: usize },
    /// The model no longer takes requests (the server is shutting down).
    #[error("model `{0}` is not taking requests: the server is shutting down")]
    Unavailable(String),
    /// The request's deadline passed while it was queued.
    #[error("the request waited in the queue past its deadline")]
    DeadlineExceeded,
    /// The request does not fit the model, or the engine refused its input as invalid: the client's fault.
    #[error("{0}")]
    InvalidInput(String),
    /// The engine failed (or panicked) on the batch that held this request.
    #[error("{0}")]
    Engine(String),
}

/// Counters since start-up.
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: AtomicU64,
    pub batches: AtomicU64,
    pub rows: AtomicU64,
    pub failed_batches: AtomicU64,
    /// Text models: tokens of the sequences batched, and what padding made of them.
    pub tokens: AtomicU64,
    pub padded_tokens: AtomicU64,
}

/// The handle to one model's queue and workers. Cloning is cheap; when the last clone is dropped the threads
/// finish what is queued and exit.
#[derive(Clone)]
pub struct Batcher {
    shared: Arc<Shared>,
    /// Stops the threads when the last handle goes; the threads themselves hold only `shared`.
    _stop_on_drop: Arc<StopOnDrop>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("model", &self.shared.name).finish_non_exhaustive()
    }
}

/// State shared by the handles, the scheduler thread and the worker threads.
struct Shared {
    name: String,
    metadata: ModelMetadata,
    policy: Policy,
    /// A text model: inputs are token sequences, padded along dim 1 when batched.
    sequences: bool,
    /// `max_batch_size = 0`: each request runs alone, its tensors as sent (counted as one row).
    unbatched: bool,
    max_queue_size: usize,
    /// The model's own queue deadline (`timeout_ms`), if any.
    timeout: Option<Duration>,
    state: Mutex<State>,
    /// Wakes the scheduler: a request arrived, a worker took a batch, or the mode changed.
    scheduler_wake: Condvar,
    /// Wakes the workers: a batch is ready, or the threads are stopping.
    worker_wake: Condvar,
    /// Wakes `stop`: a thread exited.
    exited: Condvar,
    stats: Stats,
    observer: Option<Arc<dyn BatchObserver>>,
}

struct State {
    /// Requests not yet in a batch, in arrival order.
    queue: VecDeque<Pending>,
    /// Batches cut for an idle worker that has not picked them up yet. A batch is cut only when a worker is free
    /// to run it, so everything that arrives while the workers are busy waits in `queue` and goes into the next
    /// batch together (cutting a batch ahead, as a prefetch, made closed-loop batches alternate small and large).
    ready: VecDeque<Vec<Pending>>,
    /// Requests inside `ready`.
    ready_requests: usize,
    /// Draining: cut batches without waiting for a fuller one.
    flush: bool,
    /// No new requests; threads exit once the queue and `ready` are empty.
    stopping: bool,
    live_threads: usize,
    /// Workers waiting for a batch.
    idle_workers: usize,
    /// When each worker's running batch started; `None` while it waits.
    running: Vec<Option<Instant>>,
}

/// A queued request (or one piece of a split one).
struct Pending {
    inputs: Vec<Tensor>,
    rows: usize,
    /// Text models: the sequence length (dim 1) of its rows; 0 otherwise.
    seq_len: usize,
    /// Data types and non-batch dimensions: requests batch only with equal keys.
    key: Vec<(DataType, Vec<usize>)>,
    enqueued_at: Instant,
    deadline: Option<Instant>,
    reply: oneshot::Sender<Result<InferResponse, BatchError>>,
    /// The request's span, carried across to the worker thread.
    span: tracing::Span,
}

impl Pending {
    /// True when nobody waits for the answer any more.
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }
}

/// Each input's data type and non-batch dimensions: requests batch only with requests of an equal key.
type ShapeKey = [(DataType, Vec<usize>)];

struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.begin_stop();
    }
}

fn lock(mutex: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock cannot leave `State` half-updated in a way that matters more than
    // stopping service would; keep serving.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Batcher {
    /// Starts the scheduler and one worker thread per engine. The engines are loaded (and warmed) already;
    /// `metadata` is theirs.
    pub fn start(
        name: &str,
        config: &BatchingConfig,
        engines: Vec<Box<dyn Engine>>,
        observer: Option<Arc<dyn BatchObserver>>,
    ) -> std::io::Result<Batcher> {
        let Some(first) = engines.first() else {
            return Err(std::io::Error::other(format!("model `{name}`: no engine instance to run")));
        };
        let sequences = first.metadata().text.is_some();
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            metadata: first.metadata().clone(),
            policy: Policy::from_config(config, sequences),
            sequences,
            unbatched: config.max_batch_size == 0,
            max_queue_size: config.max_queue_size,
            timeout: (config.timeout_ms > 0).then(|| Duration::from_millis(config.timeout_ms)),
            state: Mutex::new(State {
                queue: VecDeque::new(),
                ready: VecDeque::new(),
                ready_requests: 0,
                flush: false,
                stopping: false,
                live_threads: 0,
                idle_workers: 0,
                running: vec![None; engines.len()],
            }),
            scheduler_wake: Condvar::new(),
            worker_wake: Condvar::new(),
            exited: Condvar::new(),
            stats: Stats::default(),
            observer,
        });
        let batcher = Batcher { shared: shared.clone(), _stop_on_drop: Arc::new(StopOnDrop(shared.clone())) };
        let spawn = |thread_name: String, body: Box<dyn FnOnce() + Send>| -> std::io::Result<()> {
            lock(&shared.state).live_threads += 1;
            let s = shared.clone();
            let spawned = thread::Builder::new().name(thread_name).spawn(move || {
                body();
                let mut state = lock(&s.state);
                state.live_threads -= 1;
                s.exited.notify_all();
            });
            if spawned.is_err() {
                lock(&shared.state).live_threads -= 1;
            }
            spawned.map(drop)
        };
        let s = shared.clone();
        spawn(format!("inferd-sched-{name}"), Box::new(move || s.schedule()))?;
        for (i, engine) in engines.into_iter().enumerate() {
            let s = shared.clone();
            spawn(format!("inferd-{name}-{i}"), Box::new(move || s.work(i, engine)))?;
        }
        Ok(batcher)
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn metadata(&self) -> &ModelMetadata {
        &self.shared.metadata
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// How long the longest-running batch has run so far, if a worker is running one: what tells a stalled
    /// engine from a busy one.
    pub fn longest_running(&self) -> Option<Duration> {
        let state = lock(&self.shared.state);
        state.running.iter().flatten().min().map(Instant::elapsed)
    }

    /// Requests waiting for a worker (queued, or in a batch that has not started).
    pub fn queue_depth(&self) -> usize {
        let state = lock(&self.shared.state);
        state.queue.len() + state.ready_requests
    }

    /// Queues a request and waits for its answer. A request with more rows than `max_batch_size` is split into
    /// pieces that are batched separately, as are a text request's sequences; their outputs are put back
    /// together in order.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, BatchError> {
        let shared = &self.shared;
        let pieces: Vec<Vec<Tensor>> = match request.inputs {
            Inputs::Rows(inputs) => shared.pieces(inputs)?,
            Inputs::Sequences(sequences) => {
                if sequences.is_empty() {
                    return Err(BatchError::InvalidInput("the request has no sequences".into()));
                }
                let max = shared.policy.max_batch_size;
                for sequence in &sequences {
                    let rows = shared.check(sequence)?;
                    if rows > max {
                        return Err(BatchError::InvalidInput(format!(
                            "a sequence entry of {rows} rows is more than max_batch_size ({max})"
                        )));
                    }
                }
                sequences
            }
        };
        let now = Instant::now();
        let span = request.span;
        let deadline = match (request.deadline, shared.timeout.map(|t| now + t)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let (receivers, depth) = {
            let mut state = lock(&shared.state);
            if state.stopping {
                return Err(BatchError::Unavailable(shared.name.clone()));
            }
            if state.queue.len() + state.ready_requests + pieces.len() > shared.max_queue_size {
                return Err(BatchError::QueueFull {
                    model: shared.name.clone(),
                    max_queue_size: shared.max_queue_size,
                });
            }
            let receivers: Vec<_> = pieces
                .into_iter()
                .map(|inputs| {
                    let (reply, rx) = oneshot::channel();
                    // A text model's sequences batch whatever their length: dim 1 is left out of the key.
                    let key_from = if shared.sequences { 2 } else { 1 };
                    let key =
                        inputs.iter().map(|t| (t.dtype(), t.shape().get(key_from..).unwrap_or(&[]).to_vec())).collect();
                    let rows = if shared.unbatched { 1 } else { inputs[0].rows() };
                    let seq_len = if shared.sequences { inputs[0].shape()[1] } else { 0 };
                    state.queue.push_back(Pending {
                        inputs,
                        rows,
                        seq_len,
                        key,
                        enqueued_at: now,
                        deadline,
                        reply,
                        span: span.clone(),
                    });
                    rx
                })
                .collect();
            shared.stats.requests.fetch_add(1, Ordering::Relaxed);
            // An idle worker gets its batch from here, with no hop through the scheduler thread. The scheduler
            // is woken only when it has a timer to set: a queue delay to wait out, or a deadline.
            let wait = shared.cut(&mut state, now);
            if wait.is_some() || deadline.is_some() {
                shared.scheduler_wake.notify_one();
            }
            (receivers, state.queue.len() + state.ready_requests)
        };
        if let Some(observer) = &shared.observer {
            observer.request_queued(depth);
        }

        let mut answers = Vec::with_capacity(receivers.len());
        for rx in receivers {
            // A dropped sender means a worker went away without answering: a bug, reported as an engine error.
            let answer =
                rx.await.unwrap_or_else(|_| Err(BatchError::Engine("the worker stopped without answering".into())))?;
            answers.push(answer);
        }
        if answers.len() == 1 {
            return answers.pop().ok_or_else(|| BatchError::Engine("no answer".into()));
        }
        let outputs = (0..shared.metadata.outputs.len())
            .map(|i| {
                let parts: Vec<&Tensor> = answers.iter().filter_map(|a| a.outputs.get(i)).collect();
                Tensor::concat_rows(&parts)
                    .map_err(|e| BatchError::Engine(format!("reassembling a split request: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(InferResponse {
            outputs,
            batch_rows: answers.iter().map(|a| a.batch_rows).max().unwrap_or(0),
            queue_time: answers.iter().map(|a| a.queue_time).max().unwrap_or_default(),
            compute_time: answers.iter().map(|a| a.compute_time).sum(),
        })
    }

    /// Draining: from now on batches are cut without waiting for a fuller one. Requests are still taken.
    pub fn flush(&self) {
        lock(&self.shared.state).flush = true;
        self.shared.scheduler_wake.notify_all();
    }

    /// Stops taking requests, lets the workers finish what is queued for up to `timeout`, then answers whatever
    /// is still queued with [`BatchError::Unavailable`]. Returns true if every thread finished in time. Blocks:
    /// call it from a blocking context.
    pub fn stop(&self, timeout: Duration) -> bool {
        let shared = &self.shared;
        shared.begin_stop();
        let give_up = Instant::now() + timeout;
        let mut state = lock(&shared.state);
        while state.live_threads > 0 {
            let now = Instant::now();
            if now >= give_up {
                let mut left: Vec<Pending> = state.queue.drain(..).collect();
                left.extend(state.ready.drain(..).flatten());
                state.ready_requests = 0;
                drop(state);
                for p in left {
                    let _ = p.reply.send(Err(BatchError::Unavailable(shared.name.clone())));
                }
                return false;
            }
            state = shared.exited.wait_timeout(state, give_up - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }
}

/// Splits `rows` into pieces of at most `max` rows.
fn piece_rows(rows: usize, max: usize) -> Vec<usize> {
    let mut counts = vec![max; rows / max];
    if !rows.is_multiple_of(max) {
        counts.push(rows % max);
    }
    counts
}

impl Shared {
    /// Checks a request of rows against the model's inputs, and splits it into pieces of at most
    /// `max_batch_size` rows.
    fn pieces(&self, inputs: Vec<Tensor>) -> Result<Vec<Vec<Tensor>>, BatchError> {
        let rows = self.check(&inputs)?;
        let max = self.policy.max_batch_size;
        if rows <= max || self.unbatched {
            return Ok(vec![inputs]);
        }
        let counts = piece_rows(rows, max);
        let mut split: Vec<Vec<Tensor>> = counts.iter().map(|_| Vec::with_capacity(inputs.len())).collect();
        for input in &inputs {
            let parts = input.split_rows(&counts).map_err(|e| BatchError::InvalidInput(e.to_string()))?;
            for (piece, part) in split.iter_mut().zip(parts) {
                piece.push(part);
            }
        }
        Ok(split)
    }

    /// Checks a request against the model's inputs; returns its rows (1 for a model that does not batch).
    fn check(&self, inputs: &[Tensor]) -> Result<usize, BatchError> {
        let specs = &self.metadata.inputs;
        if inputs.len() != specs.len() {
            return Err(BatchError::InvalidInput(format!(
                "model `{}` takes {} input(s), got {}",
                self.name,
                specs.len(),
                inputs.len()
            )));
        }
        for (spec, t) in specs.iter().zip(inputs) {
            if t.dtype() != spec.datatype || !spec.accepts(t.shape()) {
                return Err(BatchError::InvalidInput(format!(
                    "input `{}`: expected {} {:?}, got {} {:?}",
                    spec.name,
                    spec.datatype,
                    spec.shape,
                    t.dtype(),
                    t.shape()
                )));
            }
        }
        if self.unbatched {
            // The tensors run as sent: no dimension is shared between the inputs.
            return Ok(1);
        }
        let rows = inputs.first().map_or(0, Tensor::rows);
        if let Some((spec, t)) = specs.iter().zip(inputs).find(|(_, t)| t.rows() != rows) {
            return Err(BatchError::InvalidInput(format!(
                "input `{}` has {} rows but the first input has {rows}: every input needs the same rows",
                spec.name,
                t.rows()
            )));
        }
        if rows == 0 {
            return Err(BatchError::InvalidInput("the request has no rows".into()));
        }
        if self.sequences {
            let seq = inputs.first().and_then(|t| t.shape().get(1)).copied().unwrap_or(0);
            if seq == 0 || inputs.iter().any(|t| t.shape().get(1) != Some(&seq)) {
                return Err(BatchError::InvalidInput(
                    "a sequence needs at least one token, and every token input the same length".into(),
                ));
            }
        }
        Ok(rows)
    }

    fn begin_stop(&self) {
        let mut state = lock(&self.state);
        state.stopping = true;
        state.flush = true;
        drop(state);
        self.scheduler_wake.notify_all();
        self.worker_wake.notify_all();
    }

    /// The scheduler thread: cuts batches whenever a worker slot is free.
    fn schedule(&self) {
        let mut state = lock(&self.state);
        loop {
            let now = Instant::now();
            // Deadlines fire on time, also for requests in a batch that waits for a busy worker.
            drop_dead_requests(&mut state.queue, now);
            for batch in state.ready.iter_mut() {
                drop_dead_requests(batch, now);
            }
            state.ready.retain(|batch| !batch.is_empty());
            state.ready_requests = state.ready.iter().map(Vec::len).sum();
            if state.stopping && state.queue.is_empty() {
                break;
            }
            let mut wake_at = state.queue.iter().chain(state.ready.iter().flatten()).filter_map(|p| p.deadline).min();
            if let Some(t) = self.cut(&mut state, now) {
                wake_at = Some(wake_at.map_or(t, |w| w.min(t)));
            }
            state = match wake_at {
                Some(t) => {
                    let wait = t.saturating_duration_since(now);
                    self.scheduler_wake.wait_timeout(state, wait).unwrap_or_else(PoisonError::into_inner).0
                }
                None => self.scheduler_wake.wait(state).unwrap_or_else(PoisonError::into_inner),
            };
        }
        drop(state);
        self.worker_wake.notify_all();
    }

    /// Cuts batches from the queue for the idle workers, as the policy decides; whoever holds the lock and has
    /// just changed what a decision depends on calls it (a new request, a worker turning idle, the scheduler's
    /// timer). Returns when the policy wants to be asked again if nothing else happens.
    fn cut(&self, state: &mut State, now: Instant) -> Option<Instant> {
        while state.ready.len() < state.idle_workers {
            let candidates: Vec<Candidate<&ShapeKey>> = state
                .queue
                .iter()
                .map(|p| Candidate {
                    rows: p.rows,
                    seq_len: p.seq_len,
                    key: p.key.as_slice(),
                    enqueued_at: p.enqueued_at,
                })
                .collect();
            match decide(&candidates, &self.policy, now, state.flush) {
                Decision::Run { positions, rows, reason } => {
                    drop(candidates);
                    let batch = take_positions(&mut state.queue, &positions);
                    tracing::trace!(model = %self.name, rows, requests = batch.len(), ?reason, "batch cut");
                    state.ready_requests += batch.len();
                    state.ready.push_back(batch);
                    self.worker_wake.notify_one();
                }
                Decision::WaitUntil(t) => return Some(t),
                Decision::Idle => return None,
            }
        }
        None
    }

    /// A worker thread: owns one engine and runs a batch whenever one is cut for it.
    fn work(&self, index: usize, mut engine: Box<dyn Engine>) {
        loop {
            let batch = {
                let mut state = lock(&self.state);
                state.running[index] = None;
                state.idle_workers += 1;
                loop {
                    if let Some(batch) = state.ready.pop_front() {
                        state.ready_requests -= batch.len();
                        state.idle_workers -= 1;
                        state.running[index] = Some(Instant::now());
                        break batch;
                    }
                    if state.stopping && state.queue.is_empty() {
                        state.idle_workers -= 1;
                        // The scheduler may be asleep with no timer: let it see that there is nothing left.
                        self.scheduler_wake.notify_all();
                        return;
                    }
                    // Free now: take what is queued without waiting for the scheduler thread.
                    if self.cut(&mut state, Instant::now()).is_some() {
                        // The policy waits (a queue delay): the scheduler's timer cuts the batch when it is due.
                        self.scheduler_wake.notify_one();
                    }
                    if !state.ready.is_empty() {
                        continue;
                    }
                    state = self.worker_wake.wait(state).unwrap_or_else(PoisonError::into_inner);
                }
            };
            self.run_batch(engine.as_mut(), batch);
        }
    }

    fn run_batch(&self, engine: &mut dyn Engine, mut batch: Vec<Pending>) {
        let started = Instant::now();
        drop_dead_requests(&mut batch, started);
        if batch.is_empty() {
            return;
        }
        let rows: usize = batch.iter().map(|p| p.rows).sum();
        let span = tracing::debug_span!(parent: None, "batch", model = %self.name, rows, requests = batch.len());
        for p in &batch {
            span.follows_from(&p.span);
        }
        let _entered = span.enter();
        if let Some(observer) = &self.observer {
            for p in &batch {
                observer.request_started(started.saturating_duration_since(p.enqueued_at));
            }
        }
        self.run_isolating(engine, batch, started);
    }

    /// Runs `batch` and answers its requests. A batch that fails while holding more than one request runs again
    /// in halves, and those in halves, so that only the requests that make the engine fail (an input it refuses,
    /// a panic) get its error, and the others their outputs: a poisoned request costs about 2·log2(n) runs of
    /// smaller batches, never its neighbours' answers.
    fn run_isolating(&self, engine: &mut dyn Engine, mut batch: Vec<Pending>, started: Instant) {
        let ran = Instant::now();
        let rows: usize = batch.iter().map(|p| p.rows).sum();
        let result = self.execute(engine, &batch);
        let compute_time = ran.elapsed();
        match result {
            Ok(per_request) => {
                for (p, outputs) in batch.into_iter().zip(per_request) {
                    let queue_time = started.saturating_duration_since(p.enqueued_at);
                    tracing::debug!(
                        parent: &p.span,
                        model = %self.name,
                        batch_rows = rows,
                        queue_us = queue_time.as_micros() as u64,
                        compute_us = compute_time.as_micros() as u64,
                        "served"
                    );
                    let _ = p.reply.send(Ok(InferResponse { outputs, batch_rows: rows, queue_time, compute_time }));
                }
            }
            Err(error) if batch.len() == 1 => {
                for p in batch {
                    tracing::warn!(parent: &p.span, model = %self.name, %error, "the request failed");
                    let _ = p.reply.send(Err(error.clone()));
                }
            }
            Err(error) => {
                tracing::warn!(
                    model = %self.name,
                    rows,
                    requests = batch.len(),
                    %error,
                    "batch failed: running its halves apart, to fail only the requests that cause it"
                );
                // Requests whose client has gone are not run again.
                batch.retain(|p| !p.abandoned());
                if batch.len() < 2 {
                    if !batch.is_empty() {
                        self.run_isolating(engine, batch, started);
                    }
                    return;
                }
                let second = batch.split_off(batch.len() / 2);
                self.run_isolating(engine, batch, started);
                self.run_isolating(engine, second, started);
            }
        }
    }

    /// One engine run over the batch's joined inputs, counted; returns each request's outputs.
    fn execute(&self, engine: &mut dyn Engine, batch: &[Pending]) -> Result<Vec<Vec<Tensor>>, BatchError> {
        let started = Instant::now();
        let counts: Vec<usize> = batch.iter().map(|p| p.rows).collect();
        let rows: usize = counts.iter().sum();
        if self.sequences {
            let real: usize = batch.iter().map(|p| p.rows * p.seq_len).sum();
            let padded = rows * batch.iter().map(|p| p.seq_len).max().unwrap_or(0);
            self.stats.tokens.fetch_add(real as u64, Ordering::Relaxed);
            self.stats.padded_tokens.fetch_add(padded as u64, Ordering::Relaxed);
            if let Some(observer) = &self.observer {
                observer.tokens_batched(real, padded);
            }
        }
        let result = match batch {
            [one] => run_engine(engine, &one.inputs),
            _ => concat_inputs(batch, self.sequences).and_then(|inputs| run_engine(engine, &inputs)),
        };
        let compute_time = started.elapsed();
        let result = result.and_then(|outputs| self.split_outputs(outputs, rows, &counts));
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.rows.fetch_add(rows as u64, Ordering::Relaxed);
        if result.is_err() {
            self.stats.failed_batches.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(observer) = &self.observer {
            observer.batch_done(rows, compute_time, result.is_ok());
        }
        result
    }

    /// Splits each output back into the requests' rows: `result[request][output]`.
    fn split_outputs(
        &self,
        outputs: Vec<Tensor>,
        rows: usize,
        counts: &[usize],
    ) -> Result<Vec<Vec<Tensor>>, BatchError> {
        if outputs.len() != self.metadata.outputs.len() {
            return Err(BatchError::Engine(format!(
                "the engine returned {} outputs, expected {}",
                outputs.len(),
                self.metadata.outputs.len()
            )));
        }
        for (output, spec) in outputs.iter().zip(&self.metadata.outputs) {
            // The batch dimension is the batch's rows whatever the graph declares; the others are the model's.
            let fits = output.dtype() == spec.datatype
                && match self.unbatched {
                    true => spec.accepts(output.shape()),
                    false => {
                        output.shape().len() == spec.shape.len()
                            && output.rows() == rows
                            && spec.row_dims().iter().zip(&output.shape()[1..]).all(|(&d, &n)| d < 0 || d as usize == n)
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
        if self.unbatched {
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

/// Runs the engine. An input the engine refuses as invalid is the client's fault; any other error, or a panic,
/// is the engine's.
fn run_engine(engine: &mut dyn Engine, inputs: &[Tensor]) -> Result<Vec<Tensor>, BatchError> {
    let failed = |message: String| BatchError::Engine(message);
    match catch_unwind(AssertUnwindSafe(|| engine.run(inputs))) {
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

/// Removes the requests whose client went away, and answers those past their deadline.
fn drop_dead_requests<C>(requests: &mut C, now: Instant)
where
    C: Default + IntoIterator<Item = Pending> + FromIterator<Pending>,
    for<'a> &'a C: IntoIterator<Item = &'a Pending>,
{
    if (&*requests).into_iter().any(|p| p.abandoned() || p.expired(now)) {
        *requests = std::mem::take(requests).into_iter().filter_map(|p| answer_if_dead(p, now)).collect();
    }
}

fn answer_if_dead(p: Pending, now: Instant) -> Option<Pending> {
    if p.abandoned() {
        None
    } else if p.expired(now) {
        tracing::debug!(parent: &p.span, "the deadline passed in the queue");
        let _ = p.reply.send(Err(BatchError::DeadlineExceeded));
        None
    } else {
        Some(p)
    }
}

/// Removes the requests at `positions` (ascending) from the queue, in order.
fn take_positions(queue: &mut VecDeque<Pending>, positions: &[usize]) -> Vec<Pending> {
    let mut taken = Vec::with_capacity(positions.len());
    let mut kept = VecDeque::with_capacity(queue.len().saturating_sub(positions.len()));
    let mut next = positions.iter().peekable();
    for (i, p) in queue.drain(..).enumerate() {
        if next.peek() == Some(&&i) {
            next.next();
            taken.push(p);
        } else {
            kept.push_back(p);
        }
    }
    *queue = kept;
    taken
}

#[cfg(test)]
mod tests;
