//! Models as users export them, and the repository while serving: warm-up that fits the model, graphs without a
//! batch dimension, the readiness policy, Triton's model control (load, reload, unload) and numbered versions.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use inferd_tests::{add_to_tensor, heldout, prediction_rows, set_toml, workspace, Gate, HeldEngine, Repo, TestServer};
use serde_json::{json, Value};

/// `n` images of `[3, h, w]`, each pixel `value`.
fn images(n: usize, h: usize, w: usize, value: f32) -> Value {
    json!({ "input": vec![vec![vec![vec![value; w]; h]; 3]; n] })
}

/// The answer's status and JSON body (`null` when empty, as a successful load's is).
async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let body = r.bytes().await.expect("a body");
    (status, if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).expect("a JSON answer") })
}

async fn get(server: &TestServer, path: &str) -> (u16, Value) {
    json_of(server.client.get(server.url(path)).send().await.expect("answers")).await
}

/// The `/health` entry of `model`.
async fn model_health(server: &TestServer, model: &str) -> Value {
    let (_, h) = server.health().await;
    h["models"].as_array().expect("models").iter().find(|m| m["name"] == model).expect("listed").clone()
}

fn without_warmup(toml: String) -> String {
    toml.split("\n[warmup").next().expect("the text before [warmup]").to_owned()
}

#[tokio::test]
async fn a_graph_with_dynamic_height_and_width_warms_at_configured_shapes_and_serves_any_even_size() {
    let repo = Repo::new().test_model("detector");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let m = model_health(&server, "detector").await;
    assert_eq!((m["ready"].clone(), m["warmed"].clone()), (json!(true), json!(true)), "{m}");
    for (h, w) in [(64, 64), (32, 96)] {
        let (status, body) = json_of(server.post_json("/models/detector/predict", &images(2, h, w, 1.0)).await).await;
        assert_eq!(status, 200, "{h}x{w}: {body}");
        let out = &body["prediction"];
        assert_eq!((out.as_array().map(Vec::len), out[0][0].as_array().map(Vec::len)), (Some(2), Some(h)));
        // Channel 0 is the first input channel plus the first pooled one: 1 + 1.
        assert_eq!(out[1][0][h - 1][w - 1], 2.0, "{h}x{w}");
    }
}

#[tokio::test]
async fn without_warm_up_shapes_the_model_serves_unwarmed_instead_of_failing_on_a_guess() {
    let repo = Repo::new().copy_test_model("detector", without_warmup);
    let server = TestServer::ready(repo.path(), &[], None).await;
    let (status, h) = server.health().await;
    assert_eq!((status, h["status"].clone()), (200, json!("healthy")), "{h}");
    let m = model_health(&server, "detector").await;
    assert_eq!((m["ready"].clone(), m["warmed"].clone()), (json!(true), json!(false)), "{m}");
    let (status, body) = json_of(server.post_json("/models/detector/predict", &images(1, 16, 16, 0.5)).await).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_configured_warm_up_that_fails_is_a_load_failure_with_its_message() {
    let repo =
        Repo::new().copy_test_model("detector", |t| t.replace("shape = [1, 3, 64, 64]", "shape = [1, 3, 33, 33]"));
    let server = TestServer::ready(repo.path(), &[], None).await;
    let m = model_health(&server, "detector").await;
    assert_eq!(m["state"], "failed", "{m}");
    let error = m["error"].as_str().expect("why");
    assert!(error.contains("warm-up with inputs of shapes [[1, 3, 33, 33]]"), "{error}");
    assert!(error.contains("Concat"), "ONNX Runtime's own words follow: {error}");
    let repo = Repo::new().copy_test_model("detector", |t| t.replace("inputs.images", "inputs.image"));
    let server = TestServer::ready(repo.path(), &[], None).await;
    let error = model_health(&server, "detector").await["error"].as_str().expect("why").to_owned();
    assert!(error.contains("warmup.inputs.image: the model has no such input"), "{error}");
}

#[tokio::test]
async fn a_fixed_batch_graph_runs_each_request_alone_as_sent() {
    let repo = Repo::new().test_model("fixed-batch");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let m = model_health(&server, "fixed-batch").await;
    assert_eq!((m["ready"].clone(), m["max_batch_size"].clone()), (json!(true), json!(0)), "{m}");
    let (_, config) = get(&server, "/v2/models/fixed-batch/config").await;
    assert_eq!(config["max_batch_size"], 0);
    assert_eq!(config["input"][0]["dims"], json!([1, 4]), "Triton's dims of a model without a batch: all of them");
    assert_eq!(config["instance_group"][0]["count"], 2);
    // Sixteen clients at once, on two instances: each request runs alone.
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let client = server.client.clone();
            let url = server.url("/models/fixed-batch/predict");
            tokio::spawn(async move {
                let x = i as f64;
                let r = client.post(url).body(json!({ "input": [[x, 1.0, 0.0, 0.0]] }).to_string()).send().await;
                let r = r.expect("answers");
                let batch = r.headers()[inferd_tests::BATCH_SIZE_HEADER].to_str().expect("a header").to_owned();
                let (status, body) = json_of(r).await;
                (x, status, batch, body)
            })
        })
        .collect();
    for task in tasks {
        let (x, status, batch, body) = task.await.expect("task");
        assert_eq!((status, batch.as_str()), (200, "1"), "{body}");
        // y = x W + b with W = [[1, -1], [2, 0], [0, 3], [-1, 1]], b = [0.5, -0.5].
        assert_eq!(body["prediction"], json!([[x + 2.0 + 0.5, -x - 0.5]]));
    }
    let (status, body) =
        json_of(server.post_json("/models/fixed-batch/predict", &json!({"input": [[1, 2, 3, 4], [5, 6, 7, 8]]})).await)
            .await;
    assert_eq!(status, 400, "two rows for a graph of one: {body}");
    assert!(body["error"].as_str().expect("error").contains("dimension 0 must have 1 element"), "{body}");
}

