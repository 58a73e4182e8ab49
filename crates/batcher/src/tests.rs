//! The batcher with real threads and fake engines whose every batch is recorded. Tests wait on events the
//! batcher and the engine report (a request queued, a batch reaching the engine), never on a clock.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use inferd_core::{BatchingConfig, DataType, Engine, ModelMetadata, Precision, Tensor, TensorSpec};
use tokio::sync::{mpsc, watch};

use crate::admission::piece_rows;
use crate::{BatchError, BatchObserver, BatchRun, Batcher, InferRequest, InferResponse};

mod counts;
mod failures;
mod inline;
mod worker;

/// Doubles its FP32 input `[-1, -1]`. Records each batch's values; can be held at a gate. Refuses as invalid
/// input what does not fit its input's spec, as a real engine does; panics on a value of -1, fails on -2,
/// refuses -3 as invalid input and takes 5 ms over -4.
struct Doubler {
    metadata: ModelMetadata,
    seen: Arc<Mutex<Vec<Vec<f32>>>>,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    /// Told each time a batch reaches the engine.
    entered: Mutex<Option<mpsc::UnboundedSender<usize>>>,
    /// Told each time the engine is asked to give back its cached memory.
    released: Mutex<Option<mpsc::UnboundedSender<()>>>,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.opened.notify_all();
    }

    fn close(&self) {
        *self.open.lock().expect("gate") = false;
    }

    fn wait(&self) {
        let mut open = self.open.lock().expect("gate");
        while !*open {
            open = self.opened.wait(open).expect("gate");
        }
    }
}

impl Engine for Doubler {
    fn metadata(&self) -> &ModelMetadata {
        &self.metadata
    }

    fn release_cached_memory(&mut self) {
        if let Some(tx) = self.gate.released.lock().expect("gate").as_ref() {
            let _ = tx.send(());
        }
    }

    fn run(&mut self, inputs: &[Tensor]) -> inferd_core::Result<Vec<Tensor>> {
        if let Some(tx) = self.gate.entered.lock().expect("gate").as_ref() {
            let _ = tx.send(inputs[0].rows());
        }
        self.gate.wait();
        let spec = &self.metadata.inputs[0];
        if let [input] = inputs {
            if input.dtype() != spec.datatype || !spec.accepts(input.shape()) {
                return Err(inferd_core::Error::InvalidInput(format!(
                    "expected {} {:?}, got {} {:?}",
                    spec.datatype,
                    spec.shape,
                    input.dtype(),
                    input.shape()
                )));
            }
        }
        let values = inputs[0].to_vec::<f32>()?;
        self.seen.lock().expect("seen").push(values.clone());
        if values.contains(&-1.0) {
            panic!("asked to panic");
        }
        if values.contains(&-2.0) {
            return Err(inferd_core::Error::engine("asked to fail"));
        }
        if values.contains(&-3.0) {
            return Err(inferd_core::Error::InvalidInput("-3 is not welcome".into()));
        }
        if values.contains(&-4.0) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let doubled: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
        Ok(vec![Tensor::from_slice(inputs[0].shape().to_vec(), &doubled)?])
    }
}

struct Fixture {
    batcher: Batcher,
    seen: Arc<Mutex<Vec<Vec<f32>>>>,
    gate: Arc<Gate>,
    observed: Arc<Observed>,
}

/// What the batcher told its observer: how many requests entered the queue, how many pieces started, (rows, ok)
/// per engine run, and (real, padded) tokens per text run.
#[derive(Default)]
struct Observed {
    queued: watch::Sender<usize>,
    started: Mutex<usize>,
    batches: Mutex<Vec<(usize, bool)>>,
    tokens: Mutex<Vec<(usize, usize)>>,
    /// The threads that said their worker went idle, one entry per call.
    idle: Mutex<Vec<String>>,
    /// The thread that ran each batch, in order.
    threads: Mutex<Vec<String>>,
    /// How long each answer takes to give: a stand-in for a busy machine, where waking the request's task may
    /// hand the core to another thread mid-answer.
    answering: Mutex<Duration>,
}

impl BatchObserver for Observed {
    fn request_queued(&self, _depth: usize) {
        self.queued.send_modify(|n| *n += 1);
    }

    fn request_started(&self, _queue_time: Duration) {
        *self.started.lock().expect("observed") += 1;
    }

    fn batch_done(&self, run: &BatchRun) {
        self.batches.lock().expect("observed").push((run.rows, run.ok));
        self.threads.lock().expect("observed").push(thread_name());
    }

    fn request_answered(&self, _rows: usize, _elapsed: Duration, _ok: bool) {
        let answering = *self.answering.lock().expect("observed");
        std::thread::sleep(answering);
    }

