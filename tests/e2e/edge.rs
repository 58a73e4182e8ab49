//! The edge under abuse: non-finite numbers, engine faults isolated to the requests that cause them, a stalled
//! engine, request ids.

use serde_json::{json, Value};

use inferd_tests::{Repo, TestServer};

/// A KServe v2 binary body of one FP32 input `name` of `shape` holding `values`, asking for the outputs in binary
/// when `binary_out`.
fn v2_binary(name: &str, shape: &[usize], values: &[f32], binary_out: bool) -> (usize, Vec<u8>) {
    let header = json!({
        "inputs": [{"name": name, "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": values.len() * 4}}],
        "parameters": {"binary_data_output": binary_out},
    })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    (header.len(), body)
}

async fn post_v2(server: &TestServer, model: &str, (json_len, body): (usize, Vec<u8>)) -> reqwest::Response {
    server
        .client
        .post(server.url(&format!("/v2/models/{model}/infer")))
        .header("inference-header-content-length", json_len)
        .body(body)
        .send()
        .await
        .expect("the server answers")
}

async fn error_of(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.expect("a JSON error");
    (status, body["error"].as_str().expect("an error message").to_owned())
}

#[tokio::test]
async fn non_finite_inputs_are_refused_naming_the_input_and_element() {
    let repo = Repo::new().bundled("digits");
    let server = TestServer::ready(repo.path(), &[], None).await;
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut values = vec![1.0f32; 128];
        values[70] = bad;
        let (status, error) =
            error_of(post_v2(&server, "digits", v2_binary("input", &[2, 64], &values, false)).await).await;
        assert_eq!(status, 400, "{bad}: {error}");
        assert!(error.contains("input `input` holds") && error.contains("at element 70"), "{error}");
        assert!(error.contains("--allow-non-finite"), "{error}");
    }
    // JSON cannot carry them: a number too large for FP32 is refused as out of range, never made infinite.
    let r = server.post("/models/digits/predict", format!("{{\"input\": [[{}]]}}", ["1e39"; 64].join(","))).await;
    let (status, error) = error_of(r).await;
    assert_eq!(status, 400);
    assert!(error.contains("out of range for FP32"), "{error}");
}

#[tokio::test]
async fn non_finite_outputs_are_a_500_naming_the_output_never_a_silent_null() {
    let repo = Repo::new().test_model("log");
    let server = TestServer::ready(repo.path(), &[], None).await;
    // log(-1) is NaN, log(0) is -inf: finite inputs, non-finite outputs.
    for (x, what) in [([-1.0, 1.0], "NaN at element 0"), ([1.0, 0.0], "-inf at element 1")] {
        let r = server.post("/models/log/predict", json!({ "input": [x] }).to_string()).await;
        let (status, error) = error_of(r).await;
        assert_eq!(status, 500, "{error}");
        assert!(error.contains(&format!("output `y` holds {what}")), "{error}");
    }
    let r = server.post("/models/log/predict", json!({ "input": [[1.0, std::f64::consts::E]] }).to_string()).await;
    assert_eq!(r.status(), 200, "finite outputs pass");
}

#[tokio::test]
async fn allowed_non_finite_numbers_travel_as_ieee_values_in_binary_and_as_strings_in_json() {
    let repo = Repo::new().test_model("log");
    let server = TestServer::ready(repo.path(), &["--allow-non-finite"], None).await;
    let r = server
        .post("/models/log/predict", json!({ "input": [[-1.0, 0.0], [1.0, f64::from(f32::MAX)]] }).to_string())
        .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("JSON");
    assert_eq!(body["prediction"][0], json!(["NaN", "-Infinity"]));
    assert_eq!(body["prediction"][1][0], 0.0);
    // Binary in and out: a NaN input gives a NaN output, bit for bit an IEEE NaN.
    let r = post_v2(&server, "log", v2_binary("x", &[1, 2], &[f32::NAN, f32::INFINITY], true)).await;
    assert_eq!(r.status(), 200);
    let json_len: usize =
        r.headers()["inference-header-content-length"].to_str().expect("text").parse().expect("a number");
    let bytes = r.bytes().await.expect("body");
    let out: Vec<f32> =
        bytes[json_len..].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4"))).collect();
    assert!(out[0].is_nan() && out[1] == f32::INFINITY, "{out:?}");
}