/// A repository of digits-candle and a model whose weights are missing.
fn one_broken() -> Repo {
    Repo::new()
        .bundled("digits-candle")
        .model("broken", "digits-candle", |t| set_toml(t, "file", "\"missing.safetensors\""))
}

#[tokio::test]
async fn strict_readiness_waits_for_every_model_and_relaxed_for_one() {
    let repo = one_broken();
    let strict = TestServer::ready(repo.path(), &[], None).await;
    for path in ["/health", "/health/ready", "/v2/health/ready"] {
        let r = strict.client.get(strict.url(path)).send().await.expect("answers");
        assert_eq!(r.status(), 503, "{path}, strict");
    }
    let relaxed = TestServer::ready(repo.path(), &["--strict-readiness", "false"], None).await;
    for path in ["/health/ready", "/v2/health/ready", "/v2/models/digits-candle/ready"] {
        let r = relaxed.client.get(relaxed.url(path)).send().await.expect("answers");
        assert_eq!(r.status(), 200, "{path}, relaxed");
    }
    let (status, h) = relaxed.health().await;
    assert_eq!((status, h["status"].clone()), (200, json!("degraded")), "ready, and says what is wrong: {h}");
    assert!(h["reason"].as_str().expect("reason").contains("model `broken` failed to load"), "{h}");
    let r = relaxed.client.get(relaxed.url("/v2/models/broken/ready")).send().await.expect("answers");
    assert_eq!(r.status(), 503);
    let (status, _) = json_of(relaxed.post("/models/digits-candle/predict", inferd_tests::row_body(1.0)).await).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn model_control_is_off_unless_asked_for() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &[], None).await;
    for route in ["load", "unload"] {
        let (status, body) =
            json_of(server.post(&format!("/v2/repository/models/digits-candle/{route}"), "").await).await;
        assert_eq!(status, 400, "{body}");
        assert!(body["error"].as_str().expect("error").contains("--model-control explicit"), "{body}");
    }
}

/// The first logit of the first held-out digit from `path`.
async fn first_logit(server: &TestServer, path: &str) -> f64 {
    let body = json!({ "input": [heldout().pixels[0].clone()] });
    let (status, answer) = json_of(server.post_json(path, &body).await).await;
    assert_eq!(status, 200, "{path}: {answer}");
    prediction_rows(&answer)[0][0]
}

