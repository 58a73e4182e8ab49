//! Embeddings as OpenAI's API serves them, so that the `openai` client works unchanged: `POST /v1/embeddings` and
//! `POST /embeddings` (as TEI serves it; the model named in the body, or the default embedder; `float` or `base64`
//! encoding; `dimensions`; pictures for a model that embeds them, with Infinity's `modality`) and `GET /v1/models`.
//! Errors come as OpenAI's `{"error": {"message", "type", "param", "code"}}`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use inferd_models::task::{file_from_base64, Dimensions};
use inferd_models::{Answer, Input, Request, Service, TextInput};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::TextsInput;
use crate::codec::{quoted, CodecError};
use crate::error::{body_error, AppError, ErrorKind};
use crate::ops::infer::{encode, infer, off_runtime_if, respond, INLINE_WORK_BYTES};
use crate::ops::text::{require, timing_headers};
use crate::request::{default_of, InflightHold, ServedModel};
use crate::state::AppState;

/// `/v1/embeddings` and `/embeddings`.
pub fn inference_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(embeddings)).routes(routes!(embeddings_unversioned))
}

/// `/v1/models`.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(models))
}

/// An OpenAI embeddings request. OpenAI's other fields (`user`) are taken and ignored, as they concern its own
/// service.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct EmbeddingsRequest {
    /// The model: one of `GET /v1/models`; without it, the default embedder (`--default-embed-model`).
    #[serde(default)]
    model: Option<String>,
    /// A text, a list of texts, a list of token ids, or a list of token-id lists; with `modality: "image"`, a picture or a
    /// list of pictures, each its file as a `data:` URL or base64.
    input: TextsInput,
    /// What `input` holds: `text` (the default) or `image`, for a model that embeds both into one space (CLIP,
    /// SigLIP), as Infinity's clients send it (`extra_body={"modality": "image"}` with the `openai` client).
    #[serde(default)]
    modality: Option<String>,
    /// `float` (default) or `base64` (little-endian FP32).
    #[serde(default)]
    encoding_format: Option<String>,
    /// The embedding's first dimensions only (a Matryoshka model's shorter embedding), renormalised when the model
    /// normalises; at least 1, at most the model's own.
    #[serde(default)]
    dimensions: Option<usize>,
}

/// `POST /v1/embeddings` answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EmbeddingsResponse<'a> {
    /// `list`.
    object: &'static str,
    data: Vec<Embedding>,
    model: &'a str,
    usage: Usage,
}

/// One input's embedding.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Embedding {
    /// `embedding`.
    object: &'static str,
    index: usize,
    /// Numbers, or a base64 string of little-endian FP32 when `encoding_format` is `base64`.
    embedding: Vector,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

/// Tokens the request took.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// OpenAI's error body.
#[derive(Serialize, utoipa::ToSchema)]
pub struct OpenAiError {
    error: OpenAiErrorDetail,
}

/// What went wrong.
#[derive(Serialize, utoipa::ToSchema)]
pub struct OpenAiErrorDetail {
    message: String,
    /// `invalid_request_error`, `rate_limit_error`, `server_error` or `authentication_error`.
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<String>,
    code: Option<String>,
}

/// An error answered in OpenAI's shape.
pub struct OpenAiFailure(AppError);

impl From<AppError> for OpenAiFailure {
    fn from(e: AppError) -> Self {
        OpenAiFailure(e)
    }
}

/// An error, even one the checkpoint answers before the handler (a missing API key, a timeout), in OpenAI's shape.
pub fn failure(e: AppError) -> Response {
    OpenAiFailure(e).into_response()
}

impl IntoResponse for OpenAiFailure {
    fn into_response(self) -> Response {
        let (kind, code) = match self.0.kind {
            ErrorKind::Overloaded => ("rate_limit_error", None),
            ErrorKind::Unavailable | ErrorKind::DeadlineExceeded | ErrorKind::Internal => ("server_error", None),
            ErrorKind::Unauthorized => ("authentication_error", Some("invalid_api_key")),
            ErrorKind::NotFound => ("invalid_request_error", Some("model_not_found")),
            _ => ("invalid_request_error", None),
        };
        self.0.respond(|message| OpenAiError {
            error: OpenAiErrorDetail { message, kind, param: None, code: code.map(str::to_owned) },
        })
    }
}

twin_routes! {
    post embed, (state: State<AppState>, hold: InflightHold, body: Result<Bytes, BytesRejection>)
        -> Result<Response, OpenAiFailure>;
    "Embed texts (OpenAI-compatible)." embeddings at "/v1/embeddings" ();
    "Embed texts (OpenAI-compatible), at the path TEI also serves it." embeddings_unversioned at "/embeddings" ();
    tag = "embeddings", request_body = EmbeddingsRequest,
    responses((status = 200, body = EmbeddingsResponse),
        (status = 400, body = OpenAiError), (status = 401, body = OpenAiError), (status = 404, body = OpenAiError),
        (status = 413, body = OpenAiError), (status = 429, body = OpenAiError), (status = 503, body = OpenAiError)),
    security(("api_key" = []))
}

