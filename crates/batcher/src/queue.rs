//! One model's queue: admission (the checks and the split into pieces are [`crate::admission`]'s), the one
//! function that cuts batches, and the sweeps of requests whose caller left or whose deadline passed.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use inferd_core::text::Contract;
use inferd_core::{BatchingConfig, DataType, Tensor};
use tokio::sync::oneshot;

use crate::admission;
use crate::policy::{decide, Candidate, Decision, Policy};
use crate::request::{BatchError, InferRequest, InferResponse, Inputs};
use crate::Model;

pub(crate) use self::lending::{Admitted, Inline};
use self::lending::{INLINE_PAUSE, LENT_RECHECK};
pub(crate) use self::sweep::drop_dead_requests;
use self::sweep::take_positions;

mod lending;
mod sweep;

/// Where one queued piece's answer arrives.
pub(crate) type Answer = oneshot::Receiver<Result<InferResponse, BatchError>>;

/// One model's queue, shared by the [`crate::Batcher`] handles, the scheduler thread and the worker threads.
///
/// It alone cuts batches: requests leave `queue` for a batch only in [`Queue::cut`], under the lock. `cut` has
/// three triggers, each on the thread that has just changed what the decision depends on:
/// 1. [`Queue::admit`], on the caller's thread: a request arrived. An idle worker gets its batch from here, with
///    no hop through the scheduler thread; a hop would cost a wake-up and a context switch per request.
/// 2. [`Queue::next_batch`], on a worker thread: the worker turned idle and takes what is queued.
/// 3. [`Queue::run_timer`], on the scheduler thread: a queue delay or a deadline came due, or the mode changed
///    (flush, stop). It is woken only when it has a timer to set, so the request path does not pay for it.
///
/// One mutex (`state`) and two condvars:
/// - `work_ready`: idle workers wait on it in `next_batch`. One worker is notified per batch `cut` makes (one
///   batch, one worker; `admit` notifies once it has let the lock go), and a stop notifies them all.
/// - `control`: the scheduler thread waits on it for its timer, and [`Queue::stop`] for the threads to exit.
///   Notified when the scheduler has a timer to set (`cut` wants to wait for a queue delay, or a request carries
///   a deadline), on flush and stop, and when a thread exits. It is always `notify_all`, so that the scheduler
///   and `stop` never take each other's wake-up; that costs the request path nothing, since `stop` waits only
///   after `stopping` is set, when no request is taken any more, and until then the scheduler is its only
///   waiter (waking all of one waiter is waking one).
///
/// The workers keep a condvar of their own because they must be woken one per batch: sharing theirs with the
/// scheduler would need `notify_all` on every cut, waking every idle worker and the scheduler per request.
pub(crate) struct Queue {
    /// Fixed at start, read by everyone.
    pub(crate) model: Model,
    policy: Policy,
    max_queue_size: usize,
    /// The model's own queue deadline (`timeout_ms`), if any.
    timeout: Option<Duration>,
    /// How long a worker waits for a batch before it gives back its engine's cached memory
    /// (`release_after_idle_ms`); `None` for never.
    pub(crate) release_after_idle: Option<Duration>,
    /// A lone request runs inline, on its caller's thread, while batches take under this
    /// (`run_inline_under_us`); `None` for never (a GPU model's engine stays on its own thread).
    inline_under: Option<Duration>,
    /// How long the model's batches take, and their rows each, moving averages in nanoseconds; `u64::MAX` until
    /// the first batch has run.
    batch_ns: AtomicU64,
    row_ns: AtomicU64,
    state: Mutex<State>,
    work_ready: Condvar,
    control: Condvar,
}