    fn tokens_batched(&self, real: usize, padded: usize) {
        self.tokens.lock().expect("observed").push((real, padded));
    }

    fn worker_idle(&self) {
        self.idle.lock().expect("observed").push(thread_name());
    }
}

/// The calling thread's name.
fn thread_name() -> String {
    std::thread::current().name().unwrap_or_default().to_owned()
}

impl Observed {
    fn batches(&self) -> Vec<(usize, bool)> {
        self.batches.lock().expect("observed").clone()
    }

    fn failed_batches(&self) -> usize {
        self.batches().iter().filter(|(_, ok)| !ok).count()
    }
}

fn fixture(batching: BatchingConfig, gate_open: bool) -> Fixture {
    let spec =
        |name: &str| TensorSpec { name: name.into(), datatype: DataType::Fp32, shape: vec![-1, -1], optional: false };
    let metadata = ModelMetadata {
        inputs: vec![spec("x")],
        outputs: vec![spec("y")],
        device: "cpu".into(),
        precision: Precision::Fp32,
        platform: "test",
        text: None,
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Gate::default());
    *gate.open.lock().expect("gate") = gate_open;
    let engine = Doubler { metadata, seen: seen.clone(), gate: gate.clone() };
    let observed = Arc::new(Observed::default());
    let batcher = Batcher::start("double", &batching, vec![Box::new(engine)], observed.clone()).expect("threads start");
    Fixture { batcher, seen, gate, observed }
}

fn entered(gate: &Gate) -> mpsc::UnboundedReceiver<usize> {
    let (tx, rx) = mpsc::unbounded_channel();
    *gate.entered.lock().expect("gate") = Some(tx);
    rx
}

fn rows(values: &[f32], cols: usize) -> InferRequest {
    InferRequest::new(vec![Tensor::from_slice(vec![values.len() / cols, cols], values).expect("valid")])
}

/// Sends a one-row request of `values` from a task of its own.
fn spawn_row(batcher: &Batcher, values: Vec<f32>) -> tokio::task::JoinHandle<Result<InferResponse, BatchError>> {
    let b = batcher.clone();
    let cols = values.len();
    tokio::spawn(async move { b.infer(rows(&values, cols)).await })
}

/// Batches of up to `max` rows, every one run by the worker: a request held at the gate inline would hold the
/// test's own thread (`tests/inline.rs` tests running inline).
fn batched(max: usize) -> BatchingConfig {
    BatchingConfig { max_batch_size: max, run_inline_under_us: 0, ..BatchingConfig::default() }
}

/// Sends a one-row request of `value` and waits until the worker holds it at the (closed) gate: from then on
/// everything sent queues behind a busy worker.
async fn hold_worker(f: &Fixture, value: f32) -> tokio::task::JoinHandle<Result<InferResponse, BatchError>> {
    let mut entered = entered(&f.gate);
    let running = spawn_row(&f.batcher, vec![value]);
    assert_eq!(entered.recv().await, Some(1), "the first batch reached the engine");
    running
}

/// Waits until `n` requests in all have entered the queue since the fixture started.
async fn queued(f: &Fixture, n: usize) {
    let mut queued = f.observed.queued.subscribe();
    queued.wait_for(|&q| q >= n).await.expect("the observer lives as long as the fixture");
}

#[tokio::test]
async fn a_lone_request_is_answered() {
    let f = fixture(batched(8), true);
    let answer = f.batcher.infer(rows(&[1.0, 2.0], 2)).await.expect("answered");
    assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![2.0, 4.0]);
    assert_eq!(answer.batch_rows, 1);
}

#[tokio::test]
async fn requests_queued_behind_a_busy_worker_share_a_batch() {
    let f = fixture(batched(64), false);
    let first = hold_worker(&f, 0.0).await;
    let rest: Vec<_> = (1..=6).map(|i| spawn_row(&f.batcher, vec![i as f32])).collect();
    queued(&f, 7).await;
    assert_eq!(f.batcher.queue_depth(), 6);
    f.gate.open();
    assert_eq!(first.await.expect("task").expect("answered").batch_rows, 1);
    let mut largest = 0;
    for (i, task) in rest.into_iter().enumerate() {
        let answer = task.await.expect("task").expect("answered");
        assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![2.0 * (i + 1) as f32]);
        largest = largest.max(answer.batch_rows);
    }
    let seen = f.seen.lock().expect("seen").clone();
    // No batch is cut while the worker is busy: the six queued requests wait together and run as one batch as
    // soon as the worker is free.
    assert_eq!(seen.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 6], "batches were {seen:?}");
    assert_eq!(largest, 6);
    assert_eq!(
        f.observed.batches(),
        seen.iter().map(|b| (b.len(), true)).collect::<Vec<_>>(),
        "the observer saw every batch"
    );
}

