//! Shutdown drains: every request accepted before the signal is answered.

use std::time::Duration;

use inferd_tests::{heldout, prediction_rows, set_toml, Repo, TestServer};
use serde_json::json;

#[tokio::test]
async fn drain_loses_no_accepted_request() {
    // A long queue delay keeps the requests queued until shutdown begins; draining must run them at once.
    let repo = Repo::new().model("digits", "digits", |t| set_toml(t, "max_queue_delay_us", "30000000")).model(
        "digits-candle",
        "digits-candle",
        |t| set_toml(t, "max_queue_delay_us", "30000000"),
    );
    let mut server = TestServer::ready(repo.path(), &[], None).await;
    let data = heldout();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let client = server.client.clone();
            let model = if i % 2 == 0 { "digits" } else { "digits-candle" };
            let url = server.url(&format!("/models/{model}/predict"));
            let body = json!({ "input": [data.pixels[i]] }).to_string();
            tokio::spawn(async move { client.post(url).body(body).send().await })
        })
        .collect();
    let mut queued = 0;
    for _ in 0..400 {
        let (_, h) = server.health().await;
        queued = h["models"].as_array().expect("models").iter().map(|m| m["queue_depth"].as_u64().unwrap_or(0)).sum();
        if queued == 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(queued, 16, "all requests were accepted and queued");
    server.begin_shutdown();
    for (i, task) in tasks.into_iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(20), task).await.expect("answered during the drain");
        let r = r.expect("task").expect("a response");
        assert_eq!(r.status(), 200);
        let got = &prediction_rows(&r.json().await.expect("JSON"))[0];
        let want = &data.reference_logits[i];
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-3 * w.abs().max(1.0)), "{got:?} vs {want:?}");
    }
    server.shutdown().await.expect("the server stops cleanly");
}

#[tokio::test]
async fn after_shutdown_no_new_connection_is_taken() {
    let repo = Repo::new().bundled("digits-candle");
    let server = TestServer::ready(repo.path(), &[], None).await;
    let url = server.url("/health/live");
    let client = server.client.clone();
    server.shutdown().await.expect("stops");
    assert!(client.get(url).send().await.is_err(), "the listener is closed");
}
