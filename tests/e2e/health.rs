//! /health and the probes, with a fake GPU, without one, and with a model that cannot load.

use std::sync::Arc;

use inferd_server::FakeGpuProbe;
use inferd_tests::{h100, heldout, Repo, TestServer};
use serde_json::json;

#[tokio::test]
async fn health_reports_a_gpu_and_the_models() {
    let repo = Repo::new().bundled("digits").bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &[], Some(Arc::new(FakeGpuProbe(vec![h100()])))).await;
    let (status, h) = server.health().await;
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["status"], "healthy");
    assert_eq!(h["gpu_available"], true);
    assert_eq!(h["gpu_name"], "NVIDIA H100 80GB HBM3");
    let gpu = &h["gpus"][0];
    assert_eq!(gpu["index"], 0);
    assert_eq!(gpu["uuid"], "GPU-5c1d7e0a-0000-4000-8000-000000000000");
    assert_eq!(gpu["memory_total_bytes"], 85_520_809_984u64);
    assert_eq!(gpu["memory_used_bytes"], 1_073_741_824u64);
    assert_eq!(gpu["memory_free_bytes"], 84_447_068_160u64);
    assert_eq!(gpu["utilization_percent"], 37);
    assert_eq!(gpu["compute_capability"], "9.0");
    assert_eq!(gpu["driver_version"], "580.65.06");
    assert_eq!(h["version"], env!("CARGO_PKG_VERSION"));
    let models = h["models"].as_array().expect("models");
    assert_eq!(models.len(), 2);
    for (m, (name, backend)) in models.iter().zip([("digits", "onnx"), ("digits-candle", "candle")]) {
        assert_eq!(m["name"], name);
        assert_eq!(m["backend"], backend);
        assert_eq!(m["ready"], true);
        // The fake GPU is only reported: engines see no CUDA in this build, so the models run on the CPU.
        assert_eq!(m["device"], "cpu");
        assert_eq!(m["precision"], "fp32");
        assert_eq!(m["queue_depth"], 0);
    }
    let r = server.client.get(server.url("/health/ready")).send().await.expect("answers");
    assert_eq!(r.status(), 200);
    let r = server.client.get(server.url("/health/live")).send().await.expect("answers");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn health_without_a_gpu_is_healthy_on_the_cpu() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let (status, h) = server.health().await;
    assert_eq!(status, 200);
    assert_eq!(h["status"], "healthy");
    assert_eq!(h["gpu_available"], false);
    assert_eq!(h["gpu_name"], serde_json::Value::Null);
    assert_eq!(h["gpus"], json!([]));
}

#[tokio::test]
async fn a_required_gpu_that_is_missing_degrades_and_fails_readiness() {
    let repo = Repo::new().bundled("digits-candle");
    for probe in [None, Some(Arc::new(FakeGpuProbe(vec![h100()])) as Arc<dyn inferd_server::GpuProbe>)] {
        let with_gpu = probe.is_some();
        let server = TestServer::ready(repo.path(), &["--require-gpu"], probe).await;
        let (status, h) = server.health().await;
        assert_eq!(status, 503);
        assert_eq!(h["status"], "degraded");
        let reason = h["reason"].as_str().expect("a reason");
        let expected = if with_gpu { "model `digits-candle` runs on cpu" } else { "none is visible" };
        assert!(reason.contains(expected), "{reason}");
        let r = server.client.get(server.url("/health/ready")).send().await.expect("answers");
        assert_eq!(r.status(), 503);
        // Degraded still serves.
        let r = server.post_json("/predict", &json!({ "input": [heldout().pixels[0]] })).await;
        assert_eq!(r.status(), 200);
    }
}

#[tokio::test]
async fn probes_answer_while_models_load() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::start(repo.path(), &[], None).await;
    // Whatever the moment, live answers 200, and ready answers 200 only once the model is loaded.
    let r = server.client.get(server.url("/health/live")).send().await.expect("answers");
    assert_eq!(r.status(), 200);
    let (status, h) = server.health().await;
    assert!(matches!((status, h["status"].as_str()), (200, Some("healthy")) | (503, Some("starting"))), "{h}");
    server.wait_loaded().await;
    let r = server.client.get(server.url("/health/ready")).send().await.expect("answers");
    assert_eq!(r.status(), 200);
}
