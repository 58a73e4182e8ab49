//! Bad input gets a 4xx with a JSON error that says what was wrong, and never disturbs other requests.

use inferd_tests::{argmax, heldout, prediction_rows, Repo, TestServer};
use serde_json::json;

fn row(n: usize) -> String {
    format!("[{}]", vec!["1"; n].join(","))
}

#[tokio::test]
async fn every_bad_input_gets_a_clear_4xx() {
    let repo = Repo::new().bundled("digits").bundled("digits-candle");
    let server =
        TestServer::ready(repo.path(), &["--default-model", "digits", "--max-body-bytes", "100000"], None).await;
    let huge_claim = format!("{{\"input\": [{}]}}", vec![row(64); 10].join(","));
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/predict", format!("{{\"input\": [{}]}}", row(63)), 400, "dimension 1 must have 64 elements"),
        ("/predict", format!("{{\"input\": [{}]}}", row(65)), 400, "dimension 1 must have 64 elements"),
        ("/predict", format!("{{\"input\": {}}}", row(64)), 400, "nested array of 2 dimensions"),
        ("/predict", format!("{{\"input\": [[{}]]}}", row(64)), 400, "a number"),
        ("/predict", "{\"input\": [[\"a\"]]}".into(), 400, "invalid type: string"),
        ("/predict", "{\"input\": [[null]]}".into(), 400, "invalid type: null"),
        ("/predict", "{\"input\": []}".into(), 400, "has no rows"),
        ("/predict", "{\"input\": [[]]}".into(), 400, "dimension 1 is empty"),
        ("/predict", format!("{{\"input\": [{}, [1]]}}", row(64)), 400, "dimension 1 must have 64 elements"),
        ("/predict", "{\"input\": [[1e40]]}".into(), 400, "out of range for FP32"),
        ("/predict", "{\"inputs\": {\"pixels\": [[1]]}}".into(), 400, "no input `pixels`"),
        ("/predict", "{\"data\": [[1]]}".into(), 400, "unknown field `data`"),
        ("/predict", "{}".into(), 400, "missing input `input`"),
        ("/predict", "not json".into(), 400, "expected"),
        ("/predict", "".into(), 400, "EOF"),
        ("/predict", "[1, 2]".into(), 400, "a JSON object"),
        ("/predict", format!("{{\"input\": [{}]}} extra", row(64)), 400, "trailing characters"),
        ("/predict", "x".repeat(100_001), 413, "larger than this server takes"),
        ("/models/nope/predict", huge_claim.clone(), 404, "no model named `nope`"),
        ("/models/digits/predict/extra", huge_claim, 404, "no such route"),
    ];
    for (path, body, status, expected) in cases {
        let r = server.post(path, body.clone()).await;
        let got = r.status().as_u16();
        let json: serde_json::Value = r.json().await.unwrap_or_else(|e| panic!("{path} {body:.60}: not JSON: {e}"));
        let error = json["error"].as_str().unwrap_or_else(|| panic!("{path} {body:.60}: no error field: {json}"));
        assert_eq!(got, status, "{path} {body:.60}: {error}");
        assert!(error.contains(expected), "{path} {body:.60}: expected {expected:?} in {error:?}");
    }
    let r = server.client.get(server.url("/predict")).send().await.expect("answers");
    assert_eq!(r.status(), 405);
    assert!(r.json::<serde_json::Value>().await.expect("JSON")["error"].is_string());

    // Still serving, and correctly.
    let data = heldout();
    let r = server.post_json("/predict", &json!({ "input": [data.pixels[5]] })).await;
    assert_eq!(r.status(), 200);
    assert_eq!(argmax(&prediction_rows(&r.json().await.expect("JSON"))[0]), data.labels[5]);
}

#[tokio::test]
async fn bad_requests_never_fail_good_ones_in_the_same_burst() {
    let repo = Repo::new().model("digits", "digits", |t| inferd_tests::set_toml(t, "max_queue_delay_us", "20000"));
    let server = TestServer::ready(repo.path(), &[], None).await;
    let data = heldout();
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let client = server.client.clone();
            let url = server.url("/predict");
            let good = i % 2 == 0;
            let body = if good { json!({ "input": [data.pixels[i]] }) } else { json!({ "input": [[1, 2, 3]] }) };
            tokio::spawn(async move { (good, client.post(url).body(body.to_string()).send().await) })
        })
        .collect();
    for task in tasks {
        let (good, r) = task.await.expect("task");
        assert_eq!(r.expect("answered").status(), if good { 200 } else { 400 });
    }
}

#[tokio::test]
async fn several_models_without_a_default_ask_for_a_name() {
    let repo = Repo::new().bundled("digits").bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let r = server.post_json("/predict", &json!({ "input": [heldout().pixels[0]] })).await;
    assert_eq!(r.status(), 400);
    let error = r.json::<serde_json::Value>().await.expect("JSON")["error"].as_str().expect("error").to_owned();
    assert!(error.contains("--default-model") && error.contains("`digits-candle`"), "{error}");
}

/// The engine itself refuses an input (an id out of the table of a real ONNX `Gather`): that is the client's
/// fault, a 400 with the engine's words, on both protocols; the model goes on serving.
#[tokio::test]
async fn an_input_the_engine_refuses_is_a_400_not_a_500() {
    let repo = Repo::new().test_model("lookup");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let r = server.post_json("/predict", &json!({ "input": [[3], [7]] })).await;
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(body["prediction"], json!([[[3.0, -3.0]], [[7.0, -7.0]]]));
    for (path, body) in [
        ("/predict", json!({ "input": [[9]] })),
        (
            "/v2/models/lookup/infer",
            json!({ "inputs": [{ "name": "ids", "shape": [1, 1], "datatype": "INT64", "data": [-20] }] }),
        ),
    ] {
        let r = server.post_json(path, &body).await;
        assert_eq!(r.status(), 400, "{path}");
        let error = r.json::<serde_json::Value>().await.expect("JSON")["error"].as_str().expect("error").to_owned();
        assert!(error.starts_with("the engine refused the input:") && error.contains("out of"), "{path}: {error}");
    }
    let r = server.post_json("/predict", &json!({ "input": [[0]] })).await;
    assert_eq!(r.json::<serde_json::Value>().await.expect("JSON")["prediction"], json!([[[0.0, 0.0]]]));
}

/// A v2 request may name each output once: a repeat used to be encoded again for every repeat.
#[tokio::test]
async fn v2_outputs_asked_twice_or_unknown_are_400s() {
    let repo = Repo::new().bundled("digits");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let pixels = heldout().pixels[0].clone();
    let request = |outputs: serde_json::Value| json!({ "inputs": [{ "name": "input", "shape": [1, 64], "datatype": "FP32", "data": pixels }], "outputs": outputs });
    let repeats: Vec<serde_json::Value> = (0..10_000).map(|_| json!({ "name": "logits" })).collect();
    for (outputs, expected) in [
        (json!(repeats), "output `logits` is asked for twice"),
        (json!([{ "name": "logits" }, { "name": "probabilities" }]), "unexpected output `probabilities`"),
    ] {
        let r = server.post_json("/v2/models/digits/infer", &request(outputs)).await;
        assert_eq!(r.status(), 400);
        let error = r.json::<serde_json::Value>().await.expect("JSON")["error"].as_str().expect("error").to_owned();
        assert!(error.contains(expected), "{error}");
    }
    let r = server.post_json("/v2/models/digits/infer", &request(json!([{ "name": "logits" }]))).await;
    assert_eq!(r.status(), 200);
}
