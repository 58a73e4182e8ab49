//! What callers hand the batcher and get back: requests, answers, errors, and the observer told what happens.

use std::time::{Duration, Instant};

use inferd_core::text::Contract;
use inferd_core::Tensor;

/// One request's inputs. They fit the model's specs (data types, ranks, fixed dimensions): the caller checks
/// them, as the server's codec does while decoding. The batcher checks only what it needs to batch them.
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
///
/// The batcher does not check the inputs' data types and shapes against the model's specs again: the caller
/// gives inputs that fit them. It refuses only what would stop it from batching: a wrong number of inputs,
/// inputs whose rows disagree, no rows, and (text models) token inputs that are not `[rows, seq]` of one `seq`.
/// Anything else that does not fit is the engine's to refuse, and failure isolation answers that refusal to
/// this request alone.
#[derive(Debug)]
pub struct InferRequest {
    pub inputs: Inputs,
    /// The latest instant the request may start running; it is answered [`BatchError::DeadlineExceeded`] after.
    pub deadline: Option<Instant>,
    /// The request's span (its request id, for one): the worker thread logs what happens to the request in it,
    /// and the span of the batch that runs it follows from it.
    pub span: tracing::Span,
    /// A text model's request: which of its engine's outputs it wants ([`inferd_core::Engine::run_text`]); it
    /// batches only with requests that want the same. `None`: the model's outputs ([`inferd_core::Engine::run`]).
    pub contract: Option<Contract>,
    /// How a text request's answer comes back: one output per sequence, as its batch left it (per-token outputs
    /// are padded to each batch's longest sequence, so they cannot be joined), or the sequences' rows joined.
    pub pieces: Pieces,
}

impl InferRequest {
    /// A request with no deadline, in the current span.
    pub fn new(inputs: Vec<Tensor>) -> Self {
        InferRequest {
            inputs: Inputs::Rows(inputs),
            deadline: None,
            span: tracing::Span::current(),
            contract: None,
            pieces: Pieces::Joined,
        }
    }

    /// A text model's request of one or more sequences for `contract`, with no deadline, in the current span; its
    /// rows come back joined.
    pub fn sequences(sequences: Vec<Vec<Tensor>>, contract: Contract) -> Self {
        InferRequest {
            inputs: Inputs::Sequences(sequences),
            deadline: None,
            span: tracing::Span::current(),
            contract: Some(contract),
            pieces: Pieces::Joined,
        }
    }

    pub fn with_deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Answers one output per sequence rather than the rows joined (see [`InferRequest::pieces`]).
    pub fn with_pieces_apart(mut self) -> Self {
        self.pieces = Pieces::Apart;
        self
    }
}

/// How a request split into pieces (a text request's sequences) is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pieces {
    /// Each output joined from the pieces' rows, in order.
    Joined,
    /// The pieces' outputs one after the other, each as its batch gave it.
    Apart,
}

/// The answer to one request.
#[derive(Debug)]
pub struct InferResponse {
    /// Outputs in the order of the model's metadata, with the request's rows (a contract's one output; with
    /// [`Pieces::Apart`], one per piece).
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
    /// The request cannot be batched as sent, or the engine refused its input as invalid: the client's fault.
    #[error("{0}")]
    InvalidInput(String),
    /// The engine failed (or panicked) on the batch that held this request.
    #[error("{0}")]
    Engine(String),
}

/// Told what the batcher does: the one source of its counts, from which the server feeds both `/health` and
/// `/metrics` without this crate knowing either. Each event is reported once, where it happens; the methods are
/// called on the batcher's threads (and `request_queued` on the caller's), so they must be quick.
pub trait BatchObserver: Send + Sync {
    /// A request entered the queue, which now holds `depth` requests (or pieces of requests) waiting for a
    /// worker. Called once per request, however many pieces it was split into, on the caller's thread; nothing
    /// by default.
    fn request_queued(&self, depth: usize) {
        let _ = depth;
    }
    /// A request's batch starts, after `queue_time` in the queue: once for each piece of a split request.
    fn request_started(&self, queue_time: Duration);
    /// One engine run ended. Called once per run, also for the reruns that isolate a failure.
    fn batch_done(&self, run: &BatchRun);
    /// A request (or a piece of a split one) of `rows` rows was answered, `elapsed` after it was queued: with
    /// its outputs when `ok`, else with its engine's error. Nothing by default.
    fn request_answered(&self, rows: usize, elapsed: Duration, ok: bool) {
        let _ = (rows, elapsed, ok);
    }
    /// A text batch is about to run: `real` tokens, padded to `padded`. Once per run; nothing by default.
    fn tokens_batched(&self, real: usize, padded: usize) {
        let _ = (real, padded);
    }
    /// A worker has run no batch for `release_after_idle_ms` and its engine has given back its cached memory.
    /// Called on that worker's thread, once per idle spell, so that what the process keeps per thread (its
    /// allocator's cache) can be given back there too; nothing by default.
    fn worker_idle(&self) {}
}

/// One engine run, as its observer hears of it: who ran what, and how long each step took (Triton's compute input,
/// infer and output).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchRun {
    /// The worker that ran it: the model's instance, from 0.
    pub worker: usize,
    /// The requests (or pieces of split ones) in the batch, and their rows.
    pub requests: usize,
    pub rows: usize,
    /// Joining the requests' inputs into the batch's (a batch of one request takes its inputs as they are).
    pub input: Duration,
    /// The engine's run.
    pub infer: Duration,
    /// Checking the engine's outputs against the model and splitting them into the requests'.
    pub output: Duration,
    /// False when the engine failed or panicked, or its outputs did not fit the model.
    pub ok: bool,
}

impl BatchRun {
    /// The three steps together.
    pub fn compute_time(&self) -> Duration {
        self.input + self.infer + self.output
    }
}

/// An observer for callers that count nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl BatchObserver for NoObserver {
    fn request_started(&self, _queue_time: Duration) {}

    fn batch_done(&self, _run: &BatchRun) {}
}
