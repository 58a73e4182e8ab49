//! text-embeddings-inference's (TEI's) API, so its clients (`tei-client`, `huggingface_hub`) work unchanged:
//! `/embed`, `/embed_all`, `/embed_sparse` and `/similarity` here; `/rerank` and `/predict` with `inputs` in
//! [`score`]; token classification in the Hugging Face Inference API's shape in [`token`]; `/tokenize` and `/decode`
//! in [`tokens`]; `/info` and `POST /` in [`info`]. Each route serves its task's default model, and
//! the same under `/models/{model}/…` serves the named one. Errors come as `{"error", "error_type"}`.

/// One of TEI's inference routes, twice (through [`twin_routes!`]): `$default` at `$path` serves its task's default
/// model, `$named` at `$named_path` the named one. Both run `$serve(state, model, hold, body)` and are documented
/// alike in the OpenAPI document, the named one with its `model` parameter.
macro_rules! tei_routes {
    (
        $default:ident at $path:tt, $named:ident at $named_path:tt => $serve:path;
        docs $default_doc:tt $named_doc:tt; tag $tag:tt; body $request:ident; answer $description:tt $($answer:tt)+
    ) => {
        twin_routes! {
            post $serve, (
                state: axum::extract::State<crate::state::AppState>,
                model: Result<crate::request::RoutedModel, crate::error::AppError>,
                hold: crate::request::InflightHold,
                body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
            ) -> Result<axum::response::Response, TeiFailure>;
            $default_doc $default at $path ();
            $named_doc $named at $named_path (("model" = String, Path, description = "The model"));
            tag = $tag, request_body = $request,
            responses((status = 200, description = $description, body = $($answer)+),
                (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError),
                (status = 413, body = TeiError), (status = 429, body = TeiError), (status = 503, body = TeiError)),
            security(("api_key" = []))
        }
    };
}

pub mod info;
pub mod score;
pub mod token;
pub mod tokens;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use inferd_models::task::{Dimensions, Normalize, PerToken};
use inferd_models::{Input, LoadedModel, Request, Service, TextInput, Texts};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{inputs_kind, InputsKind, TextsInput};
use crate::budget::Hold;
use crate::codec::CodecError;
use crate::error::{body_error, AppError, ErrorKind};
use crate::ops::infer::{decode, encode, infer, respond, Served};
use crate::ops::text::{require, timing_headers};
use crate::request::{InflightHold, RoutedModel};
use crate::state::AppState;

/// `POST /`: what the model serves, as TEI's own route for it would (for an embedder, sentence similarity when the
/// body asks for it, as `huggingface_hub` sends it). With [`model_type`], the one place TEI maps a service to what
/// serves it: a task of a new service adds its handler here.
pub(crate) async fn root(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let routed = model?;
    let model = routed.serving(state.registry())?;
    match model.service() {
        Service::Rerank => score::rerank(state, Ok(routed), hold, body).await,
        Service::Classify => score::predict(&state, &model, &hold.0, body.map_err(body_error)?).await,
        Service::TokenClassify => token::classify_tokens(&state, &model, &hold.0, body.map_err(body_error)?).await,
        Service::EmbedSparse => embed_sparse(state, Ok(routed), hold, body).await,
        // A picture and candidate labels: zero-shot classification, as the Hugging Face Inference API serves it.
        Service::Embed if body.as_ref().is_ok_and(|b| super::zero_shot::asked(&model, b)) => {
            Ok(super::zero_shot::classify(&state, &model, &hold.0, body.map_err(body_error)?).await?)
        }
        // A similarity request's `inputs` is an object (`source_sentence`, `sentences`); an embed request's is not.
        Service::Embed if body.as_ref().is_ok_and(|b| inputs_kind(b) == Some(InputsKind::Object)) => {
            similarity(state, Ok(routed), hold, body).await
        }
        Service::Embed => embed(state, Ok(routed), hold, body).await,
        service @ (Service::Tensors | Service::Images) => Err(AppError::bad_request(format!(
            "model `{}` {}: POST / serves text models (use /models/{{model}}/predict)",
            model.name(),
            service.does()
        ))
        .into()),
    }
}

/// What `/info` says a model is (`{"embedding": {"pooling"}}`, `{"reranker"|"classifier": {"id2label", "label2id"}}`);
/// `None` for a model that takes no text.
fn model_type(model: &LoadedModel, text: &inferd_core::text::TextInfo) -> Option<serde_json::Value> {
    let labelled = |kind: &str| {
        let (id2label, label2id) = score::label_maps(&text.labels);
        serde_json::json!({ kind: { "id2label": id2label, "label2id": label2id } })
    };
    Some(match model.service() {
        Service::Rerank => labelled("reranker"),
        Service::Classify => labelled("classifier"),
        // Not one of TEI's: its clients know no token classifier.
        Service::TokenClassify => labelled("token_classifier"),
        Service::Embed => serde_json::json!({ "embedding": { "pooling": text.pooling.as_str() } }),
        Service::EmbedSparse => serde_json::json!({ "embedding": { "pooling": "splade" } }),
        Service::Tensors | Service::Images => return None,
    })
}

