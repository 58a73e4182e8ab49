//! The KServe v2 / Open Inference Protocol routes, so that Triton's clients work unchanged, with Triton's model
//! repository extension (the index, and load and unload under `--model-control explicit`). A model serves version
//! `1`, or the numbered version folders its policy chooses; routes without a version serve the newest ready one.
//! The inference wire format itself is the codec's ([`crate::codec::v2`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferd_batcher::InferRequest;
use inferd_core::{DataType, TensorSpec};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::codec::v2::{decode_infer, encode_infer, V2InferRequest, V2InferResponse, JSON_LENGTH_HEADER};
use crate::codec::{quoted, CodecError, Limits};
use crate::config::ModelControl;
use crate::error::{AppError, ErrorBody, InferErrors};
use crate::infer::{body_error, deadline_in, infer, Job, Outputs, WireFormat};
use crate::registry::{ControlError, Model, ModelState};
use crate::repository::Endpoint;
use crate::state::AppState;

/// The path parameter that names the model.
pub const MODEL_PARAM: &str = "model";

/// The server probes, open to all.
pub fn probe_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(server_live)).routes(routes!(server_ready))
}

/// Metadata, readiness, configuration and the repository, behind the API key when one is configured.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(server_metadata))
        .routes(routes!(repository_index))
        .routes(routes!(repository_load))
        .routes(routes!(repository_unload))
        .routes(routes!(model_metadata))
        .routes(routes!(version_metadata))
        .routes(routes!(model_ready))
        .routes(routes!(version_ready))
        .routes(routes!(model_config))
        .routes(routes!(version_config))
}

/// Inference, behind the API key when one is configured.
pub fn inference_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(infer_latest)).routes(routes!(infer_version))
}

/// The model a v2 route names (percent-decoded), and the version, if it names one.
struct ModelName(String, Option<u64>);

impl<S: Send + Sync> FromRequestParts<S> for ModelName {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| AppError::bad_request(e.body_text()))?;
        let name = params.get(MODEL_PARAM).cloned().unwrap_or_default();
        let version = match params.get("version") {
            None => None,
            Some(v) => Some(v.parse::<u64>().ok().filter(|&v| v > 0).ok_or_else(|| {
                AppError::not_found(format!(
                    "model `{}` has no version `{}`: versions are positive numbers",
                    quoted(&name),
                    quoted(v)
                ))
            })?),
        };
        Ok(ModelName(name, version))
    }
}

impl ModelName {
    fn endpoint(&self, state: &AppState) -> Result<Endpoint, AppError> {
        state.endpoint_of(&*self.model(state)?)
    }

    fn model(&self, state: &AppState) -> Result<Arc<Model>, AppError> {
        state.model_version(&self.0, self.1)
    }
}

/// `GET /v2`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct V2ServerMetadata {
    name: &'static str,
    version: &'static str,
    extensions: [&'static str; 2],
}

/// Server metadata.
#[utoipa::path(get, path = "/v2", tag = "kserve-v2", responses((status = 200, body = V2ServerMetadata)),
    security(("api_key" = [])))]
async fn server_metadata() -> Json<V2ServerMetadata> {
    Json(V2ServerMetadata {
        name: "inferd",
        version: env!("CARGO_PKG_VERSION"),
        extensions: ["binary_tensor_data", "model_repository"],
    })
}

/// Server liveness.
#[utoipa::path(get, path = "/v2/health/live", tag = "kserve-v2", responses((status = 200, description = "Live")))]
async fn server_live() -> StatusCode {
    StatusCode::OK
}

/// Server readiness: every model ready and the server not draining.
#[utoipa::path(get, path = "/v2/health/ready", tag = "kserve-v2", responses(
    (status = 200, description = "Ready"), (status = 503, body = ErrorBody, description = "Not ready, or draining")))]
async fn server_ready(State(state): State<AppState>) -> Result<StatusCode, AppError> {
    match state.readiness() {
        None => Ok(StatusCode::OK),
        Some(reason) => Err(AppError::unavailable(reason)),
    }
}

/// `POST /v2/repository/index` body (optional).
#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct V2IndexRequest {
    /// Only the models that are ready.
    #[serde(default)]
    ready: bool,
}

/// One model version in the repository index.
#[derive(Serialize, utoipa::ToSchema)]
pub struct V2IndexEntry {
    name: String,
    /// Empty for a model of the repository that was never loaded.
    version: String,
    /// `READY`, `LOADING` or `UNAVAILABLE`.
    state: &'static str,
    reason: String,
}

