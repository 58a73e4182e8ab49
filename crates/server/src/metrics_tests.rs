use inferd_batcher::{BatchObserver, BatchRun};

use super::*;

/// The `_count` of `model`'s request-duration histogram over `/predict`, from the exposition text.
fn predict_count(text: &str, model: &str) -> Option<u64> {
    let prefix = format!("{}_count{{model=\"{model}\",protocol=\"predict\"}} ", names::REQUEST_DURATION);
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok())
}

#[test]
fn upkeep_folds_samples_into_buckets_without_losing_any() {
    let metrics = Metrics::new(&["m"]);
    for i in 0..1000 {
        metrics.request_done("m", Protocol::Predict, 200, Duration::from_micros(i));
        if i % 300 == 0 {
            metrics.upkeep();
        }
    }
    metrics.upkeep();
    let text = metrics.render([], &[]);
    assert_eq!(predict_count(&text, "m"), Some(1000), "{text}");
    // Folded samples stay counted across later upkeeps and renders.
    metrics.upkeep();
    metrics.request_done("m", Protocol::Predict, 200, Duration::from_millis(1));
    assert_eq!(predict_count(&metrics.render([], &[]), "m"), Some(1001));
}

#[test]
fn a_model_that_stops_holding_memory_reports_none_rather_than_its_last_figures() {
    let metrics = Metrics::new(&["m"]);
    let gauge = |text: &str, name: &str| {
        let prefix = format!("{name}{{model=\"m\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).map(str::to_owned)
    };
    let held = ModelMemory { weight_bytes: Some(5000), device_bytes: Some(7000) };
    let text = metrics.render([("m", 0, Some(held))], &[]);
    assert_eq!(gauge(&text, names::MODEL_WEIGHTS).as_deref(), Some("5000"), "{text}");
    assert_eq!(gauge(&text, names::MODEL_DEVICE_MEMORY).as_deref(), Some("7000"), "{text}");
    let text = metrics.render([("m", 0, None)], &[]);
    assert_eq!(gauge(&text, names::MODEL_WEIGHTS).as_deref(), Some("0"), "unloaded: {text}");
    assert_eq!(gauge(&text, names::MODEL_DEVICE_MEMORY).as_deref(), Some("0"), "unloaded: {text}");
}

#[test]
fn each_worker_reports_its_busy_time() {
    let metrics = Metrics::new(&["m"]);
    let batches = metrics.batch_metrics("m", 2);
    let run = |worker, rows, infer, ok| BatchRun { worker, requests: 1, rows, infer, ok, ..BatchRun::default() };
    batches.batch_done(&run(1, 8, Duration::from_millis(250), true));
    batches.batch_done(&run(1, 8, Duration::from_millis(500), false));
    batches.batch_done(&run(0, 1, Duration::from_millis(100), true));
    batches.batch_done(&run(7, 1, Duration::from_secs(9), true));
    metrics.upkeep();
    let text = metrics.render([], &[]);
    let sum = |instance: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{}_sum{{", names::WORKER_BUSY)))
            .find(|l| l.contains(&format!("instance=\"{instance}\"")) && l.contains("model=\"m\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(sum("0"), Some(0.1), "{text}");
    assert_eq!(sum("1"), Some(0.75), "{text}");
    assert_eq!(sum("7"), None, "a worker the model does not have: {text}");
}