#[tokio::test]
async fn an_oversize_request_is_split_and_reassembled_in_order() {
    let f = fixture(batched(4), true);
    let values: Vec<f32> = (0..20).map(|v| v as f32).collect();
    let answer = f.batcher.infer(rows(&values, 2)).await.expect("answered");
    assert_eq!(answer.outputs[0].shape(), &[10, 2]);
    let expected: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
    assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), expected);
    let batch_rows: Vec<usize> = f.seen.lock().expect("seen").iter().map(|b| b.len() / 2).collect();
    assert_eq!(batch_rows, vec![4, 4, 2]);
    assert_eq!(answer.batch_rows, 4);
}

#[tokio::test]
async fn a_full_queue_refuses_at_once_and_keeps_what_it_holds() {
    let f = fixture(BatchingConfig { max_queue_size: 2, ..batched(1) }, false);
    let spawn = |v: f32| spawn_row(&f.batcher, vec![v]);
    let running = hold_worker(&f, 1.0).await;
    let waiting = [spawn(2.0), spawn(3.0)];
    queued(&f, 3).await;
    let refused = f.batcher.infer(rows(&[4.0], 1)).await.expect_err("queue is full");
    assert_eq!(refused, BatchError::QueueFull { model: "double".into(), max_queue_size: 2 });
    f.gate.open();
    assert!(running.await.expect("task").is_ok());
    for task in waiting {
        assert!(task.await.expect("task").is_ok());
    }
}

#[tokio::test]
async fn a_request_whose_caller_left_never_reaches_the_engine() {
    let f = fixture(batched(8), false);
    let running = hold_worker(&f, 1.0).await;
    let abandoned = spawn_row(&f.batcher, vec![42.0]);
    queued(&f, 2).await;
    abandoned.abort();
    assert!(abandoned.await.expect_err("aborted").is_cancelled());
    f.gate.open();
    assert!(running.await.expect("task").is_ok());
    assert!(f.batcher.infer(rows(&[5.0], 1)).await.is_ok());
    let seen = f.seen.lock().expect("seen").clone();
    assert!(!seen.iter().flatten().any(|&v| v == 42.0), "the abandoned request ran: {seen:?}");
}

#[tokio::test]
async fn a_deadline_fires_while_the_worker_is_busy() {
    let f = fixture(batched(8), false);
    let running = hold_worker(&f, 1.0).await;
    let mut late = rows(&[42.0], 1);
    late.deadline = Some(Instant::now() + Duration::from_millis(50));
    let err = tokio::time::timeout(Duration::from_secs(5), f.batcher.infer(late))
        .await
        .expect("answered while the worker was still busy");
    assert_eq!(err.expect_err("expired"), BatchError::DeadlineExceeded);
    f.gate.open();
    assert!(running.await.expect("task").is_ok());
    assert!(!f.seen.lock().expect("seen").iter().flatten().any(|&v| v == 42.0));
}

#[tokio::test]
async fn shapes_batch_apart_and_all_are_answered() {
    let f = fixture(batched(64), false);
    let first = hold_worker(&f, 0.0).await;
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let b = f.batcher.clone();
            let cols = if i % 2 == 0 { 2 } else { 3 };
            let values: Vec<f32> = (0..cols).map(|c| (10 * i + c) as f32).collect();
            tokio::spawn(async move { (values.clone(), b.infer(rows(&values, cols)).await) })
        })
        .collect();
    queued(&f, 7).await;
    f.gate.open();
    assert!(first.await.expect("task").is_ok());
    for task in tasks {
        let (values, answer) = task.await.expect("task");
        let doubled: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
        assert_eq!(answer.expect("answered").outputs[0].to_vec::<f32>().expect("fp32"), doubled);
    }
}

#[tokio::test]
async fn a_queue_delay_gathers_requests_into_one_batch() {
    let f = fixture(BatchingConfig { max_queue_delay_us: 300_000, ..batched(8) }, true);
    let tasks: Vec<_> = (0..3).map(|i| spawn_row(&f.batcher, vec![i as f32])).collect();
    for task in tasks {
        assert_eq!(task.await.expect("task").expect("answered").batch_rows, 3);
    }
}

