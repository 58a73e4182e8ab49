//! Operations: metrics, request ids, API keys, limits, deadlines and the overall timeout, with the real engines
//! where the figures come from them and a held engine where a test needs a slow one.

use std::sync::Arc;
use std::time::Instant;

use inferd_server::FakeGpuProbe;
use inferd_tests::{
    h100, heldout, row_body, Gate, HeldEngine, Repo, TestServer, HOLD, REQUEST_ID_HEADER, TIMEOUT_HEADER,
};
use serde_json::json;

const REQUESTS: &str = "inferd_requests_total";

#[tokio::test]
async fn metrics_exist_from_the_start_and_follow_the_traffic() {
    let repo = Repo::new().bundled("digits").bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &[], Some(Arc::new(FakeGpuProbe(vec![h100()])))).await;
    let before = server.metrics().await;
    for model in ["digits", "digits-candle"] {
        let m = [("model", model)];
        for protocol in ["predict", "v2"] {
            for code in ["200", "400", "401", "404", "413", "429", "500", "503"] {
                assert_eq!(before.value(REQUESTS, &[("model", model), ("protocol", protocol), ("code", code)]), 0.0);
            }
            let mp = [("model", model), ("protocol", protocol)];
            assert_eq!(before.value("inferd_requests_in_flight", &mp), 0.0);
            assert_eq!(before.value("inferd_request_duration_seconds_count", &mp), 0.0);
        }
        for histogram in ["inferd_queue_duration_seconds", "inferd_compute_duration_seconds", "inferd_batch_size_rows"]
        {
            assert_eq!(before.value(&format!("{histogram}_count"), &m), 0.0, "{histogram}");
        }
        assert_eq!(before.value("inferd_batch_failures_total", &m), 0.0);
        assert_eq!(before.value("inferd_queue_depth", &m), 0.0);
        assert_eq!(before.value("inferd_model_ready", &m), 1.0);
    }
    let gpu = [("gpu", "0"), ("name", "NVIDIA H100 80GB HBM3")];
    assert_eq!(before.value("inferd_gpus", &[]), 1.0);
    assert_eq!(before.value("inferd_gpu_memory_total_bytes", &gpu), 85_520_809_984.0);
    assert_eq!(before.value("inferd_gpu_memory_used_bytes", &gpu), 1_073_741_824.0);
    assert!((before.value("inferd_gpu_utilization_ratio", &gpu) - 0.37).abs() < 1e-9);
    assert_eq!(before.value("inferd_gpu_temperature_celsius", &gpu), 41.0);
    let rss = before.value("process_resident_memory_bytes", &[]);
    assert!(rss > 1e6, "resident memory {rss}");

    let data = heldout();
    for i in 0..5 {
        let r =
            server.post_json("/models/digits/predict", &json!({ "input": [data.pixels[i], data.pixels[i + 5]] })).await;
        assert_eq!(r.status(), 200);
    }
    let v2 = json!({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": data.pixels[0]}]});
    assert_eq!(server.post_json("/v2/models/digits-candle/infer", &v2).await.status(), 200);
    assert_eq!(server.post("/models/digits/predict", "{").await.status(), 400);
    assert_eq!(server.post_json("/models/nope/predict", &json!({})).await.status(), 404);

    let after = server.metrics().await;
    let digits = [("model", "digits"), ("protocol", "predict")];
    assert_eq!(after.value(REQUESTS, &[digits[0], digits[1], ("code", "200")]), 5.0);
    assert_eq!(after.value(REQUESTS, &[digits[0], digits[1], ("code", "400")]), 1.0);
    assert_eq!(after.value(REQUESTS, &[("model", "digits-candle"), ("protocol", "v2"), ("code", "200")]), 1.0);
    // A model the server does not have is counted without its name, so clients cannot mint series.
    assert_eq!(after.value(REQUESTS, &[("model", ""), ("protocol", "predict"), ("code", "404")]), 1.0);
    assert_eq!(after.value("inferd_request_duration_seconds_count", &digits), 6.0);
    assert!(after.value("inferd_request_duration_seconds_sum", &digits) > 0.0);
    let m = [("model", "digits")];
    assert_eq!(after.value("inferd_queue_duration_seconds_count", &m), 5.0);
    assert_eq!(after.value("inferd_batch_size_rows_sum", &m), 10.0, "five requests of two rows");
    let batches = after.value("inferd_batch_size_rows_count", &m);
    assert!((1.0..=5.0).contains(&batches), "{batches} batches");
    assert_eq!(after.value("inferd_compute_duration_seconds_count", &m), batches);
    // The model's one worker ran every batch: its busy time is the engine time of them all.
    let worker = [("model", "digits"), ("instance", "0")];
    assert_eq!(after.value("inferd_worker_busy_seconds_count", &worker), batches);
    let busy = after.value("inferd_worker_busy_seconds_sum", &worker);
    assert!((busy - after.value("inferd_compute_duration_seconds_sum", &m)).abs() < 1e-9, "{busy}");
    assert_eq!(after.value("inferd_batch_size_rows_bucket", &[("model", "digits"), ("le", "+Inf")]), batches);
    assert_eq!(after.value("inferd_requests_in_flight", &digits), 0.0);
}

#[tokio::test]
async fn a_request_id_is_echoed_or_made() {
    let repo = Repo::new().bundled("digits");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let body = json!({ "input": [heldout().pixels[0]] }).to_string();
    let r = server
        .client
        .post(server.url("/predict"))
        .header(REQUEST_ID_HEADER, "client-chosen-42")
        .body(body.clone())
        .send()
        .await
        .expect("answered");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[REQUEST_ID_HEADER], "client-chosen-42");
    let mut made = Vec::new();
    for path in ["/predict", "/predict", "/nope"] {
        let r = server.post(path, body.clone()).await;
        let id = r.headers().get(REQUEST_ID_HEADER).expect("an id on every answer").to_str().expect("ASCII").to_owned();
        assert_eq!(id.len(), 36, "a UUID: {id}");
        assert_eq!(id.as_bytes()[14], b'4', "a random (version 4) UUID: {id}");
        made.push(id);
    }
    assert!(made[0] != made[1] && made[1] != made[2], "{made:?}");
}