/// What the lock guards; who changes each field is noted on it.
struct State {
    /// Requests (or pieces) not yet in a batch, in arrival order. `admit` pushes, only `cut` takes, the
    /// scheduler's sweep answers the expired, and a stop that gives up answers the rest.
    queue: VecDeque<Pending>,
    /// Batches cut for an idle worker that has not picked them up yet: `cut` pushes, `next_batch` pops. A batch
    /// is cut only when a worker is free to run it, so everything that arrives while the workers are busy waits
    /// in `queue` and goes into the next batch together (cutting a batch ahead, as a prefetch, made closed-loop
    /// batches alternate small and large).
    ready: VecDeque<Vec<Pending>>,
    /// Requests inside `ready`, kept with it by whoever changes it.
    ready_requests: usize,
    /// Draining: cut batches without waiting for a fuller one. Set by `flush` and `begin_stop`, never cleared.
    flush: bool,
    /// No new requests; threads exit once the queue and `ready` are empty. Set by `begin_stop`, never cleared.
    stopping: bool,
    /// Threads started and not yet returned: counted by `spawn`, waited for by `stop`.
    live_threads: usize,
    /// Which workers are waiting in `next_batch`: `cut` cuts no more batches than they number, less those lent to
    /// callers, and only they are lent.
    waiting: Vec<bool>,
    /// Workers whose engine is lent to a caller running a lone request inline ([`Queue::admit`]). A lent worker
    /// stays waiting in `next_batch` (idle, yet given no batch) until the loan ends, so that its engine is free.
    lent: Vec<bool>,
    /// No request runs inline before this: one came while another ran inline, so requests overlap, and the worker
    /// batches them. Set by `admit`.
    inline_paused_until: Option<Instant>,
    /// When each worker's running batch started; `None` while it waits. Each worker sets its own slot.
    running: Vec<Option<Instant>>,
}

/// A queued request (or one piece of a split one).
pub(crate) struct Pending {
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) rows: usize,
    /// Text models: the sequence length (dim 1) of its rows; 0 otherwise.
    pub(crate) seq_len: usize,
    /// Requests batch only with equal keys, which is what lets their inputs be joined and one engine call serve
    /// them all.
    key: BatchKey,
    /// Which engine call serves it: the model's outputs, or a text engine's contract.
    pub(crate) contract: Option<Contract>,
    pub(crate) enqueued_at: Instant,
    deadline: Option<Instant>,
    pub(crate) reply: oneshot::Sender<Result<InferResponse, BatchError>>,
    /// The request's span, carried across to the worker thread.
    pub(crate) span: tracing::Span,
}

impl Pending {
    /// True when nobody waits for the answer any more.
    pub(crate) fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }
}

impl State {
    /// Workers lent to callers now.
    fn loans(&self) -> usize {
        self.lent.iter().filter(|&&lent| lent).count()
    }

    /// Workers waiting in `next_batch` now.
    fn idle_workers(&self) -> usize {
        self.waiting.iter().filter(|&&waiting| waiting).count()
    }
}

/// What a worker is to do next.
pub(crate) enum Next {
    Batch(Vec<Pending>),
    /// No batch came while it waited as long as it was told to.
    Idle,
    /// The queue is stopping and empty: the worker exits.
    Stop,
}

/// What requests must share to share a batch: each input's data type and non-batch dimensions, and which engine
/// call serves them.
#[derive(Debug, PartialEq, Eq)]
struct BatchKey {
    shapes: Vec<(DataType, Vec<usize>)>,
    contract: Option<Contract>,
}

