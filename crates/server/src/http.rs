//! The HTTP front: the routes, the middleware every request passes (request id and span, auth, metrics, the
//! overall timeout) and the one inference path that `/predict` and the v2 `infer` routes share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, FromRequestParts, MatchedPath, Path, RawPathParams, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use inferd_batcher::{Batcher, InferRequest};
use inferd_core::{ModelMetadata, Tensor, TensorSpec};
use serde::ser::SerializeMap;
use serde::Serialize;
use subtle::ConstantTimeEq;
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::codec::{self, NestedJson};
use crate::config::Secret;
use crate::error::AppError;
use crate::gpu::{GpuInfo, GpuMonitor};
use crate::metrics::Metrics;
use crate::models::{Model, ModelState};
use crate::openapi::{self, ApiDoc, InferErrors};

/// Bodies above this size are decoded and encoded on the blocking pool rather than on the async runtime.
const INLINE_CODEC_BYTES: usize = 64 * 1024;

/// Response headers that say how a request was served.
pub const BATCH_SIZE_HEADER: &str = "x-inferd-batch-size";
pub const QUEUE_TIME_HEADER: &str = "x-inferd-queue-us";
pub const COMPUTE_TIME_HEADER: &str = "x-inferd-compute-us";
/// The request id: taken from the request, or made, and echoed in the response.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Milliseconds a `/predict` request may wait in the queue before it is answered 503 without running.
pub const TIMEOUT_HEADER: &str = "x-inferd-timeout-ms";

/// What every route shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    /// Sorted by name.
    pub models: Vec<Arc<Model>>,
    /// The model `/predict` serves, if it is determined.
    pub default_model: Option<String>,
    pub gpu: GpuMonitor,
    pub metrics: Metrics,
    /// Set once shutdown begins: readiness fails from then on.
    pub draining: AtomicBool,
    /// Turns true when the drain timeout has passed: every request still being handled is answered 503 then.
    pub drain_expired: tokio::sync::watch::Sender<bool>,
    pub require_gpu: bool,
    pub max_body_bytes: usize,
    pub limits: Limits,
    /// Longest a request may take in all.
    pub request_timeout: Duration,
    /// Accepted API keys; none means the server is open.
    pub api_keys: Vec<Secret>,
    /// Whether /metrics needs a key too.
    pub protect_metrics: bool,
}

impl Shared {
    /// The state for `models` under `config`; fails only where the API key file cannot be read.
    pub fn new(
        config: &crate::ServeConfig,
        models: Vec<Arc<Model>>,
        default_model: Option<String>,
        gpu: GpuMonitor,
    ) -> anyhow::Result<Shared> {
        let names: Vec<&str> = models.iter().map(|m| m.name()).collect();
        let metrics = Metrics::new(&names);
        Ok(Shared {
            default_model,
            gpu,
            metrics,
            draining: AtomicBool::new(false),
            drain_expired: tokio::sync::watch::Sender::new(false),
            require_gpu: config.require_gpu,
            max_body_bytes: config.max_body_bytes,
            limits: Limits {
                max_elements: config.max_elements,
                max_rows: config.max_rows,
                max_json_depth: config.max_json_depth,
            },
            request_timeout: config.request_timeout(),
            api_keys: config.api_keys()?,
            protect_metrics: config.protect_metrics,
            models,
        })
    }
}

/// What one request may carry, beyond the body size.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_elements: usize,
    pub max_rows: usize,
    pub max_json_depth: usize,
}