#[tokio::test]
async fn api_keys_guard_inference_but_not_the_probes() {
    let repo = Repo::new().bundled("digits");
    let server = TestServer::ready(repo.path(), &["--api-key", "s3cret-key"], None).await;
    let body = json!({ "input": [heldout().pixels[0]] }).to_string();
    let send = |auth: Option<&'static str>, path: &'static str| {
        let mut request = server.client.post(server.url(path)).body(body.clone());
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        request.send()
    };
    for (auth, path, want) in [
        (None, "/predict", 401),
        (Some("Bearer wrong-key"), "/predict", 401),
        (Some("Bearer s3cret-key-and-more"), "/predict", 401),
        (Some("Basic s3cret-key"), "/predict", 401),
        (Some("Bearer s3cret-key"), "/predict", 200),
        (Some("bearer s3cret-key"), "/models/digits/predict", 200),
        (None, "/v2/repository/index", 401),
        (Some("Bearer s3cret-key"), "/v2/repository/index", 200),
    ] {
        let r = send(auth, path).await.expect("answered");
        assert_eq!(r.status(), want, "{auth:?} {path}");
        if want == 401 {
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            let e: serde_json::Value = r.json().await.expect("a JSON error");
            assert!(e["error"].as_str().is_some_and(|m| m.contains("API key")), "{e}");
        }
    }
    assert_eq!(server.client.get(server.url("/v2/models/digits")).send().await.expect("answered").status(), 401);
    for open in ["/health", "/health/live", "/health/ready", "/v2/health/live", "/v2/health/ready", "/metrics"] {
        let r = server.client.get(server.url(open)).send().await.expect("answered");
        assert_eq!(r.status(), 200, "{open} needs no key");
    }
    let m = server.metrics().await;
    assert_eq!(m.value(REQUESTS, &[("model", "digits"), ("protocol", "predict"), ("code", "401")]), 4.0);

    let guarded = TestServer::ready(repo.path(), &["--api-key", "s3cret-key", "--protect-metrics"], None).await;
    let r = guarded.client.get(guarded.url("/metrics")).send().await.expect("answered");
    assert_eq!(r.status(), 401);
    let r = guarded.client.get(guarded.url("/metrics")).bearer_auth("s3cret-key").send().await.expect("answered");
    assert_eq!(r.status(), 200);
    assert_eq!(guarded.client.get(guarded.url("/health/ready")).send().await.expect("answered").status(), 200);
}

