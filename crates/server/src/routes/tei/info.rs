//! TEI's model routes: `GET /info` (what the model is, which `tei-client` reads before it embeds, reranks or
//! classifies) and `POST /` (what the model serves: embed, sparse embed, rerank, classify, or classify tokens;
//! sentence similarity when an embedder's body asks for it, as `huggingface_hub` sends it). Both serve the default
//! text model; `/models/{model}/info` and `POST /models/{model}` serve the named one.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferd_core::Precision;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{TeiError, TeiFailure};
use crate::error::AppError;
use crate::request::{InflightHold, RoutedModel};
use crate::state::AppState;

/// `GET /info`, with the default text model.
pub fn info_default_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(info_default))
}

/// `GET /models/{model}/info`.
pub fn info_named_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(info_named))
}

/// `POST /`, with the default text model.
pub fn root_default_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(root_default))
}

/// `POST /models/{model}`.
pub fn root_named_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(root_named))
}

/// What a model is, in TEI's words.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Info {
    model_id: String,
    model_sha: Option<String>,
    /// `float32`, `float16` or `bfloat16`.
    model_dtype: &'static str,
    served_model_name: String,
    /// `{"embedding": {"pooling"}}`, `{"classifier": {"id2label", "label2id"}}` or `{"reranker": {…}}`.
    #[schema(value_type = Object)]
    model_type: serde_json::Value,
    /// Requests the model's queue holds.
    max_concurrent_requests: usize,
    /// Tokens per text, special tokens included.
    max_input_length: usize,
    max_batch_tokens: usize,
    /// Texts per batch.
    max_batch_requests: Option<usize>,
    /// Texts per request (`--max-rows`).
    max_client_batch_size: usize,
    /// Whether texts past `max_input_length` are cut unless a request says `truncate: false`.
    auto_truncate: bool,
    tokenization_workers: usize,
    /// inferd's version.
    version: &'static str,
    sha: Option<String>,
    docker_label: Option<String>,
}

twin_routes! {
    get info, (state: State<AppState>, model: Result<RoutedModel, AppError>) -> Result<Response, TeiFailure>;
    "What the default text model is." info_default at "/info" ();
    "What the named model is." info_named at "/models/{model}/info" (("model" = String, Path, description = "The model"));
    tag = "models",
    responses((status = 200, body = Info), (status = 400, body = TeiError), (status = 401, body = TeiError),
        (status = 404, body = TeiError)),
    security(("api_key" = []))
}

async fn info(State(state): State<AppState>, model: Result<RoutedModel, AppError>) -> Result<Response, TeiFailure> {
    let entry = model?.current(state.registry())?;
    let loaded = entry.serving()?;
    let meta = loaded.metadata();
    let text = meta.text.as_ref().ok_or_else(|| {
        AppError::bad_request(format!(
            "model `{}` takes tensors, not text: TEI's routes serve text models",
            entry.name()
        ))
    })?;
    let model_type = super::model_type(&loaded, text).ok_or_else(|| {
        AppError::bad_request(format!(
            "model `{}` {}: TEI's routes serve text models",
            entry.name(),
            loaded.service().does()
        ))
    })?;
    let batching = &loaded.batching;
    let info = Info {
        model_id: entry.name().to_owned(),
        model_sha: None,
        model_dtype: match meta.precision {
            Precision::Fp32 => "float32",
            Precision::Fp16 => "float16",
            Precision::Bf16 => "bfloat16",
        },
        served_model_name: entry.name().to_owned(),
        model_type,
        max_concurrent_requests: batching.max_queue_size,
        max_input_length: text.max_seq_len,
        max_batch_tokens: batching.max_batch_tokens,
        max_batch_requests: Some(batching.max_batch_size),
        max_client_batch_size: state.limits().max_rows,
        auto_truncate: true,
        tokenization_workers: std::thread::available_parallelism().map_or(1, usize::from),
        version: env!("CARGO_PKG_VERSION"),
        sha: None,
        docker_label: None,
    };
    Ok(Json(info).into_response())
}

twin_routes! {
    post super::root, (
        state: State<AppState>,
        model: Result<RoutedModel, AppError>,
        hold: InflightHold,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<Response, TeiFailure>;
    "Serve what the default text model serves." root_default at "/" ();
    "Serve what the named model serves." root_named at "/models/{model}" (("model" = String, Path, description = "The model"));
    tag = "embeddings",
    request_body(content = Object, description = "The body of `/embed`, `/embed_sparse`, `/rerank`, `/predict` or `/similarity`, or the Inference API's token classification, as the model's task takes"),
    responses((status = 200, description = "As the task's own route answers"),
        (status = 400, body = TeiError), (status = 401, body = TeiError), (status = 404, body = TeiError),
        (status = 413, body = TeiError), (status = 429, body = TeiError), (status = 503, body = TeiError)),
    security(("api_key" = []))
}