impl Limits {
    /// Refuses a decoded request that is over the element or row limits (413).
    fn check(&self, inputs: &[Tensor]) -> Result<(), AppError> {
        let rows = inputs.first().and_then(|t| t.shape().first().copied()).unwrap_or(0);
        if rows > self.max_rows {
            return Err(AppError::PayloadTooLarge(format!(
                "the request has {rows} rows; this server takes at most {} per request (--max-rows)",
                self.max_rows
            )));
        }
        let elements: usize = inputs.iter().map(Tensor::element_count).sum();
        if elements > self.max_elements {
            return Err(AppError::PayloadTooLarge(format!(
                "the request has {elements} tensor elements; this server takes at most {} per request (--max-elements)",
                self.max_elements
            )));
        }
        Ok(())
    }
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

/// The routes that need no key: the probes, and /metrics unless --protect-metrics.
fn open_routes(protect_metrics: bool) -> OpenApiRouter<AppState> {
    let open = OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(live))
        .routes(routes!(ready))
        .merge(crate::v2::health_routes());
    if protect_metrics {
        open
    } else {
        open.routes(routes!(metrics))
    }
}

/// The routes that need a key when one is configured.
fn protected_routes(protect_metrics: bool) -> OpenApiRouter<AppState> {
    let protected =
        OpenApiRouter::new().routes(routes!(predict_default)).routes(routes!(predict_named)).merge(crate::v2::routes());
    if protect_metrics {
        protected.routes(routes!(metrics))
    } else {
        protected
    }
}

/// Every documented route, and the OpenAPI document built from the same registrations.
pub fn api(state: &AppState) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let protected =
        protected_routes(state.0.protect_metrics).route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(open_routes(state.0.protect_metrics))
        .merge(protected)
        .route_layer(middleware::from_fn_with_state(state.clone(), guard))
        .split_for_parts()
}

pub fn app(state: AppState) -> Router {
    let max_body = state.0.max_body_bytes;
    let (routes, api) = api(&state);
    let request_id = HeaderName::from_static(REQUEST_ID_HEADER);
    routes
        .merge(utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", api))
        .fallback(|| async { AppError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { AppError::MethodNotAllowed("method not allowed on this route".into()) })
        .layer(DefaultBodyLimit::max(max_body))
        // The body limit applies to what the decompression layer hands on, so a small compressed body cannot
        // expand past it.
        .layer(tower_http::decompression::RequestDecompressionLayer::new())
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
                .on_failure(()),
        )
        .layer(SetRequestIdLayer::new(request_id, RandomRequestId))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            AppError::Internal("the request handler panicked".into()).into_response()
        }))
        .with_state(state)
}

/// Request ids for requests that come without one: random (version 4) UUIDs from a per-thread generator seeded
/// once, rather than a `getrandom` system call per request.
#[derive(Clone, Copy)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let id = uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes()).into_uuid();
        let mut text = uuid::Uuid::encode_buffer();
        HeaderValue::from_str(id.hyphenated().encode_lower(&mut text)).ok().map(RequestId::new)
    }
}

/// The span every request runs in; the batcher carries it to the worker thread that serves the request.
fn request_span<B>(request: &axum::http::Request<B>) -> tracing::Span {
    let id = request.headers().get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
    tracing::info_span!("request", id = %id, method = %request.method(), path = %request.uri().path())
}

/// Lets a request through when no key is configured or it carries one of the keys. Keys are compared in
/// constant time, every key every time.
async fn authorize(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let keys = &state.0.api_keys;
    if keys.is_empty() {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim().as_bytes());
    let Some(given) = given else {
        return AppError::Unauthorized("this route needs an API key: send `Authorization: Bearer <key>`".into())
            .into_response();
    };
    let accepted = keys.iter().fold(subtle::Choice::from(0), |ok, key| ok | key.expose().as_bytes().ct_eq(given));
    if bool::from(accepted) {
        next.run(request).await
    } else {
        AppError::Unauthorized("the API key is not valid".into()).into_response()
    }
}

