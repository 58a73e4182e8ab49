//! The app without a socket: probes while draining, and JSON 404s.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use super::*;
use crate::gpu::{GpuMonitor, NoGpu};
use crate::layers::MAX_REQUEST_ID_LEN;
use crate::metrics::Metrics;
use crate::registry::Registry;
use inferd_models::{EngineSettings, Repository};

fn state(draining: bool) -> AppState {
    let config = crate::ServeConfig::from_args(["--max-body-bytes", "1024"]).expect("parses");
    let settings = EngineSettings {
        onnx: inferd_models::OnnxSettings { library: "no-library".into(), shared_threads: 1 },
        default_precision: inferd_core::Precision::Fp32,
        builder: None,
        gpu_memory: None,
    };
    let metrics = Arc::new(Metrics::new(&[] as &[&str]));
    let registry = Registry::new(Repository::new("no-repository"), Vec::new(), settings, metrics);
    let gpu = GpuMonitor::new(Arc::new(NoGpu));
    let state = AppState::new(&config, registry, Default::default(), gpu).expect("state");
    if draining {
        state.drain().begin();
    }
    state
}

async fn get(state: AppState, path: &str) -> (StatusCode, serde_json::Value) {
    let r = app(state).oneshot(Request::get(path).body(Body::empty()).expect("request")).await.expect("infallible");
    let status = r.status();
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.expect("body");
    (status, serde_json::from_slice(&bytes).expect("JSON"))
}

#[tokio::test]
async fn draining_fails_readiness_at_once_but_not_liveness() {
    let (status, body) = get(state(false), "/health/ready").await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("ready")));
    let draining = state(true);
    let (status, body) = get(draining.clone(), "/health/ready").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["status"], "draining");
    let (status, body) = get(draining.clone(), "/health").await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("draining")));
    let (status, _) = get(draining, "/health/live").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn unknown_routes_and_models_are_json_404s() {
    let (status, body) = get(state(false), "/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].is_string());
    let r = app(state(false))
        .oneshot(Request::post("/models/x/predict").body(Body::from("{}")).expect("request"))
        .await
        .expect("infallible");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_request_id_is_echoed_only_when_it_is_a_plain_short_id() {
    let id_of = |sent: Vec<&'static [u8]>| async move {
        let mut request = Request::get("/health/live");
        for id in sent {
            request = request.header(REQUEST_ID_HEADER, axum::http::HeaderValue::from_bytes(id).expect("a header"));
        }
        let r = app(state(false)).oneshot(request.body(Body::empty()).expect("request")).await.expect("infallible");
        r.headers()[REQUEST_ID_HEADER].to_str().expect("visible").to_owned()
    };
    let fine = "req-42_a.b:c/d+e=f@g".to_owned();
    assert_eq!(id_of(vec![b"req-42_a.b:c/d+e=f@g"]).await, fine);
    let longest = "x".repeat(MAX_REQUEST_ID_LEN);
    assert_eq!(id_of(vec![Box::leak(longest.clone().into_boxed_str()).as_bytes()]).await, longest);
    let too_long: &'static [u8] = Box::leak("x".repeat(MAX_REQUEST_ID_LEN + 1).into_bytes().into_boxed_slice());
    for bad in [
        vec![too_long],
        vec![b"has space".as_slice()],
        vec![b"quote\"".as_slice()],
        vec![b"a".as_slice(), b"b".as_slice()],
    ] {
        let replaced = id_of(bad.clone()).await;
        assert_eq!(replaced.len(), 36, "a new UUID replaces {bad:?}: {replaced}");
        assert!(uuid::Uuid::parse_str(&replaced).is_ok(), "{replaced}");
    }
}

#[tokio::test]
async fn the_openapi_document_is_served_as_written_once_and_swagger_ui_reads_it() {
    let state = state(false);
    let expected = serde_json::to_vec(&api(&state).1).expect("the document as JSON");
    let send = |method: &str, path: &str| {
        let request = Request::builder().method(method).uri(path).body(Body::empty()).expect("request");
        app(state.clone()).oneshot(request)
    };
    let r = send("GET", OPENAPI_PATH).await.expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/json");
    let body = axum::body::to_bytes(r.into_body(), 1 << 22).await.expect("body");
    assert_eq!(body, expected);
    assert!(serde_json::from_slice::<serde_json::Value>(&body).expect("JSON")["paths"]["/v2"].is_object());
    let r = send("HEAD", OPENAPI_PATH).await.expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(axum::body::to_bytes(r.into_body(), 1 << 22).await.expect("body").is_empty());
    let r = send("GET", "/docs/swagger-initializer.js").await.expect("infallible");
    assert_eq!(r.status(), StatusCode::OK);
    let script = axum::body::to_bytes(r.into_body(), 1 << 22).await.expect("body");
    assert!(String::from_utf8_lossy(&script).contains("\"url\": \"/openapi.json\""), "{script:?}");
}
