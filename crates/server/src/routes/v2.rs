//! The KServe v2 / Open Inference Protocol routes, so that Triton's clients work unchanged, with Triton's model
//! repository extension (the index, and load and unload under `--model-control explicit`). Each handler is the
//! wire around one operation of [`crate::ops`]; the inference body's format is the codec's ([`crate::codec::v2`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Json;
use inferd_models::{Input, Request};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::optional_json;
use crate::codec::shm::REGION_PARAMETER;
use crate::codec::v2::models::{
    TritonModelConfig, V2IndexEntry, V2IndexRequest, V2LoadRequest, V2ModelMetadata, V2ServerMetadata, V2Statistics,
};
use crate::codec::v2::{decode_infer, encode_infer, V2InferRequest, V2InferResponse, JSON_LENGTH_HEADER};
use crate::error::{body_error, AppError, ErrorBody, InferErrors};
use crate::ops::infer::{
    answers_to_device, classify_outputs, deadline_in, decode, decode_bytes, encode_shared, infer, respond,
    scan_outputs_on_write,
};
use crate::ops::models;
use crate::ops::repository;
use crate::request::{InflightHold, RoutedModel};
use crate::state::AppState;

/// The server probes, open to all.
pub fn probe_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(server_live)).routes(routes!(server_ready))
}

/// Server metadata and the repository, behind the API key when one is configured.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(server_metadata))
        .routes(routes!(all_statistics))
        .routes(routes!(repository_index))
        .routes(routes!(repository_load))
        .routes(routes!(repository_unload))
}

/// A model's metadata, readiness and configuration, behind the API key when one is configured.
pub fn model_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(model_metadata))
        .routes(routes!(version_metadata))
        .routes(routes!(model_ready))
        .routes(routes!(version_ready))
        .routes(routes!(model_config))
        .routes(routes!(version_config))
        .routes(routes!(model_statistics))
        .routes(routes!(version_statistics))
}

/// Inference, behind the API key when one is configured.
pub fn inference_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(infer_latest)).routes(routes!(infer_version))
}

/// Server metadata.
#[utoipa::path(get, path = "/v2", tag = "kserve-v2", responses((status = 200, body = V2ServerMetadata)),
    security(("api_key" = [])))]
async fn server_metadata() -> Json<V2ServerMetadata> {
    Json(models::server_metadata())
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
    models::server_ready(&state).map(|()| StatusCode::OK)
}

/// The models and their states.
#[utoipa::path(post, path = "/v2/repository/index", tag = "kserve-v2",
    request_body(content = Option<V2IndexRequest>),
    responses((status = 200, body = Vec<V2IndexEntry>), (status = 400, body = ErrorBody)),
    security(("api_key" = [])))]
async fn repository_index(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Vec<V2IndexEntry>>, AppError> {
    let request: V2IndexRequest = optional_json(body, "index")?.unwrap_or_default();
    Ok(Json(repository::index(&state, request.ready).await?))
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
    // Model control off, or the server draining, is said before anything about the body.
    repository::control_allowed(&state)?;
    let request: V2LoadRequest = optional_json(body, "load")?.unwrap_or_default();
    repository::load(&state, name, request.parameters.keys().map(String::as_str)).await?;
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
    repository::unload(&state, &name).await?;
    Ok(StatusCode::OK)
}

twin_routes! {
    get metadata, (state: State<AppState>, model: RoutedModel) -> Result<Json<V2ModelMetadata>, AppError>;
    "A model's inputs and outputs." model_metadata at "/v2/models/{model}" (("model" = String, Path, description = "The model"));
    "A model version's inputs and outputs." version_metadata at "/v2/models/{model}/versions/{version}"
        (("model" = String, Path, description = "The model"), ("version" = String, Path, description = "The version: `1`, or the number of its version folder"));
    tag = "kserve-v2",
    responses((status = 200, body = V2ModelMetadata), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = []))
}

async fn metadata(State(state): State<AppState>, model: RoutedModel) -> Result<Json<V2ModelMetadata>, AppError> {
    Ok(Json(models::model_metadata(&state, &*model.current(state.registry())?)?))
}

twin_routes! {
    get ready, (state: State<AppState>, model: RoutedModel) -> Result<StatusCode, AppError>;
    "A model's readiness." model_ready at "/v2/models/{model}/ready" (("model" = String, Path, description = "The model"));
    "A model version's readiness." version_ready at "/v2/models/{model}/versions/{version}/ready"
        (("model" = String, Path, description = "The model"), ("version" = String, Path, description = "The version: `1`, or the number of its version folder"));
    tag = "kserve-v2",
    responses((status = 200, description = "Ready"), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = []))
}

async fn ready(State(state): State<AppState>, model: RoutedModel) -> Result<StatusCode, AppError> {
    models::model_ready(&*model.current(state.registry())?).map(|()| StatusCode::OK)
}

twin_routes! {
    get config, (state: State<AppState>, model: RoutedModel) -> Result<Json<TritonModelConfig>, AppError>;
    "A model's configuration, in Triton's terms." model_config at "/v2/models/{model}/config"
        (("model" = String, Path, description = "The model"));
    "A model version's configuration, in Triton's terms." version_config at "/v2/models/{model}/versions/{version}/config"
        (("model" = String, Path, description = "The model"), ("version" = String, Path, description = "The version: `1`, or the number of its version folder"));
    tag = "kserve-v2",
    responses((status = 200, body = TritonModelConfig, description = "Triton-style model configuration"),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = []))
}