/// The models and their states.
#[utoipa::path(post, path = "/v2/repository/index", tag = "kserve-v2",
    request_body(content = Option<V2IndexRequest>),
    responses((status = 200, body = Vec<V2IndexEntry>), (status = 400, body = ErrorBody)),
    security(("api_key" = [])))]
async fn repository_index(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let body = body.map_err(body_error)?;
    let request: V2IndexRequest = if body.iter().all(u8::is_ascii_whitespace) {
        V2IndexRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| AppError::bad_request(format!("invalid index request: {e}")))?
    };
    let models = state.models();
    let mut index: Vec<V2IndexEntry> = models
        .iter()
        .map(|m| {
            let (state, reason) = match m.state() {
                ModelState::Ready(_) => ("READY", ""),
                ModelState::Loading => ("LOADING", ""),
                ModelState::Failed(e) | ModelState::Unloaded(e) => ("UNAVAILABLE", e),
            };
            V2IndexEntry { name: m.name().into(), version: m.version().to_string(), state, reason: reason.into() }
        })
        .collect();
    if state.model_control() == ModelControl::Explicit {
        // Model folders added since start-up, which a load would serve.
        // Reads the repository folder: on the blocking pool.
        let registry = state.clone();
        let unknown = tokio::task::spawn_blocking(move || registry.registry().unknown_folders())
            .await
            .map_err(|e| AppError::internal(format!("reading the repository failed: {e}")))?;
        index.extend(unknown.into_iter().map(|name| V2IndexEntry {
            name,
            version: String::new(),
            state: "UNAVAILABLE",
            reason: "not loaded".into(),
        }));
    }
    index.retain(|e| !request.ready || e.state == "READY");
    Ok(Json(index).into_response())
}

/// `POST /v2/repository/models/{model}/load` body (optional). Triton's clients may send a configuration or files
/// in `parameters`; inferd reads the model's folder instead, and refuses them.
#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct V2LoadRequest {
    #[serde(default)]
    #[schema(value_type = Object)]
    parameters: serde_json::Map<String, serde_json::Value>,
}

/// The model control routes answer only under `--model-control explicit`.
fn control_allowed(state: &AppState) -> Result<(), AppError> {
    if state.model_control() != ModelControl::Explicit {
        return Err(AppError::bad_request(
            "model control is off: start inferd with --model-control explicit to load and unload models",
        ));
    }
    if state.drain().is_draining() {
        return Err(AppError::unavailable("the server is shutting down"));
    }
    Ok(())
}

fn control_error(e: ControlError) -> AppError {
    match e {
        ControlError::NotFound(m) => AppError::not_found(m),
        ControlError::Failed(m) => AppError::bad_request(format!("failed to load: {m}")),
    }
}

