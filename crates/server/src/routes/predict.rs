//! The seed's simple API: `POST /predict` (the default model) and `POST /models/{name}/predict`.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use inferd_batcher::InferRequest;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::codec::predict::{decode_predict, PredictRequest, PredictResponse, Prediction};
use crate::codec::{CodecError, Limits};
use crate::error::{AppError, InferErrors};
use crate::infer::{deadline_in, infer, Job, Outputs, WireFormat};
use crate::repository::Endpoint;
use crate::state::AppState;

/// The path parameter that names the model.
pub const MODEL_PARAM: &str = "name";
/// Milliseconds a `/predict` request may wait in the queue before it is answered 503 without running.
pub const TIMEOUT_HEADER: &str = "x-inferd-timeout-ms";

/// `/predict`, which serves the default model.
pub fn default_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(predict_default))
}

/// `/models/{name}/predict`.
pub fn named_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(predict_named))
}

/// Serve `/predict` with the default model.
#[utoipa::path(
    post, path = "/predict", tag = "inference",
    request_body(content = PredictRequest, description = "One input as `input`, or several by name in `inputs`."),
    params(("x-inferd-timeout-ms" = Option<u64>, Header, description = "Milliseconds the request may wait in the queue; past that it is answered 503 and never runs")),
    responses((status = 200, body = PredictResponse, headers(
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
    let Some(name) = state.default_model() else {
        return Err(AppError::bad_request(format!(
            "this server has several models ({}): use /models/{{name}}/predict, or start it with --default-model",
            state.model_names()
        )));
    };
    predict(&state, name, &headers, body).await
}

/// Serve `/predict` with the named model.
#[utoipa::path(
    post, path = "/models/{name}/predict", tag = "inference",
    request_body(content = PredictRequest, description = "One input as `input`, or several by name in `inputs`."),
    params(("name" = String, Path, description = "The model"),
        ("x-inferd-timeout-ms" = Option<u64>, Header, description = "Milliseconds the request may wait in the queue")),
    responses((status = 200, body = PredictResponse), InferErrors),
    security(("api_key" = []))
)]
async fn predict_named(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let Path(name) = name.map_err(|e| AppError::bad_request(e.body_text()))?;
    predict(&state, &name, &headers, body).await
}

async fn predict(
    state: &AppState,
    model: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let format = PredictFormat { deadline: queue_deadline(headers)? };
    let served = infer(state, state.endpoint(model)?, format, body).await?;
    let content_type = [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))];
    Ok((served.headers(), content_type, served.answer).into_response())
}

/// The queue deadline an `x-inferd-timeout-ms` header asks for.
fn queue_deadline(headers: &HeaderMap) -> Result<Option<Instant>, AppError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else { return Ok(None) };
    let ms: u64 = value
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| AppError::bad_request(format!("{TIMEOUT_HEADER} must be a whole number of milliseconds")))?;
    Ok(deadline_in(std::time::Duration::from_millis(ms)))
}

/// `/predict` bodies in, nested arrays out.
struct PredictFormat {
    deadline: Option<Instant>,
}

impl WireFormat for PredictFormat {
    type Pending = ();
    type Answer = Vec<u8>;

    fn decode(&mut self, body: &[u8], model: &Endpoint, limits: &Limits) -> Result<(Job, ()), CodecError> {
        let inputs = decode_predict(body, &model.metadata().inputs, limits)?;
        Ok((InferRequest::new(inputs).with_deadline(self.deadline).into(), ()))
    }

    fn encode(&self, model: &Endpoint, outputs: &Outputs, (): ()) -> Result<Vec<u8>, CodecError> {
        let meta = model.metadata();
        let response = PredictResponse {
            prediction: Prediction { outputs: &outputs.tensors, specs: &meta.outputs },
            model: model.name(),
            device: &meta.device,
        };
        serde_json::to_vec(&response).map_err(|e| CodecError::Encode(e.to_string()))
    }
}
