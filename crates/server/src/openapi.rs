//! The OpenAPI document's frame (title, the bearer-key scheme, tags) and the shapes of the bodies whose decoders
//! stream straight into typed bytes: these types describe those bodies for the document and are never decoded.
//! The paths themselves come from the handlers' `#[utoipa::path]` attributes, registered with the router.

#![allow(dead_code)]

use std::collections::HashMap;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, IntoResponses, Modify, OpenApi, ToSchema};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "inferd",
        description = "GPU inference server: `/predict`, the KServe v2 / Open Inference Protocol (with Triton's \
                       binary tensor extension), health probes and Prometheus metrics."
    ),
    modifiers(&BearerKey),
    tags(
        (name = "inference", description = "Predictions, batched dynamically per model"),
        (name = "kserve-v2", description = "KServe v2 / Open Inference Protocol"),
        (name = "health", description = "Probes for orchestrators; never need a key"),
        (name = "metrics", description = "Prometheus"),
    )
)]
pub struct ApiDoc;

/// Declares the `api_key` scheme the protected routes name: `Authorization: Bearer <key>`.
struct BearerKey;

impl Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("Needed when the server runs with --api-key or --api-key-file"))
                    .build(),
            ),
        );
    }
}

/// Every error answer.
#[derive(ToSchema)]
pub struct ErrorBody {
    /// What went wrong, and usually how to fix it.
    error: String,
}

/// A probe's answer.
#[derive(ToSchema)]
pub struct Status {
    /// `alive`, `ready`, `starting`, `degraded` or `draining`.
    status: String,
    /// Why the server is not ready.
    error: Option<String>,
}

/// The answers an inference route gives besides success.
#[derive(IntoResponses)]
pub enum InferErrors {
    /// Malformed JSON, a wrong input name, shape or data type, a number out of range, JSON nested too deep.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// An API key is configured and the request carries none, or a wrong one.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// No such model (or model version).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// The body, its tensor elements or its rows are over the server's limits.
    #[response(status = 413)]
    PayloadTooLarge(ErrorBody),
    /// The model's queue is full; retry after `Retry-After` seconds.
    #[response(status = 429)]
    Overloaded(ErrorBody),
    /// The model is not ready, the server is draining, or the request's deadline passed in the queue.
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// Headers `/predict` reads.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct TimeoutHeader {
    /// Milliseconds the request may wait in the queue; past that it is answered 503 and never runs.
    #[param(rename = "x-inferd-timeout-ms")]
    timeout_ms: Option<u64>,
}

/// A `/predict` body: one input as `input`, or several by name in `inputs`. Tensors are nested arrays, one
/// array per row.
#[derive(ToSchema)]
#[schema(example = json!({"input": [[0.0, 0.5, 1.0]]}))]
pub struct PredictRequest {
    /// The model's only input, as nested arrays (rows first).
    #[schema(value_type = Option<Vec<Value>>)]
    input: Option<serde_json::Value>,
    /// Several inputs by name.
    #[schema(value_type = Option<HashMap<String, Vec<Value>>>)]
    inputs: Option<HashMap<String, serde_json::Value>>,
}

/// A `/predict` answer.
#[derive(ToSchema)]
pub struct PredictResponse {
    /// The model's only output as nested arrays, or an object of outputs by name.
    #[schema(value_type = Value)]
    prediction: serde_json::Value,
    model: String,
    /// Where the model ran: `cpu` or `cuda:N`.
    device: String,
}

/// `GET /v2`.
#[derive(ToSchema)]
pub struct V2ServerMetadata {
    name: String,
    version: String,
    extensions: Vec<String>,
}

/// A tensor's name, KServe data type and shape (`-1` for a variable dimension).
#[derive(ToSchema)]
pub struct V2TensorMetadata {
    name: String,
    datatype: String,
    shape: Vec<i64>,
}

/// `GET /v2/models/{model}`.
#[derive(ToSchema)]
pub struct V2ModelMetadata {
    name: String,
    versions: Vec<String>,
    platform: String,
    inputs: Vec<V2TensorMetadata>,
    outputs: Vec<V2TensorMetadata>,
}

/// One input of a v2 inference request: `data` (flat or nested, row-major), or binary data after the JSON.
#[derive(ToSchema)]
pub struct V2Input {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    /// `binary_data_size`: the input's bytes follow the JSON.
    #[schema(value_type = Option<Object>)]
    parameters: Option<serde_json::Value>,
    #[schema(value_type = Option<Vec<Value>>)]
    data: Option<serde_json::Value>,
}

/// An output asked for by name; `parameters.binary_data` asks for it in binary.
#[derive(ToSchema)]
pub struct V2RequestedOutput {
    name: String,
    #[schema(value_type = Option<Object>)]
    parameters: Option<serde_json::Value>,
}

/// A v2 inference request (the JSON part, when binary tensors follow it: its length is then in
/// `Inference-Header-Content-Length`).
#[derive(ToSchema)]
pub struct V2InferRequest {
    id: Option<String>,
    /// `binary_data_output`, `timeout` (microseconds in the queue); `priority` is accepted and ignored.
    #[schema(value_type = Option<Object>)]
    parameters: Option<serde_json::Value>,
    inputs: Vec<V2Input>,
    outputs: Option<Vec<V2RequestedOutput>>,
}

/// One output of a v2 answer: `data`, or `parameters.binary_data_size` bytes after the JSON.
#[derive(ToSchema)]
pub struct V2Output {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[schema(value_type = Option<Object>)]
    parameters: Option<serde_json::Value>,
    #[schema(value_type = Option<Vec<Value>>)]
    data: Option<serde_json::Value>,
}

/// A v2 inference answer.
#[derive(ToSchema)]
pub struct V2InferResponse {
    model_name: String,
    model_version: String,
    id: Option<String>,
    outputs: Vec<V2Output>,
}

/// `POST /v2/repository/index` body (optional).
#[derive(ToSchema)]
pub struct V2IndexRequest {
    /// Only the models that are ready.
    ready: Option<bool>,
}

/// One model in the repository index.
#[derive(ToSchema)]
pub struct V2IndexEntry {
    name: String,
    version: String,
    /// `READY`, `LOADING` or `UNAVAILABLE`.
    state: String,
    reason: String,
}