async fn embed(
    State(state): State<AppState>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiFailure> {
    let body = body.map_err(body_error)?;
    let large = body.len() > INLINE_WORK_BYTES;
    // The body names the model, so it is parsed before there is a model to decode for: large ones off the runtime,
    // with their pictures' base64.
    let parse = move || {
        let mut request = serde_json::from_slice::<EmbeddingsRequest>(&body)
            .map_err(|e| AppError::bad_request(format!("invalid embeddings request: {e}")))?;
        let input = std::mem::replace(&mut request.input, TextsInput::Many(Vec::new()));
        let input = match request.modality.as_deref() {
            None | Some("text") => Input::Texts(TextInput::new(input.into())),
            Some("image") => Input::Images(pictures(input)?),
            Some(other) => {
                return Err(AppError::bad_request(format!(
                    "modality: `{}` is not one of `text`, `image`",
                    quoted(other)
                )))
            }
        };
        Ok::<_, AppError>((request, input))
    };
    let (request, input) = off_runtime_if(large, parse).await??;
    let encoding = match request.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(AppError::bad_request(format!(
                "encoding_format: `{}` is not one of `float`, `base64`",
                quoted(other)
            ))
            .into())
        }
    };
    let entry = match &request.model {
        Some(name) => state.registry().resolve(name, None)?,
        None => default_of(state.registry(), state.defaults(), Service::Embed)?,
    };
    let served_model = ServedModel(entry.label());
    let answer = async {
        let model = entry.serving()?;
        require(&model, Service::Embed)?;
        let mut infer_request = Request::new(input);
        if let Some(n) = request.dimensions {
            infer_request = infer_request.with(Dimensions(n));
        }
        let served = infer(&state, &model, infer_request, &hold).await?;
        let mut headers = served.headers();
        headers.extend(timing_headers(&served, &model));
        let body = encode(served, move |served| encode_embeddings(model.name(), &served.answer, encoding)).await?;
        Ok(respond(headers, "application/json", body))
    };
    let mut response = match answer.await {
        Ok(response) => response,
        Err(e) => OpenAiFailure(e).into_response(),
    };
    response.extensions_mut().insert(served_model);
    Ok(response)
}

/// The pictures of a `modality: "image"` input: each a `data:` URL or base64. This server fetches nothing, so a
/// picture's web address is refused.
fn pictures(input: TextsInput) -> Result<Vec<Bytes>, AppError> {
    let texts = match input {
        TextsInput::One(text) => vec![text],
        TextsInput::Many(texts) => texts,
        TextsInput::Ids(_) | TextsInput::ManyIds(_) => {
            return Err(AppError::bad_request("input: pictures come as data: URLs or base64, not token ids"))
        }
    };
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            if text.starts_with("http://") || text.starts_with("https://") {
                return Err(AppError::bad_request(format!(
                    "input[{i}]: a web address; this server fetches nothing: send the picture as a data: URL or base64"
                )));
            }
            file_from_base64(text)
                .map(Bytes::from)
                .map_err(|e| AppError::bad_request(format!("input[{i}]: not a data: URL or base64 ({e})")))
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Encoding {
    Float,
    Base64,
}

/// OpenAI's embeddings answer: one embedding per row of the answer's one tensor.
fn encode_embeddings(model: &str, answer: &Answer, encoding: Encoding) -> Result<Vec<u8>, CodecError> {
    let tensor = answer.tensors.first().ok_or_else(|| CodecError::Encode("no embeddings".into()))?;
    let values = tensor.to_vec::<f32>().map_err(|e| CodecError::Encode(e.to_string()))?;
    let dim = tensor.shape().last().copied().unwrap_or(1).max(1);
    let data = values
        .chunks_exact(dim)
        .enumerate()
        .map(|(index, row)| Embedding {
            object: "embedding",
            index,
            embedding: match encoding {
                Encoding::Float => Vector::Float(row.to_vec()),
                Encoding::Base64 => {
                    let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
                    Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            },
        })
        .collect();
    let usage = Usage { prompt_tokens: answer.tokens, total_tokens: answer.tokens };
    let response = EmbeddingsResponse { object: "list", data, model, usage };
    serde_json::to_vec(&response).map_err(|e| CodecError::Encode(e.to_string()))
}

/// `GET /v1/models` answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ModelList<'a> {
    /// `list`.
    object: &'static str,
    data: Vec<ModelCard<'a>>,
}

/// One model.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ModelCard<'a> {
    id: &'a str,
    /// `model`.
    object: &'static str,
    created: u64,
    owned_by: &'static str,
}

/// The text models this server embeds with.
#[utoipa::path(get, path = "/v1/models", tag = "embeddings", responses((status = 200, body = ModelList)),
    security(("api_key" = [])))]
async fn models(State(state): State<AppState>) -> Response {
    // A model's versions are one model to OpenAI's clients.
    let names = state.registry().names(|m| inferd_models::registration(&m.config).service == Service::Embed);
    let data = names.iter().map(|id| ModelCard { id, object: "model", created: 0, owned_by: "inferd" }).collect();
    Json(ModelList { object: "list", data }).into_response()
}
