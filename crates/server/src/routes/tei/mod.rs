//! text-embeddings-inference's (TEI's) API, so its clients (`tei-client`, `huggingface_hub`) work unchanged:
//! `/embed`, `/embed_all` and `/similarity` here; `/rerank` and `/predict` with `inputs` in [`score`]; `/tokenize`
//! and `/decode` in [`tokens`]; `/info` and `POST /` in [`info`]. Each route serves its task's default model, and
//! the same under `/models/{model}/…` serves the named one. Errors come as `{"error", "error_type"}`.

pub mod info;
pub mod score;
pub mod tokens;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use inferd_models::{Input, LoadedModel, Request, TextInput, Texts};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::TextsInput;
use crate::budget::Hold;
use crate::codec::CodecError;
use crate::error::{body_error, AppError, ErrorKind};
use crate::ops::infer::{decode, encode, infer, Served};
use crate::request::{InflightHold, RoutedModel};
use crate::state::AppState;

/// `/embed` and `/embed_all`, which serve the default embedding model.
pub fn default_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_default)).routes(routes!(embed_all_default))
}

/// `/models/{model}/embed` and `/models/{model}/embed_all`.
pub fn named_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_named)).routes(routes!(embed_all_named))
}

/// Runs a TEI `what` request (`embed`) whose JSON body is a `B` on `model`: `build` makes the request (and what
/// the answer needs of it), `answer` the response body from the served answer.
pub(crate) async fn serve_json<B, C>(
    state: &AppState,
    model: &Arc<LoadedModel>,
    hold: &Hold,
    what: &'static str,
    body: Bytes,
    build: impl FnOnce(B) -> Result<(Request, C), CodecError> + Send + 'static,
    answer: impl FnOnce(Served, C) -> Result<Vec<u8>, CodecError> + Send + 'static,
) -> Result<Response, TeiFailure>
where
    B: DeserializeOwned,
    C: Send + 'static,
{
    let (request, context) = decode(model, body.len(), move |_| {
        let request: B =
            serde_json::from_slice(&body).map_err(|e| CodecError::Invalid(format!("invalid {what} request: {e}")))?;
        build(request)
    })
    .await?;
    let served = infer(state, model, request, hold).await?;
    let headers = served.headers();
    let body = encode(served, move |served| answer(served, context)).await?;
    Ok((headers, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `value` as a JSON body.
pub(crate) fn json_body<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    serde_json::to_vec(value).map_err(|e| CodecError::Encode(e.to_string()))
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
    #[serde(default)]
    truncate: Option<bool>,
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

pub(super) async fn embed(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let body = body.map_err(body_error)?;
    let build = |request: EmbedRequest| {
        let input = TextInput {
            truncate: request.truncate.unwrap_or(true),
            normalize: Some(request.normalize),
            ..TextInput::new(request.inputs.into())
        };
        Ok((Request::new(Input::Text(input)), ()))
    };
    serve_json(&state, &model, &hold, "embed", body, build, |served, ()| {
        let embeddings = served.answer.tensors.first().ok_or_else(|| CodecError::Encode("no embeddings".into()))?;
        json_body(&crate::codec::json::NestedJson(embeddings))
    })
    .await
}

/// A TEI embed_all request: each token's vector.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct EmbedAllRequest {
    /// One text, several, or token ids as lists of integers.
    inputs: TextsInput,
    /// Cut texts longer than the model takes (default true); `false` refuses them with a 400.
    #[serde(default)]
    truncate: Option<bool>,
}

/// Each token's vector, special tokens included, for the default embedding model.
#[utoipa::path(post, path = "/embed_all", tag = "embeddings", request_body = EmbedAllRequest,
    responses((status = 200, description = "For each input, a vector per token", body = Vec<Vec<Vec<f32>>>),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError), (status = 413, body = TeiError),
        (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = [])))]
async fn embed_all_default(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    embed_all(state, model, hold, body).await
}

