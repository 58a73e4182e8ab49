//! The inference path with a fake engine: a request through the task and the batcher and back, and what it
//! refuses before anything queues.

use std::sync::Arc;

use inferd_models::{Input, Request, TextInput, Texts};

use super::*;
use crate::error::ErrorKind;
use crate::testing::{loaded_state, model_folder};

fn setup(args: &[&str]) -> (tempfile::TempDir, AppState, Arc<LoadedModel>) {
    let repo = tempfile::tempdir().expect("tempdir");
    model_folder(repo.path(), "echo", "");
    let state = loaded_state(repo.path(), args);
    let model = state.registry().resolve("echo", None).expect("found").serving().expect("loaded");
    (repo, state, model)
}

fn rows(values: &[f32]) -> Request {
    let tensor = Tensor::from_slice(vec![values.len() / 2, 2], values).expect("tensor");
    Request::new(Input::Tensors(vec![Some(tensor)]))
}

#[tokio::test]
async fn a_request_runs_through_the_task_and_the_batcher_and_holds_its_tensors_while_it_runs() {
    let (_repo, state, model) = setup(&[]);
    let hold = state.budget().hold();
    let served = infer(&state, &model, rows(&[1.0, 2.0, 3.0, 4.0]), &hold).await.expect("served");
    assert_eq!(served.answer.tensors[0].to_vec::<f32>().expect("values"), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!((served.batch_rows, served.answer.tokens), (2, 0));
    assert_eq!(state.budget().held_bytes(), 1024, "16 bytes of tensors, held in whole KiB until answered");
    drop(hold);
    assert_eq!(state.budget().held_bytes(), 0);
    let headers = served.headers();
    assert_eq!(headers[BATCH_SIZE_HEADER], "2");
    assert!(headers.contains_key(QUEUE_TIME_HEADER) && headers.contains_key(COMPUTE_TIME_HEADER));
}

#[tokio::test]
async fn non_finite_inputs_and_the_wrong_form_are_the_clients_fault_naming_the_model() {
    let (_repo, state, model) = setup(&[]);
    let hold = state.budget().hold();
    let error = infer(&state, &model, rows(&[1.0, f32::NAN]), &hold).await.expect_err("refused");
    assert_eq!(error.kind, ErrorKind::BadRequest);
    assert!(error.message.starts_with("model `echo`: input `x` holds NaN at element 1"), "{}", error.message);
    let text = Request::new(Input::Texts(TextInput::new(Texts::Strings(vec!["hi".into()]))));
    let error = infer(&state, &model, text, &hold).await.expect_err("refused");
    assert_eq!(error.message, "model `echo`: it takes and gives tensors: it takes no text");
    assert_eq!(state.budget().held_bytes(), 0, "a refused request holds nothing");

    let (_repo, lenient, model) = setup(&["--allow-non-finite"]);
    let served = infer(&lenient, &model, rows(&[1.0, f32::NAN]), &lenient.budget().hold()).await.expect("passes");
    assert!(served.answer.tensors[0].to_vec::<f32>().expect("values")[1].is_nan());
}

#[tokio::test]
async fn a_request_past_its_deadline_before_its_preparation_is_answered_without_it() {
    let (_repo, state, model) = setup(&[]);
    let hold = state.budget().hold();
    let past = std::time::Instant::now().checked_sub(std::time::Duration::from_millis(1));
    // Its NaN would be refused by the preparation: the deadline answers first, and the preparation never runs.
    let error = infer(&state, &model, rows(&[1.0, f32::NAN]).with_deadline(past), &hold).await.expect_err("late");
    assert_eq!(error.kind, ErrorKind::DeadlineExceeded, "{}", error.message);
    assert_eq!(error.message, "model `echo`: the request waited for a core to prepare it past its deadline");
    assert_eq!(state.budget().held_bytes(), 0, "a late request holds nothing");
    let later = deadline_in(std::time::Duration::from_secs(60));
    let served = infer(&state, &model, rows(&[1.0, 2.0]).with_deadline(later), &hold).await.expect("in time");
    assert_eq!(served.answer.tensors[0].to_vec::<f32>().expect("values"), [1.0, 2.0]);
}

#[tokio::test]
async fn decoded_tensors_past_the_in_flight_budget_are_refused_before_they_queue() {
    let (_repo, state, model) = setup(&["--max-inflight-bytes", "2048"]);
    let hold = state.budget().hold();
    let error = infer(&state, &model, rows(&vec![0.0; 1024]), &hold).await.expect_err("4 KiB of 2");
    assert_eq!(error.kind, ErrorKind::PayloadTooLarge, "{}", error.message);
    assert_eq!(
        state
            .registry()
            .resolve("echo", None)
            .expect("echo")
            .counts()
            .map(|c| c.requests.load(std::sync::atomic::Ordering::Relaxed)),
        Some(0)
    );
}

/// Large CPU work runs at most one piece per core at once, whatever the number of requests that bring it, a dropped
/// request's work among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_work_runs_no_more_pieces_at_once_than_there_are_cores() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let piece = |running: Arc<AtomicUsize>, most: Arc<AtomicUsize>| {
        move || {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(20));
            running.fetch_sub(1, Ordering::SeqCst);
        }
    };
    // A request that goes away while its work waits or runs.
    let dropped = tokio::spawn(off_runtime_if(true, piece(running.clone(), most.clone())));
    tokio::task::yield_now().await;
    dropped.abort();
    let all: Vec<_> =
        (0..4 * cores).map(|_| tokio::spawn(off_runtime_if(true, piece(running.clone(), most.clone())))).collect();
    for task in all {
        task.await.expect("joined").expect("ran");
    }
    assert!(
        (1..=cores).contains(&most.load(Ordering::SeqCst)),
        "{} at once on {cores} cores",
        most.load(Ordering::SeqCst)
    );
}

