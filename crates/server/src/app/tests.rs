//! The app without a socket: probes while draining, and JSON 404s.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use super::*;
use crate::gpu::{GpuMonitor, NoGpu};
use crate::registry::Registry;
use crate::repository::EngineSettings;

fn state(draining: bool) -> AppState {
    let config = crate::ServeConfig::from_args(["--max-body-bytes", "1024"]).expect("parses");
    let settings = EngineSettings {
        onnx: inferd_onnx::OnnxSettings { library: "no-library".into(), default_intra_op_threads: 1 },
        default_precision: inferd_core::Precision::Fp32,
        builder: None,
    };
    let registry = Registry::new("no-repository".into(), Vec::new());
    let state = AppState::new(&config, registry, Default::default(), settings, GpuMonitor::new(Arc::new(NoGpu)))
        .expect("state");
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
