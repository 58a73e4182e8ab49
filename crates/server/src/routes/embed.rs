//! Text embeddings as text-embeddings-inference (TEI) serves them, so its clients work unchanged: `POST /embed`
//! (the default model) and `POST /models/{name}/embed`, `{"inputs": "text" | ["a", "b"]}` → `[[...], ...]`,
//! errors as `{"error", "error_type"}`.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::codec::{CodecError, Limits};
use crate::error::{AppError, ErrorKind};
use crate::infer::{infer, Job, Outputs, WireFormat};
use crate::repository::Endpoint;
use crate::state::AppState;
use crate::text::{TextInput, TextJob};

/// The path parameter that names the model.
pub const MODEL_PARAM: &str = "name";

/// `/embed`, which serves the default model.
pub fn default_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_default))
}

/// `/models/{name}/embed`.
pub fn named_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embed_named))
}

/// A TEI embed request.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct EmbedRequest {
    /// One text, several, or token ids as lists of integers.
    inputs: Inputs,
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

/// TEI's `inputs`: a text or a token list, or a list of either.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Inputs {
    One(String),
    Many(Vec<String>),
    Ids(Vec<u32>),
    ManyIds(Vec<Vec<u32>>),
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

impl IntoResponse for TeiFailure {
    fn into_response(self) -> Response {
        let error_type = match self.0.kind {
            ErrorKind::Overloaded => "Overloaded",
            ErrorKind::Unavailable => "Unhealthy",
            ErrorKind::Internal => "Backend",
            _ => "Validation",
        };
        self.0.respond(|error| TeiError { error, error_type })
    }
}

/// Embed texts with the default model.
#[utoipa::path(post, path = "/embed", tag = "embeddings", request_body = EmbedRequest,
    responses((status = 200, description = "One embedding per input", body = Vec<Vec<f32>>),
        (status = 400, body = TeiError), (status = 404, body = TeiError), (status = 413, body = TeiError),
        (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = [])))]
async fn embed_default(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let Some(name) = state.default_embed_model() else {
        let names = state.text_model_names();
        let error = if names.is_empty() {
            "this server has no text model: /embed serves a model whose task is `embed`".to_owned()
        } else {
            format!("this server has several text models ({names}): use /models/{{name}}/embed, or start it with --default-embed-model")
        };
        return Err(AppError::bad_request(error).into());
    };
    embed(&state, name, body).await
}

/// Embed texts with the named model.
#[utoipa::path(post, path = "/models/{name}/embed", tag = "embeddings", request_body = EmbedRequest,
    params(("name" = String, Path, description = "The model")),
    responses((status = 200, description = "One embedding per input", body = Vec<Vec<f32>>),
        (status = 400, body = TeiError), (status = 404, body = TeiError), (status = 413, body = TeiError),
        (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = [])))]
async fn embed_named(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, TeiFailure> {
    let Path(name) = name.map_err(|e| AppError::bad_request(e.body_text()))?;
    embed(&state, &name, body).await
}

async fn embed(state: &AppState, model: &str, body: Result<Bytes, BytesRejection>) -> Result<Response, TeiFailure> {
    let served = infer(state, state.endpoint(model)?, TeiFormat, body).await?;
    let headers = served.headers();
    Ok((headers, [(axum::http::header::CONTENT_TYPE, "application/json")], served.answer).into_response())
}

struct TeiFormat;

impl WireFormat for TeiFormat {
    type Pending = ();
    type Answer = Vec<u8>;

    fn decode(&mut self, body: &[u8], _: &Endpoint, _: &Limits) -> Result<(Job, ()), CodecError> {
        let request: EmbedRequest =
            serde_json::from_slice(body).map_err(|e| CodecError::Invalid(format!("invalid embed request: {e}")))?;
        let input = match request.inputs {
            Inputs::One(text) => TextInput::Texts(vec![text]),
            Inputs::Many(texts) => TextInput::Texts(texts),
            Inputs::Ids(ids) => TextInput::Ids(vec![ids]),
            Inputs::ManyIds(ids) => TextInput::Ids(ids),
        };
        let job = TextJob { truncate: request.truncate, normalize: Some(request.normalize), ..TextJob::new(input) };
        Ok((Job::Text(job), ()))
    }

    fn encode(&self, _: &Endpoint, outputs: &Outputs, (): ()) -> Result<Vec<u8>, CodecError> {
        let embeddings = outputs.tensors.first().ok_or_else(|| CodecError::Encode("no embeddings".into()))?;
        serde_json::to_vec(&crate::codec::json::NestedJson(embeddings)).map_err(|e| CodecError::Encode(e.to_string()))
    }
}
