//! A failing engine: a panic, an error or a refused input fails only the requests that cause it, and the worker
//! goes on.

use super::*;

#[tokio::test]
async fn a_panic_or_an_engine_error_fails_only_its_batch_with_its_kind() {
    let f = fixture(batched(8), true);
    let err = f.batcher.infer(rows(&[-1.0], 1)).await.expect_err("panicked");
    assert!(matches!(&err, BatchError::Engine(m) if m.contains("panicked: asked to panic")), "{err}");
    let err = f.batcher.infer(rows(&[-2.0], 1)).await.expect_err("failed");
    assert!(matches!(&err, BatchError::Engine(m) if m.contains("asked to fail")), "{err}");
    let err = f.batcher.infer(rows(&[-3.0], 1)).await.expect_err("refused");
    assert!(matches!(&err, BatchError::InvalidInput(m) if m.contains("-3 is not welcome")), "{err}");
    let answer = f.batcher.infer(rows(&[3.0], 1)).await.expect("the worker survived");
    assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![6.0]);
    assert_eq!(f.observed.failed_batches(), 3);
    assert_eq!(f.observed.batches(), vec![(1, false), (1, false), (1, false), (1, true)]);
}

#[tokio::test]
async fn an_input_the_engine_refuses_fails_only_its_own_request() {
    // The batcher leaves data types and shapes to the caller (the server's codec checks them against the
    // model's specs): one that does not fit reaches the engine, whose refusal answers that request alone.
    let f = fixture(batched(8), false);
    let first = hold_worker(&f, 0.0).await;
    let ints = {
        let b = f.batcher.clone();
        let ints = Tensor::from_slice(vec![1, 1], &[1i32]).expect("valid");
        tokio::spawn(async move { b.infer(InferRequest::new(vec![ints])).await })
    };
    let fine = spawn_row(&f.batcher, vec![2.0]);
    queued(&f, 3).await;
    f.gate.open();
    first.await.expect("task").expect("answered");
    let err = ints.await.expect("task").expect_err("refused");
    assert!(
        matches!(&err, BatchError::InvalidInput(m) if m.contains("engine refused") && m.contains("expected FP32")),
        "{err}"
    );
    let answer = fine.await.expect("task").expect("the fitting neighbour is answered");
    assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![4.0]);
}

#[tokio::test]
async fn a_failing_batch_fails_only_the_requests_that_cause_it() {
    let f = fixture(batched(64), false);
    let first = hold_worker(&f, 0.0).await;
    // Eight requests queue behind the busy worker and will share one batch: one panics the engine, one makes it
    // fail, one is refused as invalid input; the other five must get their answers.
    let values = [1.0, -1.0, 2.0, 3.0, -2.0, 4.0, -3.0, 5.0];
    let tasks: Vec<_> = values.iter().map(|&v| spawn_row(&f.batcher, vec![v])).collect();
    queued(&f, 9).await;
    f.gate.open();
    first.await.expect("task").expect("answered");
    for (task, v) in tasks.into_iter().zip(values) {
        let answer = task.await.expect("task");
        match v {
            -1.0 => assert!(matches!(&answer, Err(BatchError::Engine(m)) if m.contains("panicked")), "{answer:?}"),
            -2.0 => assert!(matches!(&answer, Err(BatchError::Engine(m)) if m.contains("asked to fail")), "{answer:?}"),
            -3.0 => {
                assert!(matches!(&answer, Err(BatchError::InvalidInput(m)) if m.contains("not welcome")), "{answer:?}")
            }
            v => {
                let answer = answer.expect("an innocent request is answered");
                assert_eq!(answer.outputs[0].to_vec::<f32>().expect("fp32"), vec![2.0 * v]);
            }
        }
    }
    let batches = f.observed.batches();
    assert_eq!(batches[1], (8, false), "the whole batch ran first: {batches:?}");
    // Every request was answered by a run that succeeded or that held it alone.
    let ok_rows: usize = batches.iter().filter(|(_, ok)| *ok).map(|(rows, _)| rows).sum();
    assert_eq!(ok_rows, 1 + 5, "{batches:?}");
    assert!(batches.len() <= 1 + 2 * 8, "halving, not one request at a time over and over: {batches:?}");
}