async fn config(State(state): State<AppState>, model: RoutedModel) -> Result<Json<TritonModelConfig>, AppError> {
    Ok(Json(models::model_config(&*model.current(state.registry())?)?))
}

/// Every loaded model version's statistics.
#[utoipa::path(get, path = "/v2/models/stats", tag = "kserve-v2", responses((status = 200, body = V2Statistics)),
    security(("api_key" = [])))]
async fn all_statistics(State(state): State<AppState>) -> Result<Json<V2Statistics>, AppError> {
    let versions = models::stats_of(&state, None, None)?;
    Ok(Json(V2Statistics { model_stats: models::statistics(&versions) }))
}

/// Every version of a model: its statistics.
#[utoipa::path(get, path = "/v2/models/{model}/stats", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    responses((status = 200, body = V2Statistics), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
async fn model_statistics(State(state): State<AppState>, model: RoutedModel) -> Result<Json<V2Statistics>, AppError> {
    let name = model.current(state.registry())?.name().to_owned();
    let versions = models::stats_of(&state, Some(&name), None)?;
    Ok(Json(V2Statistics { model_stats: models::statistics(&versions) }))
}

/// A model version's statistics.
#[utoipa::path(get, path = "/v2/models/{model}/versions/{version}/stats", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "The version: `1`, or the number of its version folder")),
    responses((status = 200, body = V2Statistics), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
async fn version_statistics(State(state): State<AppState>, model: RoutedModel) -> Result<Json<V2Statistics>, AppError> {
    let entry = model.current(state.registry())?;
    Ok(Json(V2Statistics { model_stats: models::statistics(&[entry]) }))
}

/// [`JSON_LENGTH_HEADER`] as a header name, checked once: a `&str` is parsed again on every lookup.
pub(crate) const JSON_LENGTH: HeaderName = HeaderName::from_static(JSON_LENGTH_HEADER);

/// The `Inference-Header-Content-Length` header: the length of the body's JSON part.
fn json_length(headers: &HeaderMap) -> Result<Option<usize>, AppError> {
    headers
        .get(JSON_LENGTH)
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| AppError::bad_request("Inference-Header-Content-Length must be a non-negative integer"))
        })
        .transpose()
}

/// v2 inference: a JSON body, or JSON followed by binary tensors, and the answer in kind.
async fn run_infer(
    state: &AppState,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let json_length = json_length(headers)?;
    let model = model?.serving(state.registry())?;
    let body = body.map_err(body_error)?;
    let limits = *state.limits();
    let regions = state.shared_memory().clone();
    let json = &body[..json_length.unwrap_or(body.len()).min(body.len())];
    let len = decode_bytes(&model, body.len(), &regions, || {
        json.windows(REGION_PARAMETER.len()).any(|w| w == REGION_PARAMETER.as_bytes())
    });
    let mut call = decode(&model, len, move |meta| decode_infer(&body, json_length, meta, &limits, &*regions)).await?;
    let request = Request::new(Input::Tensors(call.inputs)).with_deadline(call.timeout.and_then(deadline_in));
    let request = scan_outputs_on_write(state, &model, request, &mut call.outputs, &call.classification);
    let request = crate::ops::text::with_dimensions(&model, request, call.dimensions)?;
    let served = infer(state, &model, request, &hold).await?;
    let mut headers = served.headers();
    let (id, selection, classification, read) = (call.id, call.outputs, call.classification, call.input_memory);
    let encoder = model.clone();
    let to_device = answers_to_device(&selection);
    let (body, json_len) = encode_shared(served, to_device, move |mut served| {
        let meta = encoder.metadata();
        classify_outputs(&encoder, &mut served.answer.tensors, &classification)?;
        encode_infer(encoder.name(), encoder.version, id.as_deref(), meta, &served.answer.tensors, &selection, &read)
    })
    .await?;
    let content_type = match json_len {
        Some(len) => {
            headers.insert(JSON_LENGTH, HeaderValue::from(len as u64));
            "application/octet-stream"
        }
        None => "application/json",
    };
    Ok(respond(headers, content_type, body))
}

twin_routes! {
    post infer_route, (
        state: State<AppState>,
        model: Result<RoutedModel, AppError>,
        hold: InflightHold,
        headers: HeaderMap,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<Response, AppError>;
    "Runs an inference on a model's newest ready version." infer_latest at "/v2/models/{model}/infer"
        (("model" = String, Path, description = "The model"));
    "Runs an inference on a model version." infer_version at "/v2/models/{model}/versions/{version}/infer"
        (("model" = String, Path, description = "The model"), ("version" = String, Path, description = "The version: `1`, or the number of its version folder"));
    tag = "kserve-v2",
    request_body(description = "JSON, or JSON followed by binary tensors (`Inference-Header-Content-Length`)",
        content((V2InferRequest = "application/json"), ("application/octet-stream"))),
    responses((status = 200, description = "JSON, or JSON followed by binary outputs",
        content((V2InferResponse = "application/json"), ("application/octet-stream"))), InferErrors),
    security(("api_key" = []))
}

async fn infer_route(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    run_infer(&state, model, hold, &headers, body).await
}