#[tokio::test]
async fn a_reload_under_load_swaps_in_new_weights_and_settings_without_failing_a_request() {
    let repo = Repo::new().bundled("digits-candle");
    let server = Arc::new(TestServer::ready(repo.path(), &["--model-control", "explicit"], None).await);
    let before = first_logit(&server, "/models/digits-candle/predict").await;
    // Sixteen clients send requests until told to stop; any answer but a 200 is counted.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (server, stop, sent, failed) = (server.clone(), stop.clone(), sent.clone(), failed.clone());
            tokio::spawn(async move {
                let body = json!({ "input": [heldout().pixels[1].clone()] }).to_string();
                while !stop.load(Ordering::SeqCst) {
                    let r = server.post("/models/digits-candle/predict", body.clone()).await;
                    sent.fetch_add(1, Ordering::SeqCst);
                    if r.status() != 200 {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    let dir = repo.path().join("digits-candle");
    for round in 1..=3 {
        add_to_tensor(&dir.join("model.safetensors"), "fc2.bias", 1.0);
        let toml = std::fs::read_to_string(dir.join("model.toml")).expect("model.toml");
        std::fs::write(dir.join("model.toml"), set_toml(toml, "max_batch_size", &(4 * round).to_string()))
            .expect("write");
        let (status, body) = json_of(server.post("/v2/repository/models/digits-candle/load", "").await).await;
        assert_eq!(status, 200, "{body}");
        let after = first_logit(&server, "/models/digits-candle/predict").await;
        assert!((after - before - round as f64).abs() < 1e-4, "round {round}: {before} -> {after}");
        let (_, config) = get(&server, "/v2/models/digits-candle/config").await;
        assert_eq!(config["max_batch_size"], 4 * round, "the changed model.toml took effect");
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client");
    }
    let sent = sent.load(Ordering::SeqCst);
    eprintln!("{sent} requests across three reloads");
    assert!(sent > 16, "the load ran across the reloads");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "no request failed across three reloads");
    // A reload that fails keeps what was served.
    std::fs::write(dir.join("model.toml"), "backend = \"candle\"\nfile = 3\n").expect("write");
    let (status, body) = json_of(server.post("/v2/repository/models/digits-candle/load", "").await).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().expect("error").contains("model.toml"), "{body}");
    let still = first_logit(&server, "/models/digits-candle/predict").await;
    assert!((still - before - 3.0).abs() < 1e-4, "the last good load still serves: {still}");
    assert_eq!(server.health().await.0, 200);
}

#[tokio::test]
async fn an_unloaded_model_finishes_what_it_holds_then_refuses_until_loaded_again() {
    let gate = Arc::new(Gate::default());
    let repo = Repo::new().bundled("digits-candle").model("other", "digits-candle", |t| t);
    let server = Arc::new(
        TestServer::with_engines(repo.path(), &["--model-control", "explicit"], HeldEngine::builder(gate.clone()))
            .await,
    );
    let held = {
        let server = server.clone();
        tokio::spawn(async move {
            server.post("/models/digits-candle/predict", inferd_tests::row_body(inferd_tests::HOLD)).await
        })
    };
    gate.wait_held(1).await;
    let (status, body) = json_of(server.post("/v2/repository/models/digits-candle/unload", "").await).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = json_of(server.post("/models/digits-candle/predict", inferd_tests::row_body(1.0)).await).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"].as_str().expect("error").contains("is not loaded: unloaded"), "{body}");
    gate.open();
    assert_eq!(held.await.expect("task").status(), 200, "the request it held was answered");
    // Unloaded on purpose: readiness does not wait for it, and the index says so.
    assert_eq!(server.health().await.0, 200);
    let (_, index) = json_of(server.post("/v2/repository/index", "").await).await;
    let entry = index.as_array().expect("index").iter().find(|e| e["name"] == "digits-candle").expect("listed").clone();
    assert_eq!((entry["state"].clone(), entry["reason"].clone()), (json!("UNAVAILABLE"), json!("unloaded")));
    let (status, _) = json_of(server.post("/v2/repository/models/digits-candle/load", "").await).await;
    assert_eq!(status, 200);
    let (status, _) = json_of(server.post("/models/digits-candle/predict", inferd_tests::row_body(2.0)).await).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_model_added_to_the_repository_loads_on_request_and_names_stay_inside_it() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &["--model-control", "explicit", "--api-key", "k3y"], None).await;
    let post = |path: &'static str, key: Option<&'static str>| {
        let mut request = server.client.post(server.url(path));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move { json_of(request.send().await.expect("answers")).await }
    };
    assert_eq!(post("/v2/repository/models/digits-candle/load", None).await.0, 401, "behind the API key");
    inferd_tests::copy_model(repo.path(), "late", &workspace().join("tests/data/models/fixed-batch"), |t| t);
    let (_, index) = post("/v2/repository/index", Some("k3y")).await;
    assert!(
        index
            .as_array()
            .expect("index")
            .contains(&json!({"name": "late", "version": "", "state": "UNAVAILABLE", "reason": "not loaded"})),
        "{index}"
    );
    let (status, body) = post("/v2/repository/models/late/load", Some("k3y")).await;
    assert_eq!(status, 200, "{body}");
    let r =
        server.client.post(server.url("/models/late/predict")).bearer_auth("k3y").body(r#"{"input": [[0, 0, 0, 0]]}"#);
    let (status, body) = json_of(r.send().await.expect("answers")).await;
    assert_eq!((status, body["prediction"].clone()), (200, json!([[0.5, -0.5]])));
    for name in ["missing", "..", "..%2Fdigits-candle", "%2E%2E"] {
        let r = server.client.post(server.url(&format!("/v2/repository/models/{name}/load"))).bearer_auth("k3y");
        let (status, body) = json_of(r.send().await.expect("answers")).await;
        assert_eq!(status, 404, "{name}: {body}");
    }
    let r = server.client.post(server.url("/v2/repository/models/late/load")).bearer_auth("k3y");
    let (status, body) = json_of(r.body(r#"{"parameters": {"config": "{}"}}"#).send().await.expect("answers")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().expect("error").contains("`config` is not supported"), "{body}");
}

/// A repository with `digits-candle` as numbered versions 1 and 2, version 2's logits 1 higher.
fn versioned(policy: &str) -> Repo {
    let repo = Repo::new();
    let model = repo.path().join("digits");
    let source = workspace().join("models/digits-candle");
    for v in ["1", "2"] {
        std::fs::create_dir_all(model.join(v)).expect("mkdir");
        std::fs::copy(source.join("model.safetensors"), model.join(v).join("model.safetensors")).expect("copy");
    }
    add_to_tensor(&model.join("2").join("model.safetensors"), "fc2.bias", 1.0);
    let toml = std::fs::read_to_string(source.join("model.toml")).expect("model.toml");
    std::fs::write(model.join("model.toml"), format!("version_policy = {policy}\n{toml}")).expect("write");
    repo
}

#[tokio::test]
async fn numbered_version_folders_serve_the_versions_their_policy_chooses() {
    let repo = versioned("\"all\"");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let (_, meta) = get(&server, "/v2/models/digits").await;
    assert_eq!(meta["versions"], json!(["1", "2"]));
    let infer = |version: &str| {
        let path = match version {
            "" => "/v2/models/digits/infer".to_owned(),
            v => format!("/v2/models/digits/versions/{v}/infer"),
        };
        let body =
            json!({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": heldout().pixels[0]}]});
        let server = &server;
        async move {
            let (status, answer) = json_of(server.post_json(&path, &body).await).await;
            (status, answer["outputs"][0]["data"][0].as_f64().unwrap_or(f64::NAN), answer)
        }
    };
    let (s1, v1, _) = infer("1").await;
    let (s2, v2, _) = infer("2").await;
    let (s, latest, _) = infer("").await;
    assert_eq!((s1, s2, s), (200, 200, 200));
    assert!((v2 - v1 - 1.0).abs() < 1e-4 && latest == v2, "v1 {v1}, v2 {v2}, unversioned {latest}");
    let (status, answer) =
        json_of(server.post_json("/v2/models/digits/versions/3/infer", &json!({"inputs": []})).await).await;
    assert_eq!(status, 404, "{answer}");
    assert!(answer["error"].as_str().expect("error").contains("no version 3 (it has [1, 2])"), "{answer}");
    let (_, h) = server.health().await;
    let versions: Vec<Value> = h["models"].as_array().expect("models").iter().map(|m| m["version"].clone()).collect();
    assert_eq!(versions, vec![json!(1), json!(2)]);
    // By default, only the newest.
    let repo = versioned("\"latest\"");
    let server = TestServer::ready(repo.path(), &[], None).await;
    assert_eq!(get(&server, "/v2/models/digits").await.1["versions"], json!(["2"]));
    assert_eq!(get(&server, "/v2/models/digits/versions/1/ready").await.0, 404);
    assert!((first_logit(&server, "/models/digits/predict").await - v2).abs() < 1e-4, "/predict serves the newest");
}
