//! The seed's simple API: `POST /predict` (the default model) and `POST /models/{model}/predict`. A body whose
//! `inputs` is a text or a list (TEI's `/predict`, which `tei-client` classifies with) rather than an object of
//! named tensors is TEI's: it goes to the default classifier, or the named model, and is answered in TEI's shape.
//! A picture (`Content-Type: image/*`, a multipart form, or base64 JSON for a vision model) goes to [`super::images`].

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use inferd_models::{Input, Request};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::codec::predict::{decode_predict, PredictRequest, PredictResponse, Prediction};
use crate::error::{body_error, AppError, InferErrors};
use crate::ops::infer::{deadline_in, decode, encode, infer};
use crate::request::{default_text, InflightHold, RoutedModel, ServedModel, TextDefault};
use crate::routes::tei::TeiFailure;
use crate::routes::InputsKind;
use crate::state::AppState;

/// Milliseconds a `/predict` request may wait in the queue before it is answered 503 without running.
pub const TIMEOUT_HEADER: &str = "x-inferd-timeout-ms";

/// `/predict`, which serves the default model.
pub fn default_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(predict_default))
}

/// `/models/{model}/predict`.
pub fn named_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(predict_named))
}

/// Serve `/predict` with the default model.
#[utoipa::path(
    post, path = "/predict", tag = "inference",
    request_body(content = PredictRequest, description = "One input as `input`, or several by name in `inputs`. A vision model takes pictures instead: the file as the body (`Content-Type: image/*`), the parts of a `multipart/form-data` form, or `{\"image\": \"<base64>\"}` / `{\"images\": [...]}`; it answers `{model, device, predictions: [{width, height, outputs: {name: reading}}]}`."),
    params(("x-inferd-timeout-ms" = Option<u64>, Header, description = "Milliseconds the request may wait in the queue; past that it is answered 503 and never runs")),
    responses((status = 200, body = PredictResponse, headers(
        ("x-inferd-batch-size" = u64, description = "Rows in the batch that served the request"),
        ("x-inferd-queue-us" = u64, description = "Microseconds queued"),
        ("x-inferd-compute-us" = u64, description = "Microseconds the batch computed"))), InferErrors),
    security(("api_key" = []))
)]
async fn predict_default(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    predict(state, model, hold, headers, body).await
}

/// Serve `/predict` with the named model.
#[utoipa::path(
    post, path = "/models/{model}/predict", tag = "inference",
    request_body(content = PredictRequest, description = "One input as `input`, or several by name in `inputs`. A vision model takes pictures instead: the file as the body (`Content-Type: image/*`), the parts of a `multipart/form-data` form, or `{\"image\": \"<base64>\"}` / `{\"images\": [...]}`; it answers `{model, device, predictions: [{width, height, outputs: {name: reading}}]}`."),
    params(("model" = String, Path, description = "The model"),
        ("x-inferd-timeout-ms" = Option<u64>, Header, description = "Milliseconds the request may wait in the queue")),
    responses((status = 200, body = PredictResponse), InferErrors),
    security(("api_key" = []))
)]
async fn predict_named(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    predict(state, model, hold, headers, body).await
}

async fn predict(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let body = body.map_err(body_error)?;
    if super::images::carrier(&headers, false)?.is_none() && is_tei(&body) {
        return Ok(tei_predict(&state, model, &hold, body).await.unwrap_or_else(IntoResponse::into_response));
    }
    let deadline = queue_deadline(&headers)?;
    let model = model?.serving(state.registry())?;
    let carrier = super::images::carrier(&headers, model.task.takes_images())?;
    if carrier.is_some() || model.task.takes_images() {
        return super::images::predict(&state, &model, &hold, carrier, body, deadline).await;
    }
    let limits = *state.limits();
    let inputs = decode(&model, body.len(), move |meta| decode_predict(&body, &meta.inputs, &limits)).await?;
    let request = Request::new(Input::Tensors(inputs)).with_deadline(deadline);
    let served = infer(&state, &model, request, &hold).await?;
    let headers = served.headers();
    let encoder = model.clone();
    let body = encode(served, move |served| {
        let meta = encoder.metadata();
        let prediction = Prediction { outputs: &served.answer.tensors, specs: &meta.outputs };
        let response = PredictResponse { prediction, model: encoder.name(), device: &meta.device };
        serde_json::to_vec(&response).map_err(|e| crate::codec::CodecError::Encode(e.to_string()))
    })
    .await?;
    let content_type = [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))];
    Ok((headers, content_type, body).into_response())
}

/// Whether a `/predict` body is TEI's: its `inputs` is a text or a list, where the seed's is an object of named
/// tensors, or its `input` anything.
fn is_tei(body: &[u8]) -> bool {
    matches!(super::inputs_kind(body), Some(InputsKind::Text | InputsKind::List))
}

/// TEI's `/predict`: the route's model when it names one, else the default classifier.
async fn tei_predict(
    state: &AppState,
    model: Result<RoutedModel, AppError>,
    hold: &std::sync::Arc<crate::budget::Hold>,
    body: Bytes,
) -> Result<Response, TeiFailure> {
    let entry = match model {
        Ok(routed) if routed.named() => routed.current(state.registry())?,
        _ => default_text(state.registry(), state.defaults(), TextDefault::Classify)?,
    };
    let label = ServedModel(entry.label());
    let model = entry.serving()?;
    let mut response =
        crate::routes::tei::score::predict(state, &model, hold, body).await.unwrap_or_else(IntoResponse::into_response);
    response.extensions_mut().insert(label);
    Ok(response)
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

#[cfg(test)]
mod tests {
    use super::is_tei;

    #[test]
    fn tei_bodies_are_told_from_the_seeds_by_their_inputs() {
        for tei in [
            r#"{"inputs": "a text"}"#,
            r#"{"truncate": true, "raw_scores": null, "inputs": ["a", "b"]}"#,
            r#"{"inputs": [["a"], ["b", "c"]], "raw_scores": false}"#,
            r#"{"inputs": "escaped \" quote"}"#,
        ] {
            assert!(is_tei(tei.as_bytes()), "{tei}");
        }
        for seed in [
            r#"{"input": [[1.0, 2.0]]}"#,
            r#"{"inputs": {"x": [[1.0]]}}"#,
            r#"{"id": "r1", "inputs": {"x": [1.0]}}"#,
            r#"{"input": [1.0], "inputs": "never read"}"#,
            r#"{"inputs": 3}"#,
            r#"[1, 2]"#,
            r#"{"inputs": "#,
            "",
        ] {
            assert!(!is_tei(seed.as_bytes()), "{seed}");
        }
    }

    #[test]
    fn a_seed_body_is_read_only_up_to_its_input() {
        // What follows the decision is never parsed: invalid JSON there does not change it.
        assert!(!is_tei(br#"{"input": [[1.0, 2.0]] !!! not json"#));
        assert!(is_tei(br#"{"inputs": ["a", !!! not json"#));
    }
}