/// Each token's vector, special tokens included, for the named model.
#[utoipa::path(post, path = "/models/{model}/embed_all", tag = "embeddings", request_body = EmbedAllRequest,
    params(("model" = String, Path, description = "The model")),
    responses((status = 200, description = "For each input, a vector per token", body = Vec<Vec<Vec<f32>>>),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError), (status = 413, body = TeiError),
        (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = [])))]
async fn embed_all_named(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    embed_all(state, model, hold, body).await
}

/// The encoder's last hidden state, unpooled and unnormalised, as TEI's `/embed_all` gives it (its clients' own
/// `normalize` is not read, as TEI does not).
async fn embed_all(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let body = body.map_err(body_error)?;
    let build = |request: EmbedAllRequest| {
        let input = TextInput {
            truncate: request.truncate.unwrap_or(true),
            per_token: true,
            ..TextInput::new(request.inputs.into())
        };
        Ok((Request::new(Input::Text(input)), ()))
    };
    serve_json(&state, &model, &hold, "embed_all", body, build, |served, ()| {
        let texts: Vec<_> = served.answer.tensors.iter().map(crate::codec::json::NestedJson).collect();
        json_body(&texts)
    })
    .await
}

/// `/similarity`, with the default embedding model.
pub fn similarity_default_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(similarity_default))
}

/// `/models/{model}/similarity`.
pub fn similarity_named_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(similarity_named))
}

/// A TEI similarity request: one sentence against others.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct SimilarityRequest {
    inputs: SimilarityInputs,
    #[serde(default)]
    parameters: Option<SimilarityParameters>,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct SimilarityInputs {
    source_sentence: String,
    sentences: Vec<String>,
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
pub struct SimilarityParameters {
    #[serde(default)]
    truncate: Option<bool>,
}

/// The cosine similarity of a sentence to others, with the default embedding model.
#[utoipa::path(post, path = "/similarity", tag = "embeddings", request_body = SimilarityRequest,
    responses((status = 200, description = "One cosine similarity per sentence", body = Vec<f32>),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 413, body = TeiError),
        (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = [])))]
async fn similarity_default(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    similarity(state, model, hold, body).await
}

/// The cosine similarity of a sentence to others, with the named embedding model.
#[utoipa::path(post, path = "/models/{model}/similarity", tag = "embeddings", request_body = SimilarityRequest,
    params(("model" = String, Path, description = "The model")),
    responses((status = 200, description = "One cosine similarity per sentence", body = Vec<f32>),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError),
        (status = 413, body = TeiError), (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = [])))]
async fn similarity_named(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    similarity(state, model, hold, body).await
}

pub(super) async fn similarity(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let body = body.map_err(body_error)?;
    let build = |request: SimilarityRequest| {
        let SimilarityInputs { source_sentence, sentences } = request.inputs;
        if sentences.is_empty() {
            return Err(CodecError::Invalid("`inputs.sentences` is empty: there is nothing to compare".into()));
        }
        let texts = std::iter::once(source_sentence).chain(sentences).collect();
        let truncate = request.parameters.unwrap_or_default().truncate.unwrap_or(true);
        let input = TextInput { truncate, normalize: Some(true), ..TextInput::new(Texts::Strings(texts)) };
        Ok((Request::new(Input::Text(input)), ()))
    };
    serve_json(&state, &model, &hold, "similarity", body, build, |served, ()| {
        let embeddings = served.answer.tensors.first().ok_or_else(|| CodecError::Encode("no embeddings".into()))?;
        let values = embeddings.to_vec::<f32>().map_err(|e| CodecError::Encode(e.to_string()))?;
        let dim = embeddings.shape().last().copied().unwrap_or(1).max(1);
        let mut rows = values.chunks_exact(dim);
        let source = rows.next().ok_or_else(|| CodecError::Encode("no embeddings".into()))?;
        // Unit vectors: the dot product is the cosine.
        let cosines: Vec<f32> = rows.map(|row| source.iter().zip(row).map(|(a, b)| a * b).sum()).collect();
        json_body(&cosines)
    })
    .await
}