impl Queue {
    pub(crate) fn new(model: Model, config: &BatchingConfig, workers: usize) -> Self {
        let inline_under = (config.run_inline_under_us > 0 && !model.metadata.on_gpu())
            .then(|| Duration::from_micros(config.run_inline_under_us));
        Queue {
            policy: Policy::from_config(config, model.sequences),
            model,
            max_queue_size: config.max_queue_size,
            timeout: (config.timeout_ms > 0).then(|| Duration::from_millis(config.timeout_ms)),
            release_after_idle: (config.release_after_idle_ms > 0)
                .then(|| Duration::from_millis(config.release_after_idle_ms)),
            inline_under,
            batch_ns: AtomicU64::new(u64::MAX),
            row_ns: AtomicU64::new(u64::MAX),
            state: Mutex::new(State {
                queue: VecDeque::new(),
                ready: VecDeque::new(),
                ready_requests: 0,
                flush: false,
                stopping: false,
                live_threads: 0,
                waiting: vec![false; workers],
                lent: vec![false; workers],
                inline_paused_until: None,
                running: vec![None; workers],
            }),
            work_ready: Condvar::new(),
            control: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave `State` half-updated in a way that matters more than
        // stopping service would; keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a named thread that [`Queue::stop`] waits for until `body` returns.
    pub(crate) fn spawn(self: &Arc<Self>, name: String, body: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        self.lock().live_threads += 1;
        let queue = self.clone();
        let spawned = thread::Builder::new().name(name).spawn(move || {
            body();
            queue.lock().live_threads -= 1;
            queue.control.notify_all();
        });
        if spawned.is_err() {
            self.lock().live_threads -= 1;
        }
        spawned.map(drop)
    }

    /// Checks and queues a request, in pieces of at most `max_batch_size` rows (a text request: one piece per
    /// sequence), and cuts a batch if a worker is idle.
    ///
    /// A lone request whose batch would hold it alone, of a CPU model whose batches take under
    /// `run_inline_under_us`, is not handed to the worker: the idle worker's engine is lent to the caller, who runs
    /// the batch on its own thread ([`Admitted::inline`]); the loan ends as that handle drops. That spares the
    /// worker's wake-up and the caller's, which cost a small model more than its run (benches/README.md, "Running a
    /// lone request inline").
    pub(crate) fn admit(&self, request: InferRequest) -> Result<Admitted<'_>, BatchError> {
        let text = self.model.metadata.text.as_ref();
        match (request.contract, text) {
            (Some(c), Some(text)) if !text.serves(c) => {
                return Err(BatchError::InvalidInput(format!(
                    "model `{}` gives no {}: its engine has none",
                    self.model.name,
                    c.as_str()
                )))
            }
            (Some(c), None) => {
                return Err(BatchError::InvalidInput(format!(
                    "model `{}` takes tensors: it gives no {}",
                    self.model.name,
                    c.as_str()
                )))
            }
            _ => {}
        }
        let pieces = match request.inputs {
            Inputs::Rows(inputs) => admission::pieces(&self.model, self.policy.max_batch_size, inputs)?,
            Inputs::Sequences(sequences) => admission::sequences(&self.model, self.policy.max_batch_size, sequences)?,
        };
        let now = Instant::now();
        let span = request.span;
        let contract = request.contract;
        let deadline = match (request.deadline, self.timeout.map(|t| now + t)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let model = &self.model;
        let mut state = self.lock();
        if state.stopping {
            return Err(BatchError::Unavailable(model.name.clone()));
        }
        if state.queue.len() + state.ready_requests + pieces.len() > self.max_queue_size {
            return Err(BatchError::QueueFull { model: model.name.clone(), max_queue_size: self.max_queue_size });
        }
        if state.loans() > 0 {
            // Requests overlap: they batch better on the worker than one by one inline.
            state.inline_paused_until = Some(now + INLINE_PAUSE);
        }
        // A text model's sequences batch whatever their length: dim 1 is left out of the key.
        let key_from = if model.sequences { 2 } else { 1 };
        let answers: Vec<Answer> = pieces
            .into_iter()
            .map(|inputs| {
                let (reply, answer) = oneshot::channel();
                let key = BatchKey {
                    shapes: inputs
                        .iter()
                        .map(|t| (t.dtype(), t.shape().get(key_from..).unwrap_or(&[]).to_vec()))
                        .collect(),
                    contract,
                };
                let rows = if model.unbatched { 1 } else { inputs.first().map_or(1, Tensor::rows) };
                let seq_len = match model.sequences {
                    true => inputs.first().and_then(|t| t.shape().get(1)).copied().unwrap_or(0),
                    false => 0,
                };
                state.queue.push_back(Pending {
                    inputs,
                    rows,
                    seq_len,
                    key,
                    contract,
                    enqueued_at: now,
                    deadline,
                    reply,
                    span: span.clone(),
                });
                answer
            })
            .collect();
        // Trigger 1 of `cut`. The scheduler is woken only when it has a timer to set: a queue delay to wait out,
        // or a deadline.
        let (wait, cut) = self.cut(&mut state, now);
        let inline = if cut == 1 && answers.len() == 1 { self.lend(&mut state, now) } else { None };
        // A batch lent to the caller wakes nobody.
        let cut = if inline.is_some() { 0 } else { cut };
        let depth = state.queue.len() + state.ready_requests;
        let lent = state.loans() > 0;
        // Woken after the lock is let go, a worker takes its batch at once instead of waking only to wait for the
        // lock its waker still holds (benches/README.md, "digits, an empty POST beside it, and waking the worker").
        drop(state);
        self.wake_workers(cut, lent);
        if wait.is_some() || deadline.is_some() {
            self.control.notify_all();
        }
        Ok(Admitted { answers, depth, inline })
    }

    /// Cuts batches from the queue for the idle workers, as the policy decides. The only place batches are cut;
    /// see [`Queue`] for its three triggers. Returns when the policy wants to be asked again if nothing else
    /// happens, and how many batches it cut: the caller wakes one worker for each.
    fn cut(&self, state: &mut State, now: Instant) -> (Option<Instant>, usize) {
        let mut cut = 0;
        while state.ready.len() + state.loans() < state.idle_workers() {
            let candidates: Vec<Candidate<&BatchKey>> = state
                .queue
                .iter()
                .map(|p| Candidate { rows: p.rows, seq_len: p.seq_len, key: &p.key, enqueued_at: p.enqueued_at })
                .collect();
            match decide(&candidates, &self.policy, now, state.flush) {
                Decision::Run { positions, rows, reason } => {
                    drop(candidates);
                    let batch = take_positions(&mut state.queue, &positions);
                    tracing::trace!(model = %self.model.name, rows, requests = batch.len(), ?reason, "batch cut");
                    state.ready_requests += batch.len();
                    state.ready.push_back(batch);
                    cut += 1;
                }
                Decision::WaitUntil(t) => return (Some(t), cut),
                Decision::Idle => return (None, cut),
            }
        }
        (None, cut)
    }

    /// Wakes `n` idle workers, one per batch cut for them; all of them while a worker is `lent`, which would not
    /// take the batch its wake-up was for.
    fn wake_workers(&self, n: usize, lent: bool) {
        if lent && n > 0 {
            self.work_ready.notify_all();
            return;
        }
        for _ in 0..n {
            self.work_ready.notify_one();
        }
    }

    /// Worker `worker` has finished its batch (or starts): waits for the next one, cutting it itself when it can.
    /// With `idle_until`, it waits no later than that: [`Next::Idle`] if no batch came by then.
    pub(crate) fn next_batch(&self, worker: usize, idle_until: Option<Instant>) -> Next {
        let mut state = self.lock();
        state.running[worker] = None;
        state.waiting[worker] = true;
        loop {
            if state.lent[worker] {
                // Its engine is lent to a caller running a request inline: it takes nothing, not even a stop or its
                // idle release, until the loan ends; it looks again now and then once its release is due, since
                // the loan's end wakes nobody when nothing is queued.
                let left = idle_until.map(|until| until.saturating_duration_since(Instant::now()).max(LENT_RECHECK));
                state = match left {
                    Some(left) => self.work_ready.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0,
                    None => self.work_ready.wait(state).unwrap_or_else(PoisonError::into_inner),
                };
                continue;
            }
            if let Some(batch) = state.ready.pop_front() {
                state.ready_requests -= batch.len();
                state.waiting[worker] = false;
                state.running[worker] = Some(Instant::now());
                return Next::Batch(batch);
            }
            if state.stopping && state.queue.is_empty() {
                state.waiting[worker] = false;
                // The scheduler may be asleep with no timer: let it see that there is nothing left.
                self.control.notify_all();
                return Next::Stop;
            }
            // Trigger 2 of `cut`: free now, take what is queued without waiting for the scheduler thread.
            let (wait, cut) = self.cut(&mut state, Instant::now());
            if wait.is_some() {
                // The policy waits (a queue delay): the scheduler's timer cuts the batch when it is due.
                self.control.notify_all();
            }
            // This worker takes one of the batches; the others are for workers asleep. (A notification with no
            // one asleep is still a system call: none is made for the batch this worker takes itself.)
            self.wake_workers(cut.saturating_sub(1), state.loans() > 0);
            if !state.ready.is_empty() {
                continue;
            }
            match idle_until {
                None => state = self.work_ready.wait(state).unwrap_or_else(PoisonError::into_inner),
                Some(until) => {
                    let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                        // Not idle while away: `cut` cuts nothing for this worker until it asks again. Its release
                        // counts as running, so that a release that hangs shows as a stalled worker.
                        state.waiting[worker] = false;
                        state.running[worker] = Some(Instant::now());
                        return Next::Idle;
                    };
                    state = self.work_ready.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
                }
            }
        }
    }

    /// The scheduler thread: answers deadlines on time and cuts the batches that waited for a queue delay.
    pub(crate) fn run_timer(&self) {
        let mut state = self.lock();
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
            // Trigger 3 of `cut`.
            let (wait, cut) = self.cut(&mut state, now);
            self.wake_workers(cut, state.loans() > 0);
            if let Some(t) = wait {
                wake_at = Some(wake_at.map_or(t, |w| w.min(t)));
            }
            state = match wake_at {
                Some(t) => {
                    let wait = t.saturating_duration_since(now);
                    self.control.wait_timeout(state, wait).unwrap_or_else(PoisonError::into_inner).0
                }
                None => self.control.wait(state).unwrap_or_else(PoisonError::into_inner),
            };
        }
        drop(state);
        self.work_ready.notify_all();
    }

