//! The HTTP routes: `/predict`, `/models/{name}/predict` and the health probes, over one shared state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use inferd_batcher::{Batcher, InferRequest};
use inferd_core::{ModelMetadata, Tensor, TensorSpec};
use serde::ser::SerializeMap;
use serde::Serialize;

use crate::codec::{self, NestedJson};
use crate::error::AppError;
use crate::gpu::{GpuInfo, GpuMonitor};
use crate::models::{Model, ModelState};

/// Bodies above this size are decoded and encoded on the blocking pool rather than on the async runtime.
const INLINE_CODEC_BYTES: usize = 64 * 1024;

/// Response headers that say how a request was served.
pub const BATCH_SIZE_HEADER: &str = "x-inferd-batch-size";
pub const QUEUE_TIME_HEADER: &str = "x-inferd-queue-us";
pub const COMPUTE_TIME_HEADER: &str = "x-inferd-compute-us";

/// What every route shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    /// Sorted by name.
    pub models: Vec<Arc<Model>>,
    /// The model `/predict` serves, if it is determined.
    pub default_model: Option<String>,
    pub gpu: GpuMonitor,
    /// Set once shutdown begins: readiness fails from then on.
    pub draining: AtomicBool,
    pub require_gpu: bool,
    pub max_body_bytes: usize,
}

impl AppState {
    pub fn new(shared: Shared) -> Self {
        AppState(Arc::new(shared))
    }

    pub fn shared(&self) -> &Shared {
        &self.0
    }

    pub(crate) fn model(&self, name: &str) -> Result<&Arc<Model>, AppError> {
        self.0.models.iter().find(|m| m.name() == name).ok_or_else(|| {
            AppError::NotFound(format!("no model named `{name}` (this server has {})", self.model_names()))
        })
    }

    fn model_names(&self) -> String {
        self.0.models.iter().map(|m| format!("`{}`", m.name())).collect::<Vec<_>>().join(", ")
    }

    /// The model's running batcher, or why there is none.
    pub(crate) fn batcher(&self, name: &str) -> Result<Batcher, AppError> {
        match self.model(name)?.state() {
            ModelState::Ready(batcher) => Ok(batcher.clone()),
            ModelState::Loading => Err(AppError::Unavailable(format!("model `{name}` is still loading"))),
            ModelState::Failed(e) => Err(AppError::Unavailable(format!("model `{name}` failed to load: {e}"))),
        }
    }

    /// Why the server is not ready, or `None` when it is.
    pub(crate) fn readiness(&self) -> Option<String> {
        match self.assess(&self.0.gpu.snapshot()) {
            ("healthy", _) => None,
            (status, reason) => Some(reason.unwrap_or_else(|| status.to_owned())),
        }
    }

    /// The server's overall status and, when not ready, why.
    fn assess(&self, gpus: &[GpuInfo]) -> (&'static str, Option<String>) {
        if self.0.draining.load(Ordering::Relaxed) {
            return ("draining", Some("the server is shutting down".into()));
        }
        let mut degraded = None;
        for model in &self.0.models {
            match model.state() {
                ModelState::Loading => return ("starting", Some(format!("model `{}` is still loading", model.name()))),
                ModelState::Failed(e) => {
                    degraded.get_or_insert_with(|| format!("model `{}` failed to load: {e}", model.name()));
                }
                ModelState::Ready(_) => {}
            }
        }
        if degraded.is_none() && self.0.require_gpu {
            degraded = if gpus.is_empty() {
                Some("a GPU is required (--require-gpu), but none is visible".into())
            } else {
                self.0.models.iter().filter_map(|m| m.batcher()).find(|b| !b.metadata().on_gpu()).map(|b| {
                    format!(
                        "a GPU is required (--require-gpu), but model `{}` runs on {}",
                        b.name(),
                        b.metadata().device
                    )
                })
            };
        }
        match degraded {
            Some(reason) => ("degraded", Some(reason)),
            None => ("healthy", None),
        }
    }
}