/// `/embed` and `/embed_all`, which serve the default embedding model.
pub fn default_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_default)).routes(routes!(embed_all_default))
}

/// `/models/{model}/embed` and `/models/{model}/embed_all`.
pub fn named_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_named)).routes(routes!(embed_all_named))
}

/// `/embed_sparse`, which serves the default sparse embedding model.
pub fn sparse_default_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_sparse_default))
}

/// `/models/{model}/embed_sparse`.
pub fn sparse_named_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_sparse_named))
}

/// Runs a TEI `what` request (`embed`) whose JSON body is a `B` on `model`, which must serve `service`: `build` makes
/// the request (and what the answer needs of it), `answer` the response body from the served answer. The answer
/// carries TEI's timing headers.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_json<B, C>(
    state: &AppState,
    model: &Arc<LoadedModel>,
    hold: &Arc<Hold>,
    service: Service,
    what: &'static str,
    body: Bytes,
    build: impl FnOnce(B) -> Result<(Request, C), CodecError> + Send + 'static,
    answer: impl FnOnce(Served, C) -> Result<Vec<u8>, CodecError> + Send + 'static,
) -> Result<Response, TeiFailure>
where
    B: DeserializeOwned,
    C: Send + 'static,
{
    require(model, service)?;
    let (request, context) = decode(model, body.len(), move |_| {
        let request: B =
            serde_json::from_slice(&body).map_err(|e| CodecError::Invalid(format!("invalid {what} request: {e}")))?;
        build(request)
    })
    .await?;
    let served = infer(state, model, request, hold).await?;
    let mut headers = served.headers();
    headers.extend(timing_headers(&served, model));
    let body = encode(served, move |served| answer(served, context)).await?;
    Ok(respond(headers, "application/json", body))
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
    /// Unit-length embeddings (default true, as TEI); `/embed_all` does not read it, as TEI does not.
    #[serde(default = "yes")]
    normalize: bool,
    /// Cut texts longer than the model takes (default true); `false` refuses them with a 400.
    #[serde(default)]
    truncate: Option<bool>,
    /// Which end of a long text is cut (default `right`).
    #[serde(default)]
    truncation_direction: Option<TruncationDirection>,
    /// The model's sentence-transformers prompt to put before each text (its default where none is named).
    #[serde(default)]
    prompt_name: Option<String>,
    /// The embedding's first dimensions only (a Matryoshka model's shorter embedding), renormalised when
    /// `normalize`; at least 1, at most the model's own. `/embed_all` refuses it.
    #[serde(default)]
    dimensions: Option<usize>,
}

fn yes() -> bool {
    true
}

/// Which end of a text too long for the model is cut: `right` (the default) or `left`, as TEI takes it (`Right`
/// and `Left` as `tei-client` sends them).
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TruncationDirection {
    #[serde(alias = "Left")]
    Left,
    #[serde(alias = "Right")]
    Right,
}

impl TruncationDirection {
    pub fn is_left(self) -> bool {
        self == TruncationDirection::Left
    }
}

/// The texts of a request that cuts long ones as `truncate` and `direction` say (default: cut, at the end).
pub(crate) fn text_input(texts: Texts, truncate: Option<bool>, direction: Option<TruncationDirection>) -> TextInput {
    TextInput {
        truncate: truncate.unwrap_or(true),
        truncate_left: direction.is_some_and(TruncationDirection::is_left),
        ..TextInput::new(texts)
    }
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

tei_routes! {
    embed_default at "/embed", embed_named at "/models/{model}/embed" => embed;
    docs "Embed texts with the default model." "Embed texts with the named model.";
    tag "embeddings"; body EmbedRequest; answer "One embedding per input" Vec<Vec<f32>>
}

pub(super) async fn embed(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    embed_texts(state, model, hold, body, false).await
}

tei_routes! {
    embed_all_default at "/embed_all", embed_all_named at "/models/{model}/embed_all" => embed_all;
    docs "Each token's vector, special tokens included, for the default embedding model."
        "Each token's vector, special tokens included, for the named model.";
    tag "embeddings"; body EmbedRequest; answer "For each input, a vector per token" Vec<Vec<Vec<f32>>>
}

/// The encoder's last hidden state, unpooled and unnormalised, as TEI's `/embed_all` gives it (its clients' own
/// `normalize` is not read, as TEI does not).
async fn embed_all(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    embed_texts(state, model, hold, body, true).await
}

/// `/embed` (one vector per text), or `/embed_all` (one per token) when `per_token`: the same request body.
async fn embed_texts(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
    per_token: bool,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let body = body.map_err(body_error)?;
    let build = move |request: EmbedRequest| {
        let input = TextInput {
            prompt_name: request.prompt_name,
            ..text_input(request.inputs.into(), request.truncate, request.truncation_direction)
        };
        let request_of = Request::new(Input::Texts(input));
        let request_of = match (per_token, request.dimensions) {
            (true, Some(_)) => {
                return Err(CodecError::Invalid("dimensions: /embed_all gives each token's whole state".into()))
            }
            (true, None) => request_of.with(PerToken),
            (false, dimensions) => {
                let with_normalize = request_of.with(Normalize(request.normalize));
                match dimensions {
                    Some(n) => with_normalize.with(Dimensions(n)),
                    None => with_normalize,
                }
            }
        };
        Ok((request_of, ()))
    };
    let what = if per_token { "embed_all" } else { "embed" };
    serve_json(&state, &model, &hold, Service::Embed, what, body, build, move |served, ()| {
        let tensors = &served.answer.tensors;
        match per_token {
            // One `[tokens, dim]` tensor per text.
            true => json_body(&tensors.iter().map(crate::codec::json::NestedJson).collect::<Vec<_>>()),
            false => {
                let embeddings = tensors.first().ok_or_else(|| CodecError::Encode("no embeddings".into()))?;
                json_body(&crate::codec::json::NestedJson(embeddings))
            }
        }
    })
    .await
}

/// A TEI sparse embedding request.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct SparseRequest {
    /// One text, several, or token ids as lists of integers.
    inputs: TextsInput,
    /// Cut texts longer than the model takes (default true); `false` refuses them with a 400.
    #[serde(default)]
    truncate: Option<bool>,
    /// Which end of a long text is cut (default `right`).
    #[serde(default)]
    truncation_direction: Option<TruncationDirection>,
    /// The model's sentence-transformers prompt to put before each text (its default where none is named).
    #[serde(default)]
    prompt_name: Option<String>,
}

