//! A lone request of a quick model, run inline on its caller's thread on an idle worker's engine: only once the
//! model's batches have shown themselves quick, never for a slow one, and never at the cost of what queues behind
//! it, or of the running-batch record; a stop waits for it.

use super::*;

const WORKER: &str = "inferd-double-0";

/// Batches of up to 8 rows; a lone request runs inline while batches take under a millisecond.
fn quick() -> BatchingConfig {
    BatchingConfig { run_inline_under_us: 1_000, ..batched(8) }
}

fn threads(f: &Fixture) -> Vec<String> {
    f.observed.threads.lock().expect("observed").clone()
}

/// Waits until no batch runs: the worker has answered its batch, measured it, and waits for the next one.
async fn worker_waits(f: &Fixture) {
    let waits = async {
        while f.batcher.longest_running().is_some() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), waits).await.expect("the worker went back to waiting");
}

#[tokio::test]
async fn a_lone_request_runs_on_its_callers_thread_once_batches_are_known_to_be_quick() {
    let f = fixture(quick(), true);
    for value in [1.0, 2.0, 3.0] {
        let answer = f.batcher.infer(rows(&[value], 1)).await.expect("answered");
        assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![2.0 * value]);
        assert_eq!(answer.batch_rows, 1);
        worker_waits(&f).await;
    }
    // The first batch's length is not known before it runs: the worker runs it.
    let here = thread_name();
    assert_eq!(threads(&f), vec![WORKER.to_owned(), here.clone(), here]);
    assert_eq!(*f.observed.started.lock().expect("observed"), 3, "each run counted as the worker's are");
    assert_eq!(f.batcher.queue_depth(), 0);
}

#[tokio::test]
async fn a_slow_models_requests_all_go_to_its_worker() {
    let f = fixture(quick(), true);
    // 5 ms, then quick runs: the average stays above a millisecond for the next ones.
    for value in [-4.0, 1.0, 2.0] {
        f.batcher.infer(rows(&[value], 1)).await.expect("answered");
        worker_waits(&f).await;
    }
    assert_eq!(threads(&f), vec![WORKER.to_owned(); 3]);
}

#[tokio::test]
async fn answering_is_not_counted_in_a_batchs_time() {
    let f = fixture(quick(), true);
    // Each answer takes 5 ms to give, five times the limit; the runs themselves take microseconds.
    *f.observed.answering.lock().expect("observed") = Duration::from_millis(5);
    for value in [1.0, 2.0, 3.0] {
        f.batcher.infer(rows(&[value], 1)).await.expect("answered");
        worker_waits(&f).await;
    }
    let here = thread_name();
    assert_eq!(threads(&f), vec![WORKER.to_owned(), here.clone(), here], "a slow answer made the batches look slow");
}

#[tokio::test]
async fn a_request_of_many_rows_goes_to_the_worker() {
    let f = fixture(BatchingConfig { max_batch_size: 4096, ..quick() }, true);
    for _ in 0..2 {
        f.batcher.infer(rows(&[1.0], 1)).await.expect("answered");
        worker_waits(&f).await;
    }
    assert_ne!(threads(&f)[1], WORKER, "a quick one-row request ran inline");
    // A batch of one row takes microseconds: 4,096 rows at that rate a row are expected to take milliseconds.
    f.batcher.infer(rows(&[1.0; 4096], 1)).await.expect("answered");
    assert_eq!(threads(&f).last().map(String::as_str), Some(WORKER), "4,096 rows ran inline");
}

#[tokio::test]
async fn zero_runs_nothing_inline() {
    let f = fixture(BatchingConfig { run_inline_under_us: 0, ..quick() }, true);
    for value in [1.0, 2.0, 3.0] {
        f.batcher.infer(rows(&[value], 1)).await.expect("answered");
    }
    assert_eq!(threads(&f), vec![WORKER.to_owned(); 3]);
}

/// Runs one quick batch, closes the gate, and sends a lone request from a runtime thread, which runs it inline and
/// is held at the gate with the worker's engine. Returns that request's task.
async fn hold_inline(f: &Fixture) -> tokio::task::JoinHandle<Result<InferResponse, BatchError>> {
    f.batcher.infer(rows(&[1.0], 1)).await.expect("answered");
    worker_waits(f).await;
    f.gate.close();
    let mut entered = entered(&f.gate);
    let held = spawn_row(&f.batcher, vec![2.0]);
    assert_eq!(entered.recv().await, Some(1), "the lone request reached the engine");
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_queues_behind_an_inline_run_goes_to_the_worker_after_it() {
    let f = fixture(quick(), false);
    f.gate.open();
    let held = hold_inline(&f).await;
    assert!(f.batcher.longest_running().is_some(), "the inline run counts as a running batch");
    // The worker is lent: these wait in the queue, and run together once the engine is free.
    let behind: Vec<_> = [3.0, 4.0].into_iter().map(|v| spawn_row(&f.batcher, vec![v])).collect();
    queued(&f, 4).await;
    assert_eq!(f.batcher.queue_depth(), 2);
    f.gate.open();
    assert_eq!(held.await.expect("task").expect("answered").outputs[0].to_vec::<f32>().expect("fp32"), vec![4.0]);
    for (task, v) in behind.into_iter().zip([3.0, 4.0]) {
        let answer = task.await.expect("task").expect("answered");
        assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![2.0 * v]);
        assert_eq!(answer.batch_rows, 2);
    }
    let threads = threads(&f);
    assert_eq!(threads.len(), 3, "{threads:?}");
    assert_ne!(threads[1], WORKER, "the lone request ran inline");
    assert_eq!(threads[2], WORKER, "the two queued behind it ran on the worker, as one batch");
    assert_eq!(f.batcher.queue_depth(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_waits_for_an_inline_run() {
    let f = fixture(quick(), false);
    f.gate.open();
    let held = hold_inline(&f).await;
    let batcher = f.batcher.clone();
    let stopping = tokio::task::spawn_blocking(move || batcher.stop(Duration::from_secs(30)));
    // Were the stop not to wait for the loan, its threads would exit at once: the queue is empty.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stopping.is_finished(), "the stop returned while a request ran inline");
    let refused = f.batcher.infer(rows(&[5.0], 1)).await.expect_err("stopping");
    assert_eq!(refused, BatchError::Unavailable("double".into()));
    f.gate.open();
    assert!(held.await.expect("task").is_ok(), "the inline run was answered");
    assert!(stopping.await.expect("task"), "every thread finished in time");
}
