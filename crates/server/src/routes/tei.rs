//! Text embeddings as text-embeddings-inference (TEI) serves them, so its clients work unchanged: `POST /embed`
//! (the default text model) and `POST /models/{model}/embed`, `{"inputs": "text" | ["a", "b"]}` → `[[...], ...]`,
//! errors as `{"error", "error_type"}`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use inferd_models::{Input, Request, TextInput};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::TextsInput;
use crate::codec::CodecError;
use crate::error::{body_error, AppError, ErrorKind};
use crate::ops::infer::{decode, encode, infer};
use crate::request::{InflightHold, RoutedModel};
use crate::state::AppState;

/// `/embed`, which serves the default text model.
pub fn default_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_default))
}

/// `/models/{model}/embed`.
pub fn named_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_named))
}

/// A TEI embed request.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct EmbedRequest {
    /// One text, several, or token ids as lists of integers.
    inputs: TextsInput,
    /// Unit-length embeddings (default true, as TEI).
    #[serde(default = "yes")]
    normalize: bool,
    /// Cut texts longer than the model takes (default true); `false` refuses them with a 400.
    #[serde(default = "yes")]
    truncate: bool,
}

fn yes() -> bool {
    true
}

/// TEI's error body.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TeiError {
    error: String,
    /// `Validation`, `Overloaded`, `Unhealthy` or `Backend`.
    error_type: &'static str,
}

/// An error answered in TEI's shape.
pub struct TeiFailure(AppError);

impl From<AppError> for TeiFailure {
    fn from(e: AppError) -> Self {
        TeiFailure(e)
    }
}

/// An error, even one the checkpoint answers before the handler (a missing API key, a timeout), in TEI's shape.
pub fn failure(e: AppError) -> Response {
    TeiFailure(e).into_response()
}

impl IntoResponse for TeiFailure {
    fn into_response(self) -> Response {
        let error_type = match self.0.kind {
            ErrorKind::Overloaded => "Overloaded",
            ErrorKind::Unavailable | ErrorKind::DeadlineExceeded => "Unhealthy",
            ErrorKind::Internal => "Backend",
            _ => "Validation",
        };
        self.0.respond(|error| TeiError { error, error_type })
    }
}

/// Embed texts with the default model.
#[utoipa::path(post, path = "/embed", tag = "embeddings", request_body = EmbedRequest,
    responses((status = 200, description = "One embedding per input", body = Vec<Vec<f32>>),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError), (status = 413, body = TeiError),
        (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = [])))]
async fn embed_default(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    embed(state, model, hold, body).await
}

/// Embed texts with the named model.
#[utoipa::path(post, path = "/models/{model}/embed", tag = "embeddings", request_body = EmbedRequest,
    params(("model" = String, Path, description = "The model")),
    responses((status = 200, description = "One embedding per input", body = Vec<Vec<f32>>),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError), (status = 413, body = TeiError),
        (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = [])))]
async fn embed_named(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    embed(state, model, hold, body).await
}

async fn embed(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let body = body.map_err(body_error)?;
    let request = decode(&model, body.len(), move |_| {
        let request: EmbedRequest =
            serde_json::from_slice(&body).map_err(|e| CodecError::Invalid(format!("invalid embed request: {e}")))?;
        let input = TextInput {
            truncate: request.truncate,
            normalize: Some(request.normalize),
            ..TextInput::new(request.inputs.into())
        };
        Ok(Request::new(Input::Text(input)))
    })
    .await?;
    let served = infer(&state, &model, request, &hold).await?;
    let headers = served.headers();
    let body = encode(served, |served| {
        let embeddings = served.answer.tensors.first().ok_or_else(|| CodecError::Encode("no embeddings".into()))?;
        serde_json::to_vec(&crate::codec::json::NestedJson(embeddings)).map_err(|e| CodecError::Encode(e.to_string()))
    })
    .await?;
    Ok((headers, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}
