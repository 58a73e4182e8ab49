//! Concurrent requests are all answered, and served in shared batches.

use inferd_tests::{argmax, heldout, prediction_rows, set_toml, Repo, TestServer, BATCH_SIZE_HEADER};
use serde_json::json;

#[tokio::test]
async fn sixty_four_concurrent_requests_are_answered_in_batches() {
    // A 20 ms queue delay lets a burst gather even on a machine that answers each request before the next
    // arrives; the batch size each request ran in comes back in a response header.
    let repo = Repo::new().model("digits", "digits", |t| set_toml(t, "max_queue_delay_us", "20000")).model(
        "digits-candle",
        "digits-candle",
        |t| set_toml(t, "max_queue_delay_us", "20000"),
    );
    let server = TestServer::ready(repo.path(), &[], None).await;
    let data = heldout();
    for model in ["digits", "digits-candle"] {
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let client = server.client.clone();
                let url = server.url(&format!("/models/{model}/predict"));
                let body = json!({ "input": [data.pixels[i]] }).to_string();
                tokio::spawn(async move { client.post(url).body(body).send().await })
            })
            .collect();
        let mut largest = 0;
        let mut correct = 0;
        for (i, task) in tasks.into_iter().enumerate() {
            let r = task.await.expect("task").expect("answered");
            assert_eq!(r.status(), 200);
            let batch: usize = r.headers()[BATCH_SIZE_HEADER].to_str().expect("ascii").parse().expect("a number");
            largest = largest.max(batch);
            let rows = prediction_rows(&r.json().await.expect("JSON"));
            assert_eq!(rows.len(), 1, "each request gets its own row back");
            correct += usize::from(argmax(&rows[0]) == data.labels[i]);
        }
        assert!(largest > 1, "{model}: every request ran alone");
        assert!(correct >= 61, "{model}: {correct} of 64 correct");
        let (_, health) = server.health().await;
        let m =
            health["models"].as_array().expect("models").iter().find(|m| m["name"] == model).expect("listed").clone();
        assert_eq!(m["requests"], 64);
        assert_eq!(m["rows"], 64);
        assert!(m["batches"].as_u64().expect("a count") < 64, "{model}: {m}");
    }
}

#[tokio::test]
async fn an_oversize_request_is_split_across_batches_and_reassembled() {
    let repo = Repo::new().model("digits", "digits", |t| set_toml(t, "max_batch_size", "8"));
    let server = TestServer::ready(repo.path(), &[], None).await;
    let data = heldout();
    let r = server.post_json("/predict", &json!({ "input": data.pixels[..50] })).await;
    assert_eq!(r.status(), 200);
    let batch: usize = r.headers()[BATCH_SIZE_HEADER].to_str().expect("ascii").parse().expect("a number");
    assert!(batch <= 8, "batches stay within max_batch_size: {batch}");
    let rows = prediction_rows(&r.json().await.expect("JSON"));
    assert_eq!(rows.len(), 50);
    for (got, want) in rows.iter().zip(&data.reference_logits) {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-3 * w.abs().max(1.0), "rows come back in order: {got:?} vs {want:?}");
        }
    }
    let (_, health) = server.health().await;
    assert_eq!(health["models"][0]["batches"], 7, "50 rows in batches of at most 8");
}

#[tokio::test]
async fn a_full_queue_sheds_load_with_429_and_retry_after() {
    let repo = Repo::new()
        .model("digits", "digits", |t| set_toml(set_toml(t, "max_queue_delay_us", "30000000"), "max_queue_size", "2"));
    let mut server = TestServer::ready(repo.path(), &[], None).await;
    let data = heldout();
    let held: Vec<_> = (0..2)
        .map(|i| {
            let request =
                server.client.post(server.url("/predict")).body(json!({ "input": [data.pixels[i]] }).to_string());
            tokio::spawn(async move { request.send().await })
        })
        .collect();
    for _ in 0..500 {
        if server.health().await.1["models"][0]["queue_depth"] == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let r = server.post_json("/predict", &json!({ "input": [data.pixels[2]] })).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let error = r.json::<serde_json::Value>().await.expect("JSON")["error"].as_str().expect("error").to_owned();
    assert!(error.contains("queue of model `digits` is full"), "{error}");
    // The queued requests were not harmed: draining runs them.
    server.begin_shutdown();
    for task in held {
        assert_eq!(task.await.expect("task").expect("response").status(), 200);
    }
}
