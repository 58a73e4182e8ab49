//! Both bundled models classify the held-out digits through /predict.

use inferd_tests::{argmax, heldout, prediction_rows, Repo, TestServer};
use serde_json::json;

async fn classify_heldout(server: &TestServer, path: &str) {
    let data = heldout();
    // All 360 images in one request: more rows than max_batch_size (64), so it is split and reassembled.
    let r = server.post_json(path, &json!({ "input": data.pixels })).await;
    assert_eq!(r.status(), 200, "{path}");
    let body: serde_json::Value = r.json().await.expect("JSON");
    let rows = prediction_rows(&body);
    assert_eq!(rows.len(), data.labels.len());
    let correct = rows.iter().zip(&data.labels).filter(|(row, &label)| argmax(row) == label).count();
    let accuracy = correct as f64 / rows.len() as f64;
    assert!(accuracy >= 0.95, "{path}: accuracy {accuracy:.4} ({correct} of {})", rows.len());
    // The first rows against float64 logits computed by numpy when the model was made.
    for (i, (got, want)) in rows.iter().zip(&data.reference_logits).enumerate() {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-3 * w.abs().max(1.0), "{path} row {i}: {got:?} vs {want:?}");
        }
    }
}

#[tokio::test]
async fn both_bundled_models_classify_the_held_out_digits() {
    let repo = Repo::new().bundled("digits").bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &["--default-model", "digits"], None).await;
    classify_heldout(&server, "/predict").await;
    classify_heldout(&server, "/models/digits/predict").await;
    classify_heldout(&server, "/models/digits-candle/predict").await;

    let r = server
        .post_json("/models/digits-candle/predict", &json!({ "inputs": { "input": [heldout().pixels[0]] } }))
        .await;
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(body["model"], "digits-candle");
    assert_eq!(body["device"], "cpu");
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn a_lone_model_is_the_default() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let data = heldout();
    let r = server.post_json("/predict", &json!({ "input": [data.pixels[3]] })).await;
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.expect("JSON");
    assert_eq!(argmax(&prediction_rows(&body)[0]), data.labels[3]);
    assert_eq!(body["model"], "digits-candle");
}

#[tokio::test]
async fn a_model_folder_can_be_served_on_its_own() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::ready(&repo.path().join("digits-candle"), &[], None).await;
    let r = server.post_json("/models/digits-candle/predict", &json!({ "input": [heldout().pixels[0]] })).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn fp16_and_bf16_candle_models_stay_close_to_fp32() {
    let repo = Repo::new()
        .model("fp16", "digits-candle", |t| t.replace("device = \"auto\"", "device = \"cpu\"\nprecision = \"fp16\""))
        .model("bf16", "digits-candle", |t| t.replace("device = \"auto\"", "device = \"cpu\"\nprecision = \"bf16\""));
    let server = TestServer::ready(repo.path(), &[], None).await;
    let data = heldout();
    for (model, tolerance) in [("fp16", 2e-2), ("bf16", 1e-1)] {
        let r = server.post_json(&format!("/models/{model}/predict"), &json!({ "input": data.pixels })).await;
        assert_eq!(r.status(), 200);
        let rows = prediction_rows(&r.json().await.expect("JSON"));
        let correct = rows.iter().zip(&data.labels).filter(|(row, &label)| argmax(row) == label).count();
        assert!(correct * 100 >= 95 * rows.len(), "{model}: {correct} of {} correct", rows.len());
        for (got, want) in rows.iter().zip(&data.reference_logits) {
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() <= tolerance * w.abs().max(1.0), "{model}: {got:?} vs {want:?}");
            }
        }
    }
    let (_, health) = server.health().await;
    let precisions: Vec<&str> =
        health["models"].as_array().expect("models").iter().map(|m| m["precision"].as_str().unwrap_or("")).collect();
    assert_eq!(precisions, vec!["bf16", "fp16"]);
}

#[tokio::test]
async fn json_numbers_reach_fp16_models_and_come_back_as_numbers() {
    let repo = Repo::new().bundled("digits-fp16").bundled("digits-fp16-candle");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let data = heldout();
    for model in ["digits-fp16", "digits-fp16-candle"] {
        let r = server.post_json(&format!("/models/{model}/predict"), &json!({ "input": data.pixels[..16] })).await;
        assert_eq!(r.status(), 200, "{model}");
        let rows = prediction_rows(&r.json().await.expect("JSON"));
        for (got, want) in rows.iter().zip(&data.reference_logits) {
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() <= 2e-2 * w.abs().max(1.0), "{model}: {got:?} vs {want:?}");
            }
        }
    }
}