pub fn app(state: AppState) -> Router {
    let max_body = state.0.max_body_bytes;
    Router::new()
        .route("/predict", post(predict_default))
        .route("/models/{name}/predict", post(predict_named))
        .route("/health", get(health))
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .merge(crate::v2::routes())
        .fallback(|| async { AppError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { AppError::MethodNotAllowed("method not allowed on this route".into()) })
        .layer(DefaultBodyLimit::max(max_body))
        // The body limit applies to what the decompression layer hands on, so a small compressed body cannot
        // expand past it.
        .layer(tower_http::decompression::RequestDecompressionLayer::new())
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            AppError::Internal("the request handler panicked".into()).into_response()
        }))
        .with_state(state)
}

async fn predict_default(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let name = state.0.default_model.clone().ok_or_else(|| {
        AppError::BadRequest(format!(
            "this server has several models ({}): use /models/{{name}}/predict, or start it with --default-model",
            state.model_names()
        ))
    })?;
    predict(state, &name, body).await
}

async fn predict_named(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let Path(name) = name.map_err(|e| AppError::BadRequest(e.body_text()))?;
    predict(state, &name, body).await
}

pub(crate) fn body_error(rejection: BytesRejection) -> AppError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        AppError::PayloadTooLarge("the request body is larger than this server takes (--max-body-bytes)".into())
    } else {
        AppError::BadRequest(rejection.body_text())
    }
}

/// Runs codec work inline when it is small, on the blocking pool when it is not.
pub(crate) async fn codec_work<T: Send + 'static>(
    size: usize,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AppError> {
    if size <= INLINE_CODEC_BYTES {
        Ok(work())
    } else {
        tokio::task::spawn_blocking(work).await.map_err(|e| AppError::Internal(format!("codec task failed: {e}")))
    }
}

/// The path every inference route shares: decode the body (on the blocking pool when large), queue the request
/// with the model's batcher, encode the answer the same way. `decode` returns the request and whatever `encode`
/// needs from it; its errors are the client's (400), `encode`'s are ours (500). Returns the encoded answer and
/// the headers that say how it was served.
pub(crate) async fn run_inference<C: Send + 'static, T: Send + 'static>(
    batcher: Batcher,
    body: Bytes,
    decode: impl FnOnce(&[u8], &ModelMetadata) -> Result<(InferRequest, C), String> + Send + 'static,
    encode: impl FnOnce(&ModelMetadata, &[Tensor], C) -> Result<T, String> + Send + 'static,
) -> Result<(T, HeaderMap), AppError> {
    let decoder = batcher.clone();
    let (request, context) = codec_work(body.len(), move || decode(&body, decoder.metadata()))
        .await?
        .map_err(|e| AppError::BadRequest(format!("model `{}`: {e}", batcher.name())))?;
    let answer = batcher.infer(request).await?;
    let headers = served_headers(answer.batch_rows, answer.queue_time, answer.compute_time);
    let out_bytes: usize = answer.outputs.iter().map(|t| t.element_count() * 12).sum();
    let encoder = batcher.clone();
    let encoded = codec_work(out_bytes, move || encode(encoder.metadata(), &answer.outputs, context))
        .await?
        .map_err(|e| AppError::Internal(format!("encoding the response: {e}")))?;
    Ok((encoded, headers))
}

async fn predict(state: AppState, name: &str, body: Result<Bytes, BytesRejection>) -> Result<Response, AppError> {
    let batcher = state.batcher(name)?;
    let body = body.map_err(body_error)?;
    let model = name.to_owned();
    let (body, headers) = run_inference(
        batcher,
        body,
        |body, meta| Ok((InferRequest { inputs: codec::decode_predict(body, &meta.inputs)?, deadline: None }, ())),
        move |meta, outputs, ()| {
            serde_json::to_vec(&PredictResponse {
                prediction: Prediction { outputs, specs: &meta.outputs },
                model: &model,
                device: &meta.device,
            })
            .map_err(|e| e.to_string())
        },
    )
    .await?;
    Ok((headers, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response())
}

fn served_headers(batch_rows: usize, queue: std::time::Duration, compute: std::time::Duration) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        (BATCH_SIZE_HEADER, batch_rows as u128),
        (QUEUE_TIME_HEADER, queue.as_micros()),
        (COMPUTE_TIME_HEADER, compute.as_micros()),
    ] {
        headers.insert(name, HeaderValue::from(value as u64));
    }
    headers
}

