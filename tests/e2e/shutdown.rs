//! Shutdown drains: every request accepted before the signal is answered.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inferd_tests::{heldout, prediction_rows, row_body, set_toml, Gate, HeldEngine, Repo, TestServer, HOLD};
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

/// A client that opens a new connection for every request, so that a closed listener shows.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(30)).build().expect("a client")
}

#[tokio::test]
async fn drain_delay_keeps_serving_then_the_drain_timeout_answers_what_is_left_503() {
    let gate = Arc::new(Gate::default());
    let repo = Repo::new().model("held", "digits", |t| t);
    let args = ["--drain-delay", "0.5", "--drain-timeout", "0.5"];
    let mut server = TestServer::with_engines(repo.path(), &args, HeldEngine::builder(gate.clone())).await;
    let (predict_client, predict_url) = (server.client.clone(), server.url("/predict"));
    let send = |body: String| {
        let (client, url) = (predict_client.clone(), predict_url.clone());
        tokio::spawn(async move { client.post(url).body(body).send().await })
    };
    let busy = send(row_body(HOLD));
    gate.wait_held(1).await;
    let signalled = Instant::now();
    server.begin_shutdown();
    let client = fresh_client();
    let mut ready_failed = false;
    for _ in 0..100 {
        let r = client.get(server.url("/health/ready")).send().await.expect("still serving");
        if r.status() == 503 {
            ready_failed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(ready_failed, "readiness fails as soon as the drain begins");
    let r = client.get(server.url("/v2/health/ready")).send().await.expect("still serving");
    assert_eq!(r.status(), 503);
    // Within the delay, new connections and requests are still taken.
    let queued = send(row_body(5.0));
    let r = client.get(server.url("/health/live")).send().await.expect("a new connection is taken");
    assert_eq!(r.status(), 200);
    assert!(signalled.elapsed() < Duration::from_millis(400), "the checks above ran within the delay");
    let mut closed_after = None;
    for _ in 0..300 {
        if client.get(server.url("/health/live")).send().await.is_err() {
            closed_after = Some(signalled.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let closed_after = closed_after.expect("the listener closes after the delay");
    assert!(closed_after >= Duration::from_millis(500), "closed after {closed_after:?}, before the delay ended");
    // The held request and the one queued behind it cannot finish: the drain timeout answers both 503.
    for task in [busy, queued] {
        let r = tokio::time::timeout(Duration::from_secs(10), task).await.expect("answered").expect("task");
        let r = r.expect("a response, not a dropped connection");
        assert_eq!(r.status(), 503);
        let e: serde_json::Value = r.json().await.expect("a JSON error");
        assert!(e["error"].as_str().is_some_and(|m| m.contains("--drain-timeout")), "{e}");
    }
    server.shutdown().await.expect("the server stops cleanly");
    gate.open();
}

#[tokio::test]
async fn drain_under_concurrent_load_answers_every_request_sent_before_the_signal() {
    let repo = Repo::new().bundled("digits");
    let mut server = TestServer::ready(repo.path(), &["--drain-delay", "0.3"], None).await;
    let body = json!({ "input": [heldout().pixels[3]] }).to_string();
    /// When each request was sent, and its status (`None`: the connection failed).
    type Log = Arc<Mutex<Vec<(Instant, Option<u16>)>>>;
    let log: Log = Arc::default();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (client, url, body, log) = (server.client.clone(), server.url("/predict"), body.clone(), log.clone());
            tokio::spawn(async move {
                let until = Instant::now() + Duration::from_secs(10);
                while Instant::now() < until {
                    let sent = Instant::now();
                    let status = client.post(&url).body(body.clone()).send().await.ok().map(|r| r.status().as_u16());
                    log.lock().expect("log").push((sent, status));
                    if status.is_none() {
                        break;
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    server.begin_shutdown();
    for c in clients {
        tokio::time::timeout(Duration::from_secs(20), c).await.expect("the clients finish").expect("task");
    }
    server.shutdown().await.expect("the server stops cleanly");
    let log = log.lock().expect("log").clone();
    let before: Vec<_> = log.iter().filter(|(sent, _)| *sent < signalled).collect();
    assert!(before.len() >= 8, "load ran before the signal: {}", before.len());
    assert!(before.iter().all(|(_, s)| *s == Some(200)), "every request sent before the signal is answered 200");
    assert!(log.iter().all(|(_, s)| s.is_none() || *s == Some(200)), "no request was answered with an error");
    let during_delay = log
        .iter()
        .filter(|(sent, s)| *sent >= signalled && *sent < signalled + Duration::from_millis(250) && *s == Some(200))
        .count();
    assert!(during_delay > 0, "requests sent during the drain delay are served");
    assert!(log.iter().filter(|(_, s)| s.is_none()).all(|(sent, _)| *sent >= signalled), "only after the signal");
}