/// Around every route: the overall timeout, the end of the drain, and the request metrics of inference routes.
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let labels = inference_labels(&state, &mut parts).await;
    let request = Request::from_parts(parts, body);
    let metrics = &state.0.metrics;
    let in_flight = labels.as_ref().map(|(model, protocol)| metrics.in_flight(model, protocol));
    if let Some(g) = &in_flight {
        g.increment(1);
    }
    let started = Instant::now();
    let timeout = state.0.request_timeout;
    let mut expired = state.0.drain_expired.subscribe();
    let response = tokio::select! {
        response = next.run(request) => response,
        () = tokio::time::sleep(timeout) => AppError::Unavailable(format!(
            "the request took longer than {} s (--request-timeout)", timeout.as_secs_f64()
        )).into_response(),
        () = async { if expired.wait_for(|e| *e).await.is_err() { std::future::pending().await } } => {
            AppError::Unavailable("the server shut down before the request finished (--drain-timeout)".into())
                .into_response()
        }
    };
    if let Some(g) = &in_flight {
        g.decrement(1);
    }
    if let Some((model, protocol)) = labels {
        metrics.request_done(model, protocol, response.status().as_u16(), started.elapsed());
    }
    response
}

/// The `model` and `protocol` labels of an inference route; `None` for the other routes. A model this server
/// does not have is labelled `""`, so clients cannot mint series.
async fn inference_labels<'a>(
    state: &'a AppState,
    parts: &mut axum::http::request::Parts,
) -> Option<(&'a str, &'static str)> {
    let protocol = match parts.extensions.get::<MatchedPath>()?.as_str() {
        "/predict" => return Some((state.0.default_model.as_deref().unwrap_or_default(), "predict")),
        "/models/{name}/predict" => "predict",
        p if p.starts_with("/v2/models/") && p.ends_with("/infer") => "v2",
        _ => return None,
    };
    let params = RawPathParams::from_request_parts(parts, state).await.ok()?;
    let name = params.iter().find(|(k, _)| *k == "name" || *k == "model").map(|(_, v)| v)?;
    let known = state.0.models.iter().find(|m| m.name() == name);
    Some((known.map_or("", |m| m.name()), protocol))
}

/// Serve `/predict` with the default model.
#[utoipa::path(
    post, path = "/predict", tag = "inference",
    request_body(content = openapi::PredictRequest, description = "One input as `input`, or several by name in `inputs`."),
    params(openapi::TimeoutHeader),
    responses((status = 200, body = openapi::PredictResponse, headers(
        ("x-inferd-batch-size" = u64, description = "Rows in the batch that served the request"),
        ("x-inferd-queue-us" = u64, description = "Microseconds queued"),
        ("x-inferd-compute-us" = u64, description = "Microseconds the batch computed"))), InferErrors),
    security(("api_key" = []))
)]
async fn predict_default(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let name = state.0.default_model.clone().ok_or_else(|| {
        AppError::BadRequest(format!(
            "this server has several models ({}): use /models/{{name}}/predict, or start it with --default-model",
            state.model_names()
        ))
    })?;
    predict(state, &name, &headers, body).await
}