#[tokio::test]
async fn each_limit_answers_a_clear_4xx() {
    let repo = Repo::new().bundled("digits");
    let args = ["--max-rows", "4", "--max-elements", "200", "--max-json-depth", "4", "--max-body-bytes", "200000"];
    let server = TestServer::ready(repo.path(), &args, None).await;
    let row = heldout().pixels[0].clone();
    let rows = |n: usize| json!({ "input": vec![row.clone(); n] });
    assert_eq!(server.post_json("/predict", &rows(3)).await.status(), 200, "192 elements, 3 rows");
    for (body, code, needle) in [
        (rows(4), 413, "--max-elements"),
        (rows(5), 413, "--max-rows"),
        (json!({"inputs": {"input": rows(1)["input"]}, "x": [[[[1]]]]}), 400, "--max-json-depth"),
        (json!({"input": [[[[[0.0]]]]]}), 400, "--max-json-depth"),
    ] {
        let r = server.post_json("/predict", &body).await;
        assert_eq!(r.status(), code, "{body}");
        let e: serde_json::Value = r.json().await.expect("a JSON error");
        assert!(e["error"].as_str().is_some_and(|m| m.contains(needle)), "{e}");
    }
    let v2 = |n: usize| json!({"inputs": [{"name": "input", "shape": [n, 64], "datatype": "FP32", "data": vec![row.clone(); n].concat()}]});
    assert_eq!(server.post_json("/v2/models/digits/infer", &v2(3)).await.status(), 200);
    assert_eq!(server.post_json("/v2/models/digits/infer", &v2(5)).await.status(), 413);
    let deep = json!({"parameters": {"a": {"b": {"c": {"d": 1}}}}, "inputs": []});
    assert_eq!(server.post_json("/v2/models/digits/infer", &deep).await.status(), 400);
    assert_eq!(server.post("/predict", vec![b' '; 200_001]).await.status(), 413);
    // Refusals cost nothing: the server still answers.
    assert_eq!(server.post_json("/predict", &rows(1)).await.status(), 200);
}

/// A repository of one model named `held`, run by [`HeldEngine`]s.
fn held_repo(edit: impl FnOnce(String) -> String) -> Repo {
    Repo::new().model("held", "digits", edit)
}

#[tokio::test]
async fn a_deadline_fires_while_the_worker_is_busy() {
    let gate = Arc::new(Gate::default());
    let repo = held_repo(|t| t);
    let server = TestServer::with_engines(repo.path(), &[], HeldEngine::builder(gate.clone())).await;
    let busy = {
        let (client, url) = (server.client.clone(), server.url("/predict"));
        tokio::spawn(async move { client.post(url).body(row_body(HOLD)).send().await })
    };
    gate.wait_held(1).await;
    let started = Instant::now();
    let r = server
        .client
        .post(server.url("/predict"))
        .header(TIMEOUT_HEADER, "100")
        .body(row_body(42.0))
        .send()
        .await
        .expect("answered");
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let e: serde_json::Value = r.json().await.expect("a JSON error");
    assert!(e["error"].as_str().is_some_and(|m| m.contains("deadline")), "{e}");
    assert!(!busy.is_finished(), "answered while the worker is still busy, after {:?}", started.elapsed());
    // The v2 timeout parameter (microseconds) fires the same way.
    let v2 = json!({"parameters": {"timeout": 100_000},
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": vec![43.0f32; 64]}]});
    assert_eq!(server.post_json("/v2/models/held/infer", &v2).await.status(), 503);
    assert!(!busy.is_finished());
    let bad = server.client.post(server.url("/predict")).header(TIMEOUT_HEADER, "soon").body(row_body(1.0));
    assert_eq!(bad.send().await.expect("answered").status(), 400);
    gate.open();
    assert_eq!(busy.await.expect("task").expect("answered").status(), 200);
    let seen = gate.seen.lock().expect("seen").clone();
    assert!(!seen.contains(&42.0) && !seen.contains(&43.0), "an expired request ran: {seen:?}");
}

#[tokio::test]
async fn the_overall_timeout_answers_503_and_frees_the_handler() {
    let gate = Arc::new(Gate::default());
    let repo = held_repo(|t| t);
    let server =
        TestServer::with_engines(repo.path(), &["--request-timeout", "0.3"], HeldEngine::builder(gate.clone())).await;
    let r = server.post("/predict", row_body(HOLD)).await;
    assert_eq!(r.status(), 503);
    let e: serde_json::Value = r.json().await.expect("a JSON error");
    assert!(e["error"].as_str().is_some_and(|m| m.contains("--request-timeout")), "{e}");
    let m = server.metrics().await;
    assert_eq!(m.value("inferd_requests_in_flight", &[("model", "held"), ("protocol", "predict")]), 0.0);
    assert_eq!(m.value(REQUESTS, &[("model", "held"), ("protocol", "predict"), ("code", "503")]), 1.0);
    gate.open();
    assert_eq!(server.post("/predict", row_body(1.0)).await.status(), 200);
}
