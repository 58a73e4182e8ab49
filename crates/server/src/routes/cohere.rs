//! The rerank APIs of hosted services, so their clients (Cohere's SDK, LangChain's and LlamaIndex's Cohere and Jina
//! rerankers) work by changing a base URL: `POST /v1/rerank` (Cohere v1 and Jina, whose shapes agree) and
//! `POST /v2/rerank` (Cohere v2). The body's `model` picks a served reranker; a name this server does not serve
//! (a hosted model's, as clients send by default) gets the default reranker. Errors carry Cohere's `message` and
//! Jina's `detail`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use inferd_models::{Input, Request, Service, TextInput};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::codec::{quoted, CodecError};
use crate::error::{body_error, AppError};
use crate::ops::infer::{encode, infer, off_runtime_if, respond};
use crate::ops::text::{ranked, rerank_pairs, timing_headers};
use crate::request::{default_of, InflightHold, ServedModel};
use crate::state::AppState;

/// `/v1/rerank` and `/v2/rerank`.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(rerank_v1)).routes(routes!(rerank_v2))
}

/// A rerank request in Cohere's (and Jina's) shape.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    /// A served reranker; another name gets the default reranker.
    #[serde(default)]
    model: Option<String>,
    query: String,
    /// Texts, or objects whose `rank_fields` (default `text`) are ranked.
    #[schema(value_type = Vec<Object>)]
    documents: Vec<serde_json::Value>,
    /// The best `top_n` results (default all).
    #[serde(default)]
    top_n: Option<usize>,
    /// Echo each document in its result (v1, Jina).
    #[serde(default)]
    return_documents: Option<bool>,
    /// The fields of object documents that are ranked, joined by lines.
    #[serde(default)]
    rank_fields: Option<Vec<String>>,
}

/// A rerank answer in Cohere's shape, with Jina's `model` and `usage`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RerankResponse {
    id: String,
    /// Best first.
    results: Vec<RerankResult>,
    meta: serde_json::Value,
    model: String,
    usage: Usage,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct RerankResult {
    /// The document's position in the request.
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    document: Option<serde_json::Value>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Usage {
    total_tokens: usize,
    prompt_tokens: usize,
}

/// The error body: Cohere's `message`, Jina's (FastAPI's) `detail`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RerankError {
    message: String,
    detail: String,
}

/// An error, even one the checkpoint answers itself, in Cohere's and Jina's shape.
pub fn failure(e: AppError) -> Response {
    e.respond(|message| RerankError { detail: message.clone(), message })
}

/// Rerank documents against a query: Cohere's v1 API and Jina's.
#[utoipa::path(post, path = "/v1/rerank", tag = "rerank", request_body = RerankRequest,
    responses((status = 200, body = RerankResponse), (status = 400, body = RerankError), (status = 401, body = RerankError),
        (status = 413, body = RerankError), (status = 429, body = RerankError), (status = 503, body = RerankError)),
    security(("api_key" = [])))]
async fn rerank_v1(state: State<AppState>, hold: InflightHold, body: Result<Bytes, BytesRejection>) -> Response {
    rerank(state, hold, body, "1").await
}

/// Rerank documents against a query: Cohere's v2 API.
#[utoipa::path(post, path = "/v2/rerank", tag = "rerank", request_body = RerankRequest,
    responses((status = 200, body = RerankResponse), (status = 400, body = RerankError), (status = 401, body = RerankError),
        (status = 413, body = RerankError), (status = 429, body = RerankError), (status = 503, body = RerankError)),
    security(("api_key" = [])))]
async fn rerank_v2(state: State<AppState>, hold: InflightHold, body: Result<Bytes, BytesRejection>) -> Response {
    rerank(state, hold, body, "2").await
}

/// The text a document ranks by: a string, or an object's `fields` joined by lines.
fn document_text(document: &serde_json::Value, fields: &[String], i: usize) -> Result<String, AppError> {
    match document {
        serde_json::Value::String(text) => Ok(text.clone()),
        serde_json::Value::Object(object) => {
            let parts = fields
                .iter()
                .map(|f| match object.get(f) {
                    Some(serde_json::Value::String(s)) => Ok(s.clone()),
                    _ => Err(AppError::bad_request(format!(
                        "documents[{i}] has no text field `{}` to rank by (rank_fields)",
                        quoted(f)
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(parts.join("\n"))
        }
        _ => Err(AppError::bad_request(format!("documents[{i}] is neither a text nor an object"))),
    }
}

async fn rerank(
    State(state): State<AppState>,
    InflightHold(hold): InflightHold,
    body: Result<Bytes, BytesRejection>,
    version: &'static str,
) -> Response {
    let mut label = None;
    let answer = async {
        let body = body.map_err(body_error)?;
        let large = body.len() > crate::ops::infer::INLINE_WORK_BYTES;
        let request: RerankRequest = off_runtime_if(large, move || serde_json::from_slice(&body))
            .await?
            .map_err(|e| AppError::bad_request(format!("invalid rerank request: {e}")))?;
        let registry = state.registry();
        let entry = match request.model.as_deref().and_then(|name| registry.find(name)) {
            Some(entry) if inferd_models::registration(&entry.config).service == Service::Rerank => entry,
            _ => default_of(registry, state.defaults(), Service::Rerank)?,
        };
        label = Some(ServedModel(entry.label()));
        let model = entry.serving()?;
        if request.top_n == Some(0) {
            return Err(AppError::bad_request("top_n: at least 1"));
        }
        let fields = request.rank_fields.clone().unwrap_or_else(|| vec!["text".to_owned()]);
        let texts = request
            .documents
            .iter()
            .enumerate()
            .map(|(i, d)| document_text(d, &fields, i))
            .collect::<Result<Vec<_>, _>>()?;
        let pairs =
            rerank_pairs(&request.query, &texts, "documents").map_err(|e| AppError::from(e).in_model(model.name()))?;
        let infer_request = Request::new(Input::Texts(TextInput::new(pairs)));
        let served = infer(&state, &model, infer_request, &hold).await?;
        let mut headers = served.headers();
        headers.extend(timing_headers(&served, &model));
        let name = model.name().to_owned();
        let body = encode(served, move |served| {
            let documents = request.return_documents.unwrap_or(false).then_some(request.documents);
            let results = ranked(&served.answer.tensors)?
                .into_iter()
                .take(request.top_n.unwrap_or(usize::MAX))
                .map(|(index, relevance_score)| RerankResult {
                    index,
                    relevance_score,
                    document: documents.as_ref().map(|d| match &d[index] {
                        serde_json::Value::String(text) => serde_json::json!({ "text": text }),
                        other => other.clone(),
                    }),
                })
                .collect();
            let tokens = served.answer.tokens;
            let response = RerankResponse {
                id: uuid::Uuid::from_u128(fastrand::u128(..)).hyphenated().to_string(),
                results,
                meta: serde_json::json!({ "api_version": { "version": version }, "billed_units": { "search_units": 1 } }),
                model: name,
                usage: Usage { total_tokens: tokens, prompt_tokens: tokens },
            };
            serde_json::to_vec(&response).map_err(|e| CodecError::Encode(e.to_string()))
        })
        .await?;
        Ok::<_, AppError>(respond(headers, "application/json", body))
    };
    let mut response = answer.await.unwrap_or_else(failure);
    if let Some(label) = label {
        response.extensions_mut().insert(label);
    }
    response
}