    /// Draining: from now on batches are cut without waiting for a fuller one.
    pub(crate) fn flush(&self) {
        self.lock().flush = true;
        self.control.notify_all();
    }

    /// No new requests; the threads finish what is queued and exit.
    pub(crate) fn begin_stop(&self) {
        let mut state = self.lock();
        state.stopping = true;
        state.flush = true;
        drop(state);
        self.control.notify_all();
        self.work_ready.notify_all();
    }

    /// [`Queue::begin_stop`], then waits up to `timeout` for every thread to exit; if they do not, answers what is
    /// still queued with [`BatchError::Unavailable`]. True if they did.
    pub(crate) fn stop(&self, timeout: Duration) -> bool {
        self.begin_stop();
        let give_up = Instant::now() + timeout;
        let mut state = self.lock();
        while state.live_threads > 0 {
            let now = Instant::now();
            if now >= give_up {
                let mut left: Vec<Pending> = state.queue.drain(..).collect();
                left.extend(state.ready.drain(..).flatten());
                state.ready_requests = 0;
                drop(state);
                for p in left {
                    let _ = p.reply.send(Err(BatchError::Unavailable(self.model.name.clone())));
                }
                return false;
            }
            state = self.control.wait_timeout(state, give_up - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }

    /// Requests (or pieces) waiting for a worker: queued, or in a batch that has not started.
    pub(crate) fn depth(&self) -> usize {
        let state = self.lock();
        state.queue.len() + state.ready_requests
    }

    /// How long the longest-running batch has run so far, if a worker is running one.
    pub(crate) fn longest_running(&self) -> Option<Duration> {
        self.lock().running.iter().flatten().min().map(Instant::elapsed)
    }
}