/// Loads a model, or loads it again: reads its folder in the repository (a changed `model.toml` or weights file
/// takes effect), warms every version its policy serves, then swaps them in; the versions they replace finish
/// what they hold. A model that fails to load keeps serving what it served. Answers once the model is ready.
#[utoipa::path(post, path = "/v2/repository/models/{model}/load", tag = "kserve-v2",
    params(("model" = String, Path, description = "The model's folder in the repository")),
    request_body(content = Option<V2LoadRequest>),
    responses((status = 200, description = "Loaded"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn repository_load(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AppError> {
    control_allowed(&state)?;
    let body = body.map_err(body_error)?;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let request: V2LoadRequest =
            serde_json::from_slice(&body).map_err(|e| AppError::bad_request(format!("invalid load request: {e}")))?;
        if let Some(key) = request.parameters.keys().next() {
            return Err(AppError::bad_request(format!(
                "load parameter `{}` is not supported: inferd loads what the model's folder holds",
                quoted(key)
            )));
        }
    }
    let control = state.registry().control().await;
    let worker = state.clone();
    tokio::task::spawn_blocking(move || {
        // Held until the load ends, even if this request is dropped first (its client gone, its timeout).
        let _control = control;
        worker.registry().load(&name, worker.engine_settings(), &|model| worker.metrics().batch_observer(model))
    })
    .await
    .map_err(|e| AppError::internal(format!("the load task failed: {e}")))?
    .map_err(control_error)?;
    Ok(StatusCode::OK)
}

/// Unloads a model: requests already queued finish; later ones are refused (503) until it is loaded again.
#[utoipa::path(post, path = "/v2/repository/models/{model}/unload", tag = "kserve-v2",
    params(("model" = String, Path, description = "The model")),
    request_body(content = Option<Object>),
    responses((status = 200, description = "Unloaded"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn repository_unload(State(state): State<AppState>, Path(name): Path<String>) -> Result<StatusCode, AppError> {
    control_allowed(&state)?;
    let _control = state.registry().control().await;
    state.registry().unload(&name).map_err(control_error)?;
    Ok(StatusCode::OK)
}

/// A tensor's name, KServe data type and shape (`-1` for a variable dimension).
#[derive(Serialize, utoipa::ToSchema)]
pub struct V2TensorMetadata<'a> {
    name: &'a str,
    #[schema(value_type = String)]
    datatype: DataType,
    shape: &'a [i64],
}

impl<'a> V2TensorMetadata<'a> {
    fn all(specs: &'a [TensorSpec]) -> Vec<Self> {
        specs.iter().map(|s| V2TensorMetadata { name: &s.name, datatype: s.datatype, shape: &s.shape }).collect()
    }
}

/// `GET /v2/models/{model}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct V2ModelMetadata<'a> {
    name: &'a str,
    /// The versions ready to serve.
    versions: Vec<String>,
    platform: &'static str,
    inputs: Vec<V2TensorMetadata<'a>>,
    outputs: Vec<V2TensorMetadata<'a>>,
    /// Text models: what they embed.
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<V2TextParameters>,
}

/// A text model's task, embedding length and longest text in tokens.
#[derive(Serialize, utoipa::ToSchema)]
pub struct V2TextParameters {
    /// `embed`.
    task: &'static str,
    dimensions: usize,
    max_seq_len: usize,
}

/// A model's inputs and outputs.
#[utoipa::path(get, path = "/v2/models/{model}", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    responses((status = 200, body = V2ModelMetadata), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn model_metadata(State(state): State<AppState>, model: ModelName) -> Result<Response, AppError> {
    let endpoint = model.endpoint(&state)?;
    let meta = endpoint.metadata();
    let models = state.models();
    let versions = models
        .iter()
        .filter(|m| m.name() == endpoint.name() && m.endpoint().is_some())
        .map(|m| m.version().to_string())
        .collect();
    Ok(Json(V2ModelMetadata {
        name: endpoint.name(),
        versions,
        platform: meta.platform,
        inputs: V2TensorMetadata::all(&meta.inputs),
        outputs: V2TensorMetadata::all(&meta.outputs),
        parameters: meta.text.as_ref().map(|t| V2TextParameters {
            task: inferd_core::Task::Embed.as_str(),
            dimensions: t.dimensions,
            max_seq_len: t.max_seq_len,
        }),
    })
    .into_response())
}

/// A model's readiness.
#[utoipa::path(get, path = "/v2/models/{model}/ready", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    responses((status = 200, description = "Ready"), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn model_ready(State(state): State<AppState>, model: ModelName) -> Result<StatusCode, AppError> {
    model.endpoint(&state).map(|_| StatusCode::OK)
}

/// Triton's name for a data type in a model configuration.
fn config_type(datatype: DataType) -> String {
    match datatype {
        DataType::Bytes => "TYPE_STRING".into(),
        other => format!("TYPE_{}", other.as_str()),
    }
}

/// A model's configuration, in Triton's terms.
#[utoipa::path(get, path = "/v2/models/{model}/config", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    responses((status = 200, body = Object, description = "Triton-style model configuration"),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn model_config(State(state): State<AppState>, model: ModelName) -> Result<Response, AppError> {
    let model = model.model(&state)?;
    let endpoint = state.endpoint_of(&model)?;
    let meta = endpoint.metadata();
    let batching = &endpoint.batching;
    // Triton's dims leave out the batch dimension, where the model batches.
    let dims = |s: &TensorSpec| if batching.max_batch_size > 0 { s.row_dims().to_vec() } else { s.shape.clone() };
    let tensors = |specs: &[TensorSpec]| -> Vec<serde_json::Value> {
        specs.iter().map(|s| json!({ "name": s.name, "data_type": config_type(s.datatype), "dims": dims(s) })).collect()
    };
    Ok(Json(json!({
        "name": model.name(),
        "platform": meta.platform,
        "backend": model.config.backend.as_str(),
        "max_batch_size": batching.max_batch_size,
        "input": tensors(&meta.inputs),
        "output": tensors(&meta.outputs),
        "dynamic_batching": {
            "max_queue_delay_microseconds": batching.max_queue_delay_us,
            "preferred_batch_size": batching.preferred_batch_sizes,
            "default_queue_policy": { "max_queue_size": batching.max_queue_size, "default_timeout_microseconds": batching.timeout_ms * 1000 },
        },
        "instance_group": [{
            "count": model.config.instances,
            "kind": if meta.on_gpu() { "KIND_GPU" } else { "KIND_CPU" },
        }],
        "parameters": { "device": meta.device, "precision": meta.precision.as_str() },
    }))
    .into_response())
}