#[tokio::test]
async fn stop_finishes_queued_work_then_refuses() {
    let f = fixture(BatchingConfig { max_queue_delay_us: 10_000_000, ..batched(8) }, true);
    let tasks: Vec<_> = (0..3).map(|i| spawn_row(&f.batcher, vec![i as f32])).collect();
    queued(&f, 3).await;
    let b = f.batcher.clone();
    let stopped = tokio::task::spawn_blocking(move || b.stop(Duration::from_secs(5))).await.expect("join");
    assert!(stopped, "threads exited in time");
    for task in tasks {
        assert!(task.await.expect("task").is_ok(), "queued work finished without waiting for the 10 s delay");
    }
    let err = f.batcher.infer(rows(&[1.0], 1)).await.expect_err("stopped");
    assert_eq!(err, BatchError::Unavailable("double".into()));
}

#[tokio::test]
async fn a_stop_that_times_out_answers_what_is_left() {
    let f = fixture(batched(1), false);
    let spawn = |v: f32| spawn_row(&f.batcher, vec![v]);
    let running = hold_worker(&f, 1.0).await;
    let waiting = [spawn(2.0), spawn(3.0)];
    queued(&f, 3).await;
    let b = f.batcher.clone();
    let stopped = tokio::task::spawn_blocking(move || b.stop(Duration::from_millis(50))).await.expect("join");
    assert!(!stopped, "the engine is still held at the gate");
    for task in waiting {
        assert_eq!(task.await.expect("task").expect_err("left"), BatchError::Unavailable("double".into()));
    }
    f.gate.open();
    assert!(running.await.expect("task").is_ok(), "the running batch still finishes");
}

#[tokio::test]
async fn bad_requests_are_refused_before_they_queue() {
    let f = fixture(batched(8), true);
    let none = InferRequest::new(vec![]);
    assert!(matches!(f.batcher.infer(none).await, Err(BatchError::InvalidInput(m)) if m.contains("takes 1 input")));
    let empty = InferRequest::new(vec![Tensor::from_slice::<f32>(vec![0, 1], &[]).expect("valid")]);
    assert!(matches!(f.batcher.infer(empty).await, Err(BatchError::InvalidInput(m)) if m.contains("no rows")));
    assert_eq!(f.seen.lock().expect("seen").len(), 0);
    assert_eq!(*f.observed.queued.borrow(), 0, "nothing was queued");
    assert_eq!(f.observed.batches(), vec![], "nothing reached the engine");
}

#[test]
fn pieces_cover_the_rows() {
    assert_eq!(piece_rows(10, 4), vec![4, 4, 2]);
    assert_eq!(piece_rows(8, 4), vec![4, 4]);
    assert_eq!(piece_rows(3, 4), vec![3]);
}

#[tokio::test]
async fn without_batching_each_request_runs_alone_as_sent() {
    let f = fixture(batched(0), false);
    let first = hold_worker(&f, 0.0).await;
    // Queued behind a busy worker, requests of different shapes and rows: none is joined with another, and
    // none is split, however many rows it has.
    let a = spawn_row(&f.batcher, vec![1.0, 2.0, 3.0]);
    let b = {
        let b = f.batcher.clone();
        tokio::spawn(async move { b.infer(rows(&(0..200).map(|v| v as f32).collect::<Vec<_>>(), 2)).await })
    };
    queued(&f, 3).await;
    f.gate.open();
    first.await.expect("task").expect("answered");
    let a = a.await.expect("task").expect("answered");
    assert_eq!(a.outputs[0].shape(), &[1, 3]);
    assert_eq!(a.outputs[0].to_vec::<f32>().expect("fp32"), vec![2.0, 4.0, 6.0]);
    let b = b.await.expect("task").expect("answered");
    assert_eq!(b.outputs[0].shape(), &[100, 2], "100 rows in one run: nothing splits them");
    let sizes: Vec<usize> = f.seen.lock().expect("seen").iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![1, 3, 200]);
    assert!(f.observed.batches().iter().all(|&(rows, ok)| rows == 1 && ok), "{:?}", f.observed.batches());
}

#[tokio::test]
async fn without_batching_what_does_not_fit_is_refused_as_invalid_input() {
    // Shapes are the caller's to check; a tensor that does not fit reaches the engine as sent, and its refusal
    // is the client's fault.
    let f = fixture(batched(0), true);
    let three_dims = InferRequest::new(vec![Tensor::from_slice(vec![1, 1, 2], &[1.0f32, 2.0]).expect("valid")]);
    let err = f.batcher.infer(three_dims).await.expect_err("a rank-3 tensor for a rank-2 input");
    assert!(matches!(&err, BatchError::InvalidInput(m) if m.contains("expected FP32 [-1, -1]")), "{err}");
    let none = InferRequest::new(vec![]);
    let err = f.batcher.infer(none).await.expect_err("no input for a model of one");
    assert!(matches!(&err, BatchError::InvalidInput(m) if m.contains("takes 1 input")), "{err}");
}