/// Serve `/predict` with the named model.
#[utoipa::path(
    post, path = "/models/{name}/predict", tag = "inference",
    request_body(content = openapi::PredictRequest, description = "One input as `input`, or several by name in `inputs`."),
    params(("name" = String, Path, description = "The model"), openapi::TimeoutHeader),
    responses((status = 200, body = openapi::PredictResponse), InferErrors),
    security(("api_key" = []))
)]
async fn predict_named(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let Path(name) = name.map_err(|e| AppError::BadRequest(e.body_text()))?;
    predict(state, &name, &headers, body).await
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

/// A deadline `after` from now, or none where that is past the end of time.
pub(crate) fn deadline_in(after: Duration) -> Option<Instant> {
    Instant::now().checked_add(after)
}

/// The path every inference route shares: decode the body (on the blocking pool when large), check it against
/// the limits, queue it with the model's batcher in the request's span, encode the answer the same way.
/// `decode` returns the request and whatever `encode` needs from it; its errors are the client's (400),
/// `encode`'s are ours (500). Returns the encoded answer and the headers that say how it was served.
pub(crate) async fn run_inference<C: Send + 'static, T: Send + 'static>(
    state: &AppState,
    batcher: Batcher,
    body: Bytes,
    decode: impl FnOnce(&[u8], &ModelMetadata, &Limits) -> Result<(InferRequest, C), String> + Send + 'static,
    encode: impl FnOnce(&ModelMetadata, &[Tensor], C) -> Result<T, String> + Send + 'static,
) -> Result<(T, HeaderMap), AppError> {
    let decoder = batcher.clone();
    let limits = state.0.limits;
    let (mut request, context) = codec_work(body.len(), move || decode(&body, decoder.metadata(), &limits))
        .await?
        .map_err(|e| AppError::BadRequest(format!("model `{}`: {e}", batcher.name())))?;
    limits.check(&request.inputs)?;
    // Decoding may have run on the blocking pool: the request's span is this task's.
    request.span = tracing::Span::current();
    let answer = batcher.infer(request).await?;
    let headers = served_headers(answer.batch_rows, answer.queue_time, answer.compute_time);
    let out_bytes: usize = answer.outputs.iter().map(|t| t.element_count() * 12).sum();
    let encoder = batcher.clone();
    let encoded = codec_work(out_bytes, move || encode(encoder.metadata(), &answer.outputs, context))
        .await?
        .map_err(|e| AppError::Internal(format!("encoding the response: {e}")))?;
    Ok((encoded, headers))
}

/// The queue deadline an `x-inferd-timeout-ms` header asks for.
fn timeout_header(headers: &HeaderMap) -> Result<Option<Instant>, AppError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else { return Ok(None) };
    let ms: u64 = value
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| AppError::BadRequest(format!("{TIMEOUT_HEADER} must be a whole number of milliseconds")))?;
    Ok(deadline_in(Duration::from_millis(ms)))
}

async fn predict(
    state: AppState,
    name: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let batcher = state.batcher(name)?;
    let deadline = timeout_header(headers)?;
    let body = body.map_err(body_error)?;
    let model = name.to_owned();
    let (body, headers) = run_inference(
        &state,
        batcher,
        body,
        move |body, meta, limits| {
            codec::check_json_depth(body, limits.max_json_depth)?;
            let inputs = codec::decode_predict(body, &meta.inputs)?;
            Ok((InferRequest::new(inputs).with_deadline(deadline), ()))
        },
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

fn served_headers(batch_rows: usize, queue: Duration, compute: Duration) -> HeaderMap {
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

#[derive(Serialize, utoipa::ToSchema)]
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

#[derive(Serialize, utoipa::ToSchema)]
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

/// The server's status, its GPUs and its models.
#[utoipa::path(get, path = "/health", tag = "health", responses(
    (status = 200, body = Health, description = "Every model is ready"),
    (status = 503, body = Health, description = "Starting, degraded or draining: `reason` says why")))]
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

/// Liveness: the process answers. Touches no GPU and no worker.
#[utoipa::path(get, path = "/health/live", tag = "health", responses((status = 200, body = openapi::Status)))]
async fn live() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "alive" }))
}

/// Readiness: every model loaded and warmed, and the server not draining.
#[utoipa::path(get, path = "/health/ready", tag = "health", responses(
    (status = 200, body = openapi::Status), (status = 503, body = openapi::Status)))]
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

/// Prometheus exposition text.
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses((status = 200, content_type = "text/plain; version=0.0.4", body = String)))]
async fn metrics(State(state): State<AppState>) -> Response {
    let gpus = state.0.gpu.snapshot();
    let text = state.0.metrics.render(&state.0.models, &gpus);
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"))], text)
        .into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;
    use crate::gpu::NoGpu;

    fn state(draining: bool) -> AppState {
        let config = crate::ServeConfig::from_args(["--max-body-bytes", "1024"]).expect("parses");
        let shared = Shared::new(&config, Vec::new(), None, GpuMonitor::new(Arc::new(NoGpu))).expect("state");
        shared.draining.store(draining, Ordering::Relaxed);
        AppState::new(shared)
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
