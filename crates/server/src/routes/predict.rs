//! The seed's simple API on the models that take tensors (and texts as tensors): `{"input": [[...]]}` or named
//! `{"inputs": {"name": [[...]]}}` → `{"prediction", "model", "device"}`. Its routes, `POST /predict` and
//! `POST /models/{model}/predict`, are shared with TEI's `/predict` and pictures: [`super::dispatch`] serves each model
//! as its task says.

use std::time::Instant;

use axum::http::{HeaderMap, HeaderName};
use axum::response::Response;
use inferd_models::{Input, LoadedModel, Request};

use crate::budget::{Hold, Payload};
use crate::codec::predict::{decode_predict, decode_predict_from, PredictResponse, Prediction};
use crate::error::AppError;
use crate::ops::infer::{deadline_in, decode, decode_unread, encode, infer, respond};
use crate::state::AppState;

/// Milliseconds a `/predict` request may wait in the queue before it is answered 503 without running. A
/// `HeaderName`, checked once: a name given as a `&str` is parsed again on every lookup.
pub const TIMEOUT_HEADER: HeaderName = HeaderName::from_static("x-inferd-timeout-ms");

/// Serves the seed's body on `model`, within `deadline`.
pub async fn serve(
    state: &AppState,
    model: &std::sync::Arc<LoadedModel>,
    hold: &std::sync::Arc<Hold>,
    body: Payload,
    deadline: Option<Instant>,
) -> Result<Response, AppError> {
    let limits = *state.limits();
    let inputs = match body {
        Payload::Whole(body) => {
            decode(model, body.len(), move |meta| decode_predict(&body, &meta.inputs, &limits)).await?
        }
        Payload::Unread(body) => {
            decode_unread(model, hold, body, state.max_body_bytes(), move |body, meta| {
                decode_predict_from(body, &meta.inputs, &limits)
            })
            .await?
        }
    };
    let request = Request::new(Input::Tensors(inputs)).with_deadline(deadline);
    let served = infer(state, model, request, hold).await?;
    let headers = served.headers();
    let encoder = model.clone();
    let body = encode(served, move |served| {
        let meta = encoder.metadata();
        let prediction = Prediction { outputs: &served.answer.tensors, specs: &meta.outputs };
        let response = PredictResponse { prediction, model: encoder.name(), device: &meta.device };
        serde_json::to_vec(&response).map_err(|e| crate::codec::CodecError::Encode(e.to_string()))
    })
    .await?;
    Ok(respond(headers, "application/json", body))
}

/// The queue deadline an `x-inferd-timeout-ms` header asks for.
pub fn queue_deadline(headers: &HeaderMap) -> Result<Option<Instant>, AppError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else { return Ok(None) };
    let ms: u64 = value
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| AppError::bad_request(format!("{TIMEOUT_HEADER} must be a whole number of milliseconds")))?;
    Ok(deadline_in(std::time::Duration::from_millis(ms)))
}