#[derive(Serialize)]
struct PredictResponse<'a> {
    prediction: Prediction<'a>,
    model: &'a str,
    device: &'a str,
}

/// One output: its nested array. Several: an object of them by name.
struct Prediction<'a> {
    outputs: &'a [Tensor],
    specs: &'a [TensorSpec],
}

impl Serialize for Prediction<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if let [only] = self.outputs {
            return NestedJson(only).serialize(serializer);
        }
        let mut map = serializer.serialize_map(Some(self.outputs.len()))?;
        for (spec, t) in self.specs.iter().zip(self.outputs) {
            map.serialize_entry(&spec.name, &NestedJson(t))?;
        }
        map.end()
    }
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    gpu_available: bool,
    gpu_name: Option<String>,
    gpus: Vec<GpuInfo>,
    models: Vec<ModelHealth>,
    version: &'static str,
}

#[derive(Serialize)]
struct ModelHealth {
    name: String,
    backend: &'static str,
    ready: bool,
    state: &'static str,
    device: Option<String>,
    precision: Option<&'static str>,
    queue_depth: usize,
    requests: u64,
    batches: u64,
    rows: u64,
    error: Option<String>,
}

fn model_health(model: &Model) -> ModelHealth {
    let mut h = ModelHealth {
        name: model.name().to_owned(),
        backend: model.config.backend.as_str(),
        ready: false,
        state: "loading",
        device: None,
        precision: None,
        queue_depth: 0,
        requests: 0,
        batches: 0,
        rows: 0,
        error: None,
    };
    match model.state() {
        ModelState::Loading => {}
        ModelState::Failed(e) => {
            h.state = "failed";
            h.error = Some(e.to_owned());
        }
        ModelState::Ready(b) => {
            let stats = b.stats();
            h.ready = true;
            h.state = "ready";
            h.device = Some(b.metadata().device.clone());
            h.precision = Some(b.metadata().precision.as_str());
            h.queue_depth = b.queue_depth();
            h.requests = stats.requests.load(Ordering::Relaxed);
            h.batches = stats.batches.load(Ordering::Relaxed);
            h.rows = stats.rows.load(Ordering::Relaxed);
        }
    }
    h
}

async fn health(State(state): State<AppState>) -> Response {
    let gpus = state.0.gpu.snapshot();
    let (status, reason) = state.assess(&gpus);
    let body = Health {
        status,
        reason,
        gpu_available: !gpus.is_empty(),
        gpu_name: gpus.first().map(|g| g.name.clone()),
        gpus: gpus.as_ref().clone(),
        models: state.0.models.iter().map(|m| model_health(m)).collect(),
        version: env!("CARGO_PKG_VERSION"),
    };
    let code = if status == "healthy" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(body)).into_response()
}

async fn live() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "alive" }))
}

async fn ready(State(state): State<AppState>) -> Response {
    match state.assess(&state.0.gpu.snapshot()) {
        ("healthy", _) => Json(serde_json::json!({ "status": "ready" })).into_response(),
        (status, reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "status": status, "error": reason.unwrap_or_default() })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::gpu::NoGpu;

    fn state(draining: bool) -> AppState {
        AppState::new(Shared {
            models: Vec::new(),
            default_model: None,
            gpu: GpuMonitor::new(Arc::new(NoGpu)),
            draining: AtomicBool::new(draining),
            require_gpu: false,
            max_body_bytes: 1024,
        })
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
}
