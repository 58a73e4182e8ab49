//! TEI's tokenizer routes: `POST /tokenize` (each text's tokens with their ids, spans and special flags) and
//! `POST /decode` (token ids back to text), with the default text model's tokenizer or `/models/{model}/…`'s.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{TeiError, TeiFailure};
use crate::error::{body_error, AppError};
use inferd_models::{Task, TaskError, TextFront};

use crate::ops::infer::off_runtime_if;
use crate::request::RoutedModel;
use crate::state::AppState;

/// `/tokenize` and `/decode`, with the default text model.
pub fn default_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(tokenize_default)).routes(routes!(decode_default))
}

/// `/models/{model}/tokenize` and `/models/{model}/decode`.
pub fn named_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(tokenize_named)).routes(routes!(decode_named))
}

/// One text or several.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        }
    }
}

/// A TEI tokenize request.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    #[schema(value_type = Vec<String>)]
    inputs: OneOrMany<String>,
    /// Add the model's special tokens (`[CLS]`, `[SEP]`; default true).
    #[serde(default)]
    add_special_tokens: Option<bool>,
    /// The model's sentence-transformers prompt to put before each text (its default where none is named).
    #[serde(default)]
    prompt_name: Option<String>,
}

/// One token.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SimpleToken {
    id: u32,
    /// The text it covers (a special token: its own text).
    text: String,
    special: bool,
    /// Byte offsets into the text; null for a special token.
    start: Option<usize>,
    stop: Option<usize>,
}

/// A TEI decode request.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct DecodeRequest {
    /// One list of token ids, or several.
    #[schema(value_type = Vec<Vec<u32>>)]
    ids: OneOrMany<Vec<u32>>,
    /// Leave the special tokens out (default true).
    #[serde(default)]
    skip_special_tokens: Option<bool>,
}

twin_routes! {
    post tokenize, (state: State<AppState>, model: Result<RoutedModel, AppError>, body: Result<Bytes, BytesRejection>)
        -> Result<Response, TeiFailure>;
    "Tokenize texts with the default text model's tokenizer." tokenize_default at "/tokenize" ();
    "Tokenize texts with the named model's tokenizer." tokenize_named at "/models/{model}/tokenize"
        (("model" = String, Path, description = "The model"));
    tag = "tokenizer", request_body = TokenizeRequest,
    responses((status = 200, description = "Each text's tokens", body = Vec<Vec<SimpleToken>>),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError)),
    security(("api_key" = []))
}

twin_routes! {
    post decode, (state: State<AppState>, model: Result<RoutedModel, AppError>, body: Result<Bytes, BytesRejection>)
        -> Result<Response, TeiFailure>;
    "Decode token ids with the default text model's tokenizer." decode_default at "/decode" ();
    "Decode token ids with the named model's tokenizer." decode_named at "/models/{model}/decode"
        (("model" = String, Path, description = "The model"));
    tag = "tokenizer", request_body = DecodeRequest,
    responses((status = 200, description = "One text per list of ids", body = Vec<String>),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError)),
    security(("api_key" = []))
}

/// A text model's tokenizer, or why the model has none.
fn tokenizer_of(task: &dyn Task) -> Result<&TextFront, TaskError> {
    task.tokenizer().ok_or_else(|| TaskError::Invalid(format!("it {}: it has no tokenizer", task.service().does())))
}

/// Parses a JSON body, or says why it is not a `T`.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, AppError> {
    serde_json::from_slice(body).map_err(|e| AppError::bad_request(format!("invalid request: {e}")))
}

/// Refuses an empty list, or one past the client batch limit (`--max-rows`).
fn check_count(state: &AppState, count: usize, what: &str) -> Result<(), AppError> {
    let max = state.limits().max_rows;
    match count {
        0 => Err(AppError::bad_request(format!("`{what}` is empty"))),
        n if n > max => Err(AppError::new(
            crate::error::ErrorKind::PayloadTooLarge,
            format!("the request has {n} {what}; this server takes at most {max} per request (--max-rows)"),
        )),
        _ => Ok(()),
    }
}

async fn tokenize(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let request: TokenizeRequest = parse(&body.map_err(body_error)?)?;
    let texts = request.inputs.into_vec();
    check_count(&state, texts.len(), "inputs")?;
    let special = request.add_special_tokens.unwrap_or(true);
    let prompt = request.prompt_name;
    let task = model.task.clone();
    let tokens = off_runtime_if(true, move || tokenizer_of(task.as_ref())?.tokens(&texts, special, prompt.as_deref()))
        .await?
        .map_err(|e| AppError::from(e).in_model(model.name()))?;
    let tokens: Vec<Vec<SimpleToken>> = tokens
        .into_iter()
        .map(|text| {
            text.into_iter()
                .map(|t| SimpleToken { id: t.id, text: t.text, special: t.special, start: t.start, stop: t.stop })
                .collect()
        })
        .collect();
    Ok(Json(tokens).into_response())
}

async fn decode(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let model = model?.serving(state.registry())?;
    let request: DecodeRequest = parse(&body.map_err(body_error)?)?;
    let lists = request.ids.into_vec();
    check_count(&state, lists.len(), "ids")?;
    let skip = request.skip_special_tokens.unwrap_or(true);
    let task = model.task.clone();
    let texts = off_runtime_if(true, move || {
        let tokenizer = tokenizer_of(task.as_ref())?;
        lists.iter().map(|ids| tokenizer.decode(ids, skip)).collect::<Result<Vec<_>, _>>()
    })
    .await?
    .map_err(|e| AppError::from(e).in_model(model.name()))?;
    Ok(Json(texts).into_response())
}
