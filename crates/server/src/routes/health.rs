//! The probes orchestrators call (`/health`, `/health/live`, `/health/ready`; SageMaker's `GET /ping` and TEI's `GET /`,
//! which answer as readiness does) and Prometheus's `/metrics`.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::gpu::GpuInfo;
use crate::registry::readiness::Assessment;
use crate::registry::{ModelEntry, ModelState};
use crate::state::AppState;

/// The probes: open to all.
pub fn probe_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(live))
        .routes(routes!(ready))
        .routes(routes!(ping))
        .routes(routes!(root))
}

/// `/metrics`: open, unless `--protect-metrics`.
pub fn metrics_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// The server's status, its GPUs and its models.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Health<'a> {
    /// `healthy`, `starting`, `degraded` or `draining`.
    status: &'static str,
    /// Why the server is not healthy.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    gpu_available: bool,
    gpu_name: Option<&'a str>,
    gpus: &'a [GpuInfo],
    /// The inferd process's resident memory (host RAM), all models together.
    process_resident_memory_bytes: Option<u64>,
    models: Vec<ModelHealth<'a>>,
    /// `--model-control poll`: why the last reading of the repository left something as it was (a store that
    /// refused the credentials, a version that failed to load); what served before serves on.
    #[serde(skip_serializing_if = "Option::is_none")]
    repository_error: Option<String>,
    version: &'static str,
}

/// One model's state and counters.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ModelHealth<'a> {
    name: &'a str,
    /// `1`, or the number of its version folder.
    version: u64,
    backend: &'static str,
    /// `tensors`, or `embed` for a text model.
    task: &'static str,
    ready: bool,
    /// `loading`, `ready`, `stalled` (a batch has run past `--stall-timeout`), `failed`, or `unloaded` (by model
    /// control); `error` says why for the last three.
    state: &'static str,
    device: Option<&'a str>,
    precision: Option<&'static str>,
    /// Whether it ran its warm-up; false while loading, and for a model whose input shapes are not all known and
    /// whose `[warmup]` gives none (its first requests pay for the engine's set-up).
    warmed: bool,
    /// Rows per batch at most; 0 when each request runs alone, as sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_batch_size: Option<usize>,
    queue_depth: usize,
    requests: u64,
    batches: u64,
    rows: u64,
    /// Why the model is stalled, failed to load, or is unloaded.
    error: Option<&'a str>,
    /// Text models: the embedding's length.
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<usize>,
    /// Text models: tokens per text at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_seq_len: Option<usize>,
    /// Its weights as its engines hold them, all instances together: host memory on the CPU, device memory on a
    /// GPU. Absent while loading, or where the engine cannot tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    weight_bytes: Option<u64>,
    /// GPU models: the device memory its load and warm-up took (weights, the engine's workspace and arena).
    #[serde(skip_serializing_if = "Option::is_none")]
    device_memory_bytes: Option<u64>,
}

impl<'a> ModelHealth<'a> {
    fn of(model: &'a ModelEntry, stall: Option<&'a str>) -> Self {
        let mut h = ModelHealth {
            name: model.name(),
            version: model.version(),
            backend: model.config.backend.as_str(),
            task: model.config.task.as_str(),
            ready: false,
            state: "loading",
            device: None,
            precision: None,
            warmed: false,
            max_batch_size: None,
            queue_depth: 0,
            requests: 0,
            batches: 0,
            rows: 0,
            error: None,
            dimensions: None,
            max_seq_len: None,
            weight_bytes: None,
            device_memory_bytes: None,
        };
        match model.state() {
            ModelState::Loading => {}
            ModelState::Failed(e) => {
                h.state = "failed";
                h.error = Some(e);
            }
            ModelState::Unloaded(why) => {
                h.state = "unloaded";
                h.error = Some(why);
            }
            ModelState::Ready(loaded) => {
                let b = &loaded.batcher;
                if let Some(text) = loaded.batchers().find_map(|b| b.metadata().text.as_ref()) {
                    h.dimensions = Some(text.dimensions);
                    h.max_seq_len = Some(text.max_seq_len);
                }
                h.ready = stall.is_none();
                h.state = if stall.is_none() { "ready" } else { "stalled" };
                h.error = stall;
                h.device = Some(&b.metadata().device);
                h.precision = Some(b.metadata().precision.as_str());
                h.warmed = loaded.warmed;
                h.max_batch_size = Some(loaded.batching.max_batch_size);
                h.weight_bytes = loaded.memory.weight_bytes;
                h.device_memory_bytes = loaded.memory.device_bytes;
                h.queue_depth = loaded.batchers().map(|b| b.queue_depth()).sum();
                if let Some(counts) = model.counts() {
                    h.requests = counts.requests.load(Ordering::Relaxed);
                    h.batches = counts.batches.load(Ordering::Relaxed);
                    h.rows = counts.rows.load(Ordering::Relaxed);
                }
            }
        }
        h
    }
}