#[tokio::test]
async fn a_request_the_engine_refuses_fails_alone_and_its_batch_neighbours_are_answered() {
    // A real ONNX Runtime Gather: an id outside 0..7 makes the run fail (INVALID_ARGUMENT). A queue delay gathers
    // the eight requests into one batch.
    let repo =
        Repo::new().copy_test_model("lookup", |t| t.replace("max_queue_delay_us = 0", "max_queue_delay_us = 300000"));
    let server = std::sync::Arc::new(TestServer::ready(repo.path(), &[], None).await);
    let ids: Vec<i64> = vec![0, 1, 2, 9, 3, 4, 5, 6];
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let server = server.clone();
            tokio::spawn(async move {
                let r = server.post("/models/lookup/predict", json!({ "input": [[id]] }).to_string()).await;
                let batch =
                    r.headers().get(inferd_tests::BATCH_SIZE_HEADER).map(|v| v.to_str().unwrap_or("").to_owned());
                let status = r.status().as_u16();
                (id, status, batch, r.json::<Value>().await.expect("JSON"))
            })
        })
        .collect();
    let mut largest = 0;
    for task in tasks {
        let (id, status, batch, body) = task.await.expect("task");
        if id == 9 {
            assert_eq!(status, 400, "{body}");
            assert!(body["error"].as_str().expect("error").contains("the engine refused the input"), "{body}");
        } else {
            assert_eq!(status, 200, "id {id}, a neighbour of the bad one: {body}");
            assert_eq!(body["prediction"], json!([[[id as f64, -(id as f64)]]]));
            largest = largest.max(batch.and_then(|b| b.parse().ok()).unwrap_or(0));
        }
    }
    // The eight ran together and failed; then halves, down to the bad request alone: [8] [4] [2] [1] failed, and
    // the innocent ones were answered from batches of up to four.
    let failures = server.metrics().await.value("inferd_batch_failures_total", &[("model", "lookup")]);
    assert_eq!(failures, 4.0);
    assert_eq!(largest, 4, "the good half of the batch ran as one batch");
}

#[tokio::test]
async fn a_stalled_engine_degrades_its_model_and_fails_readiness_until_it_moves() {
    let gate = std::sync::Arc::new(inferd_tests::Gate::default());
    let repo = Repo::new().bundled("digits-candle");
    let server = std::sync::Arc::new(
        TestServer::with_engines(
            repo.path(),
            &["--stall-timeout", "0.3"],
            inferd_tests::HeldEngine::builder(gate.clone()),
        )
        .await,
    );
    assert_eq!(server.health().await.0, 200);
    let held = {
        let server = server.clone();
        tokio::spawn(async move {
            server.post("/models/digits-candle/predict", inferd_tests::row_body(inferd_tests::HOLD)).await
        })
    };
    gate.wait_held(1).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (status, h) = server.health().await;
    assert_eq!((status, h["status"].clone()), (503, json!("degraded")), "{h}");
    let model = &h["models"][0];
    assert_eq!((model["state"].clone(), model["ready"].clone()), (json!("stalled"), json!(false)), "{h}");
    assert!(model["error"].as_str().expect("why").contains("--stall-timeout 0.3 s"), "{h}");
    let r = server.client.get(server.url("/health/ready")).send().await.expect("answers");
    assert_eq!(r.status(), 503);
    let r = server.client.get(server.url("/health/live")).send().await.expect("answers");
    assert_eq!(r.status(), 200, "alive all the same");
    gate.open();
    assert_eq!(held.await.expect("task").status(), 200);
    for _ in 0..100 {
        if server.health().await.0 == 200 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the model stayed stalled after its batch ended");
}