/// v2 inference bodies: JSON, or JSON followed by binary tensors, both ways.
struct V2Format {
    /// The `Inference-Header-Content-Length` header: the length of the body's JSON part.
    json_length: Option<usize>,
}

/// What encoding a v2 answer needs from its request: its id, and the outputs asked for.
type V2Pending = (Option<String>, Vec<(usize, bool)>);

impl WireFormat for V2Format {
    type Pending = V2Pending;
    /// The body, and the length of its JSON part when binary outputs follow it.
    type Answer = (Vec<u8>, Option<usize>);

    fn decode(&mut self, body: &[u8], model: &Endpoint, limits: &Limits) -> Result<(Job, V2Pending), CodecError> {
        let call = decode_infer(body, self.json_length, model.metadata(), limits)?;
        let deadline = call.timeout.and_then(deadline_in);
        Ok((InferRequest::new(call.inputs).with_deadline(deadline).into(), (call.id, call.outputs)))
    }

    fn encode(
        &self,
        model: &Endpoint,
        outputs: &Outputs,
        (id, selection): V2Pending,
    ) -> Result<Self::Answer, CodecError> {
        encode_infer(model.name(), model.version, id.as_deref(), model.metadata(), &outputs.tensors, &selection)
    }
}

fn json_length(headers: &HeaderMap) -> Result<Option<usize>, AppError> {
    headers
        .get(JSON_LENGTH_HEADER)
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| AppError::bad_request("Inference-Header-Content-Length must be a non-negative integer"))
        })
        .transpose()
}

async fn run_infer(
    state: &AppState,
    model: &ModelName,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let format = V2Format { json_length: json_length(headers)? };
    let served = infer(state, model.endpoint(state)?, format, body).await?;
    let mut headers = served.headers();
    let (body, json_len) = served.answer;
    match json_len {
        Some(len) => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            headers.insert(JSON_LENGTH_HEADER, HeaderValue::from(len as u64));
        }
        None => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    Ok((headers, body).into_response())
}

/// Runs an inference.
#[utoipa::path(post, path = "/v2/models/{model}/infer", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    request_body(description = "JSON, or JSON followed by binary tensors (`Inference-Header-Content-Length`)",
        content((V2InferRequest = "application/json"), ("application/octet-stream"))),
    responses((status = 200, description = "JSON, or JSON followed by binary outputs",
        content((V2InferResponse = "application/json"), ("application/octet-stream"))), InferErrors),
    security(("api_key" = [])))]
async fn infer_latest(
    State(state): State<AppState>,
    model: ModelName,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    run_infer(&state, &model, &headers, body).await
}

// The same handlers under `/versions/{version}`: one function per documented path.

/// A model version's inputs and outputs.
#[utoipa::path(get, path = "/v2/models/{model}/versions/{version}", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "Always `1`")),
    responses((status = 200, body = V2ModelMetadata), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn version_metadata(state: State<AppState>, name: ModelName) -> Result<Response, AppError> {
    model_metadata(state, name).await
}

/// A model version's readiness.
#[utoipa::path(get, path = "/v2/models/{model}/versions/{version}/ready", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "Always `1`")),
    responses((status = 200, description = "Ready"), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn version_ready(state: State<AppState>, name: ModelName) -> Result<StatusCode, AppError> {
    model_ready(state, name).await
}

/// A model version's configuration.
#[utoipa::path(get, path = "/v2/models/{model}/versions/{version}/config", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "Always `1`")),
    responses((status = 200, body = Object, description = "Triton-style model configuration"),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn version_config(state: State<AppState>, name: ModelName) -> Result<Response, AppError> {
    model_config(state, name).await
}

/// Runs an inference on a model version.
#[utoipa::path(post, path = "/v2/models/{model}/versions/{version}/infer", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "Always `1`")),
    request_body(description = "JSON, or JSON followed by binary tensors (`Inference-Header-Content-Length`)",
        content((V2InferRequest = "application/json"), ("application/octet-stream"))),
    responses((status = 200, description = "JSON, or JSON followed by binary outputs",
        content((V2InferResponse = "application/json"), ("application/octet-stream"))), InferErrors),
    security(("api_key" = [])))]
async fn infer_version(
    State(state): State<AppState>,
    model: ModelName,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    run_infer(&state, &model, &headers, body).await
}