/// The server's status, its GPUs and its models.
#[utoipa::path(get, path = "/health", tag = "health", responses(
    (status = 200, body = Health, description = "Ready (--strict-readiness: every model, or at least one)"),
    (status = 503, body = Health, description = "Starting, degraded or draining: `reason` says why")))]
async fn health(State(state): State<AppState>) -> Response {
    let gpus = state.gpu().snapshot();
    let assessment = state.assess(&gpus);
    let models = state.models();
    let stalls: Vec<Option<String>> = models.iter().map(|m| state.stalls().stall(m)).collect();
    let body = Health {
        status: assessment.status.as_str(),
        reason: assessment.reason,
        gpu_available: !gpus.is_empty(),
        gpu_name: gpus.first().map(|g| g.name.as_str()),
        gpus: &gpus,
        process_resident_memory_bytes: crate::metrics::resident_memory_bytes(),
        models: models.iter().zip(&stalls).map(|(m, stall)| ModelHealth::of(m, stall.as_deref())).collect(),
        repository_error: state.registry().poll_problem(),
        version: env!("CARGO_PKG_VERSION"),
    };
    let code = if assessment.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(body)).into_response()
}

/// A probe's answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ProbeStatus {
    /// `alive`, `ready`, `starting`, `degraded` or `draining`.
    status: &'static str,
    /// Why the server is not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Liveness: the process answers. Touches no GPU and no worker.
#[utoipa::path(get, path = "/health/live", tag = "health", responses((status = 200, body = ProbeStatus)))]
async fn live() -> Json<ProbeStatus> {
    Json(ProbeStatus { status: "alive", error: None })
}

/// Readiness: every model loaded and warmed (with `--strict-readiness false`, at least one), and the server not
/// draining.
#[utoipa::path(get, path = "/health/ready", tag = "health", responses(
    (status = 200, body = ProbeStatus), (status = 503, body = ProbeStatus)))]
async fn ready(state: State<AppState>) -> Response {
    readiness(state).await
}

/// Readiness, as SageMaker's container contract asks it: 200 once the server is ready.
#[utoipa::path(get, path = "/ping", tag = "health", responses(
    (status = 200, body = ProbeStatus), (status = 503, body = ProbeStatus)))]
async fn ping(state: State<AppState>) -> Response {
    readiness(state).await
}

/// Readiness, as TEI answers `GET /`.
#[utoipa::path(get, path = "/", tag = "health", responses(
    (status = 200, body = ProbeStatus), (status = 503, body = ProbeStatus)))]
async fn root(state: State<AppState>) -> Response {
    readiness(state).await
}

/// The readiness probe's answer: what `/health/ready`, `/ping`, `GET /` and Vertex AI's health route answer.
pub(crate) async fn readiness(State(state): State<AppState>) -> Response {
    match state.assess(&state.gpu().snapshot()) {
        Assessment { ready: true, .. } => Json(ProbeStatus { status: "ready", error: None }).into_response(),
        Assessment { status, reason, .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(ProbeStatus { status: status.as_str(), error: Some(reason.unwrap_or_default()) }),
        )
            .into_response(),
    }
}

/// Prometheus exposition text.
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses((status = 200, content_type = "text/plain; version=0.0.4", body = String)))]
async fn metrics(State(state): State<AppState>) -> Response {
    let gpus = state.gpu().snapshot();
    let models = state.models();
    let versions = models.iter().map(|m| {
        let loaded = m.loaded();
        (m.name(), loaded.map_or(0, |l| l.batchers().map(|b| b.queue_depth()).sum()), loaded.map(|l| l.memory))
    });
    let text = state.metrics().render(versions, &gpus);
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"))], text)
        .into_response()
}