#[test]
fn outputs_are_scanned_as_they_are_written_only_where_nothing_else_would_scan_them() {
    use crate::codec::shm::{MemoryRegion, MemoryRegions, Span, SpanParameters};
    let regions = MemoryRegions(vec![("r".into(), MemoryRegion::new(vec![0; 64]))]);
    let span = |size| {
        let given = SpanParameters { region: Some("r"), byte_size: Some(size), offset: None };
        Span::of(given, &regions, "output `y`").expect("fits")
    };
    let wanted = |memory| vec![Wanted { index: 0, binary: true, memory, finite: false }];
    // Whether the request came back marked to skip the scan after the engine.
    let marked = |state: &AppState, model: &LoadedModel, outputs: &mut [Wanted], classes: &[(usize, usize)]| {
        let request = scan_outputs_on_write(state, model, rows(&[1.0, 2.0]), outputs, classes);
        request.options.get::<OutputsScannedOnWrite>().is_some()
    };
    let (_repo, state, model) = setup(&[]);
    // The echo model's one output, in shared memory: scanned as it is written.
    let mut outputs = wanted(span(16));
    assert!(marked(&state, &model, &mut outputs, &[]));
    assert!(outputs[0].finite);
    // In the answer, or asked as classes: scanned after the engine, as ever.
    for (mut outputs, classes) in [(wanted(None), vec![]), (wanted(span(16)), vec![(0, 1)])] {
        assert!(!marked(&state, &model, &mut outputs, &classes));
        assert!(!outputs[0].finite);
    }
    // Not asked at all (an engine output the client left out): scanned after the engine.
    assert!(!marked(&state, &model, &mut [], &[]));
    // In a GPU's memory (CUDA shared memory): scanned after the engine, then copied whole, where a scan as it is
    // written would copy it to the device a block at a time.
    let gpu = MemoryRegions(vec![("gpu".into(), MemoryRegion::device(vec![0; 64]))]);
    let given = SpanParameters { region: Some("gpu"), byte_size: Some(16), offset: None };
    let mut outputs = wanted(Span::of(given, &gpu, "output `y`").expect("fits"));
    assert!(!marked(&state, &model, &mut outputs, &[]));
    assert!(!outputs[0].finite);
    // Non-finite numbers allowed: scanned nowhere.
    let (_repo, lenient, model) = setup(&["--allow-non-finite"]);
    let mut outputs = wanted(span(16));
    assert!(!marked(&lenient, &model, &mut outputs, &[]));
    assert!(!outputs[0].finite);
}