/// One non-zero weight of a sparse embedding.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SparseValue {
    /// The vocabulary entry (token id).
    index: usize,
    value: f32,
}

tei_routes! {
    embed_sparse_default at "/embed_sparse", embed_sparse_named at "/models/{model}/embed_sparse" => embed_sparse;
    docs "Sparse embeddings (SPLADE) of texts with the default sparse model."
        "Sparse embeddings (SPLADE) of texts with the named model.";
    tag "embeddings"; body SparseRequest; answer "For each input, its non-zero weights by vocabulary index" Vec<Vec<SparseValue>>
}

/// Each text's non-zero vocabulary weights, in the vocabulary's order, as TEI's `/embed_sparse` gives them.
pub(super) async fn embed_sparse(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let body = body.map_err(body_error)?;
    let build = |request: SparseRequest| {
        let input = TextInput {
            prompt_name: request.prompt_name,
            ..text_input(request.inputs.into(), request.truncate, request.truncation_direction)
        };
        Ok((Request::new(Input::Texts(input)), ()))
    };
    serve_json(&state, &model, &hold, Service::EmbedSparse, "embed_sparse", body, build, |served, ()| {
        let texts = non_zero(&served.answer.tensors)?;
        let texts: Vec<Vec<SparseValue>> = texts
            .into_iter()
            .map(|weights| weights.into_iter().map(|(index, value)| SparseValue { index, value }).collect())
            .collect();
        json_body(&texts)
    })
    .await
}

/// Each text's non-zero weights of a sparse embedding `FP32 [texts, vocab]`, as (vocabulary index, weight) in
/// the vocabulary's order.
fn non_zero(tensors: &[inferd_core::Tensor]) -> Result<Vec<Vec<(usize, f32)>>, CodecError> {
    let weights = tensors.first().ok_or_else(|| CodecError::Encode("no sparse embeddings".into()))?;
    let vocab = weights.shape().last().copied().unwrap_or(1).max(1);
    let values = weights.to_vec::<f32>().map_err(|e| CodecError::Encode(e.to_string()))?;
    Ok(values
        .chunks_exact(vocab)
        .map(|row| row.iter().enumerate().filter(|(_, &v)| v != 0.0).map(|(i, &v)| (i, v)).collect())
        .collect())
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
    /// Which end of a long text is cut (default `right`).
    #[serde(default)]
    truncation_direction: Option<TruncationDirection>,
    /// The model's sentence-transformers prompt to put before each text (its default where none is named).
    #[serde(default)]
    prompt_name: Option<String>,
}

tei_routes! {
    similarity_default at "/similarity", similarity_named at "/models/{model}/similarity" => similarity;
    docs "The cosine similarity of a sentence to others, with the default embedding model."
        "The cosine similarity of a sentence to others, with the named embedding model.";
    tag "embeddings"; body SimilarityRequest; answer "One cosine similarity per sentence" Vec<f32>
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
        let parameters = request.parameters.unwrap_or_default();
        let input = TextInput {
            prompt_name: parameters.prompt_name,
            ..text_input(Texts::Strings(texts), parameters.truncate, parameters.truncation_direction)
        };
        Ok((Request::new(Input::Texts(input)).with(Normalize(true)), ()))
    };
    serve_json(&state, &model, &hold, Service::Embed, "similarity", body, build, |served, ()| {
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
