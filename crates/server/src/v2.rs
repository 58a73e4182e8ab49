//! The KServe v2 / Open Inference Protocol routes, with Triton's binary tensor extension, so that Triton's
//! clients work unchanged.
//!
//! Every model has one version, `1`. Requests carry a JSON header, optionally followed by binary tensors (their
//! sizes in each input's `binary_data_size`, the JSON's length in `Inference-Header-Content-Length`); answers do
//! the same for outputs asked for in binary.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferd_batcher::InferRequest;
use inferd_core::{element_count, DataType, ModelMetadata, Tensor, TensorSpec};
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::value::RawValue;

use crate::codec::{self, names, FlatJson};
use crate::error::AppError;
use crate::http::{body_error, deadline_in, run_inference, AppState};
use crate::models::ModelState;
use crate::openapi::{self, ErrorBody, InferErrors};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The header that gives the length of the JSON part of a body followed by binary tensors.
pub const HEADER_LENGTH: &str = "inference-header-content-length";
/// The one version every model has.
pub const MODEL_VERSION: &str = "1";

/// The server probes, open to all.
pub fn health_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(server_live)).routes(routes!(server_ready))
}

/// Everything else, behind the API key when one is configured.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(server_metadata))
        .routes(routes!(repository_index))
        .routes(routes!(model_metadata))
        .routes(routes!(version_metadata))
        .routes(routes!(model_ready))
        .routes(routes!(version_ready))
        .routes(routes!(model_config))
        .routes(routes!(version_config))
        .routes(routes!(infer))
        .routes(routes!(version_infer))
}

/// The model a v2 route names (percent-decoded), its version checked.
struct ModelName(String);

impl<S: Send + Sync> FromRequestParts<S> for ModelName {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| AppError::BadRequest(e.body_text()))?;
        let name = params.get("model").cloned().unwrap_or_default();
        match params.get("version") {
            Some(v) if v != MODEL_VERSION => Err(AppError::NotFound(format!(
                "model `{name}` has no version `{v}`: inferd serves each model as version {MODEL_VERSION}"
            ))),
            _ => Ok(ModelName(name)),
        }
    }
}

/// Server metadata.
#[utoipa::path(get, path = "/v2", tag = "kserve-v2", responses((status = 200, body = openapi::V2ServerMetadata)),
    security(("api_key" = [])))]
async fn server_metadata() -> Json<serde_json::Value> {
    Json(json!({
        "name": "inferd",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data", "model_repository"],
    }))
}

/// Server liveness.
#[utoipa::path(get, path = "/v2/health/live", tag = "kserve-v2", responses((status = 200, description = "Live")))]
async fn server_live() -> StatusCode {
    StatusCode::OK
}

/// Server readiness: every model ready and the server not draining.
#[utoipa::path(get, path = "/v2/health/ready", tag = "kserve-v2", responses(
    (status = 200, description = "Ready"), (status = 503, body = ErrorBody, description = "Not ready, or draining")))]
async fn server_ready(State(state): State<AppState>) -> Result<StatusCode, AppError> {
    match state.readiness() {
        None => Ok(StatusCode::OK),
        Some(reason) => Err(AppError::Unavailable(reason)),
    }
}

#[derive(Deserialize, Default)]
struct IndexRequest {
    #[serde(default)]
    ready: bool,
}

/// The models and their states.
#[utoipa::path(post, path = "/v2/repository/index", tag = "kserve-v2",
    request_body(content = Option<openapi::V2IndexRequest>),
    responses((status = 200, body = Vec<openapi::V2IndexEntry>), (status = 400, body = ErrorBody)),
    security(("api_key" = [])))]
async fn repository_index(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let body = body.map_err(body_error)?;
    let request: IndexRequest = if body.iter().all(u8::is_ascii_whitespace) {
        IndexRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| AppError::BadRequest(format!("invalid index request: {e}")))?
    };
    let index: Vec<serde_json::Value> = state
        .shared()
        .models
        .iter()
        .filter_map(|m| {
            let (state, reason) = match m.state() {
                ModelState::Ready(_) => ("READY", String::new()),
                ModelState::Loading => ("LOADING", String::new()),
                ModelState::Failed(e) => ("UNAVAILABLE", e.to_owned()),
            };
            (!request.ready || state == "READY")
                .then(|| json!({ "name": m.name(), "version": MODEL_VERSION, "state": state, "reason": reason }))
        })
        .collect();
    Ok(Json(index).into_response())
}

#[derive(Serialize)]
struct ModelMetadataJson<'a> {
    name: &'a str,
    versions: [&'static str; 1],
    platform: &'static str,
    inputs: &'a [TensorSpec],
    outputs: &'a [TensorSpec],
}

/// A model's inputs and outputs.
#[utoipa::path(get, path = "/v2/models/{model}", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    responses((status = 200, body = openapi::V2ModelMetadata), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn model_metadata(State(state): State<AppState>, ModelName(name): ModelName) -> Result<Response, AppError> {
    let batcher = state.batcher(&name)?;
    let meta = batcher.metadata();
    Ok(Json(ModelMetadataJson {
        name: &name,
        versions: [MODEL_VERSION],
        platform: meta.platform,
        inputs: &meta.inputs,
        outputs: &meta.outputs,
    })
    .into_response())
}

/// A model's readiness.
#[utoipa::path(get, path = "/v2/models/{model}/ready", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    responses((status = 200, description = "Ready"), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn model_ready(State(state): State<AppState>, ModelName(name): ModelName) -> Result<StatusCode, AppError> {
    state.batcher(&name).map(|_| StatusCode::OK)
}

/// Triton's name for a data type in a model configuration.
fn config_type(datatype: DataType) -> String {
    match datatype {
        DataType::Bytes => "TYPE_STRING".into(),
        other => format!("TYPE_{}", other.as_str()),
    }
}

/// A model's configuration, in Triton's terms.
#[utoipa::path(get, path = "/v2/models/{model}/config", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    responses((status = 200, body = Object, description = "Triton-style model configuration"),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn model_config(State(state): State<AppState>, ModelName(name): ModelName) -> Result<Response, AppError> {
    let model = state.model(&name)?;
    let batcher = state.batcher(&name)?;
    let meta = batcher.metadata();
    let tensors = |specs: &[TensorSpec]| -> Vec<serde_json::Value> {
        specs
            .iter()
            .map(|s| json!({ "name": s.name, "data_type": config_type(s.datatype), "dims": s.row_dims() }))
            .collect()
    };
    let batching = &model.config.batching;
    Ok(Json(json!({
        "name": name,
        "platform": meta.platform,
        "backend": model.config.backend.as_str(),
        "max_batch_size": batching.max_batch_size,
        "input": tensors(&meta.inputs),
        "output": tensors(&meta.outputs),
        "dynamic_batching": {
            "max_queue_delay_microseconds": batching.max_queue_delay_us,
            "preferred_batch_size": batching.preferred_batch_sizes,
            "default_queue_policy": { "max_queue_size": batching.max_queue_size, "default_timeout_microseconds": batching.timeout_ms * 1000 },
        },
        "instance_group": [{
            "count": model.config.instances,
            "kind": if meta.on_gpu() { "KIND_GPU" } else { "KIND_CPU" },
        }],
        "parameters": { "device": meta.device, "precision": meta.precision.as_str() },
    }))
    .into_response())
}

#[derive(Deserialize)]
struct InferRequestJson<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: RequestParameters,
    #[serde(borrow)]
    inputs: Vec<InputJson<'a>>,
    #[serde(default)]
    outputs: Option<Vec<OutputJson>>,
}

#[derive(Deserialize, Default)]
struct RequestParameters {
    #[serde(default)]
    binary_data_output: bool,
    /// Microseconds the request may wait in the queue.
    timeout: Option<u64>,
    /// Accepted and ignored: inferd has no request priorities yet.
    #[serde(rename = "priority")]
    _priority: Option<u64>,
}

#[derive(Deserialize)]
struct InputJson<'a> {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: InputParameters,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct InputParameters {
    binary_data_size: Option<u64>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: OutputParameters,
}

#[derive(Deserialize, Default)]
struct OutputParameters {
    binary_data: Option<bool>,
    classification: Option<u64>,
}

/// A decoded inference request.
#[derive(Debug)]
pub struct Decoded {
    pub id: Option<String>,
    /// In the model's input order.
    pub inputs: Vec<Tensor>,
    /// The outputs to answer with, as (index into the model's outputs, in binary?).
    pub outputs: Vec<(usize, bool)>,
    pub timeout: Option<Duration>,
}

/// Decodes a v2 inference request body; `header_length` is the `Inference-Header-Content-Length` header, if
/// any. Errors are the client's fault (400).
pub fn decode_infer(body: &[u8], header_length: Option<usize>, meta: &ModelMetadata) -> Result<Decoded, String> {
    let json_len = header_length.unwrap_or(body.len());
    if json_len > body.len() {
        return Err(format!(
            "Inference-Header-Content-Length is {json_len}, but the body holds only {} bytes",
            body.len()
        ));
    }
    let (json, mut binary) = body.split_at(json_len);
    let request: InferRequestJson<'_> =
        serde_json::from_slice(json).map_err(|e| format!("invalid inference request JSON: {e}"))?;
    // Binary tensors follow the JSON in the order of the JSON's inputs.
    let mut decoded: Vec<Option<Tensor>> = vec![None; meta.inputs.len()];
    for input in &request.inputs {
        let slot = meta
            .inputs
            .iter()
            .position(|s| s.name == input.name)
            .ok_or_else(|| format!("unexpected input `{}`: the model takes {}", input.name, names(&meta.inputs)))?;
        if decoded[slot].is_some() {
            return Err(format!("input `{}` is given twice", input.name));
        }
        decoded[slot] = Some(decode_input(input, &meta.inputs[slot], &mut binary)?);
    }
    if !binary.is_empty() {
        return Err(format!("{} bytes of binary data follow the inputs that claim them", binary.len()));
    }
    let inputs = decoded
        .into_iter()
        .zip(&meta.inputs)
        .map(|(t, spec)| t.ok_or_else(|| format!("missing input `{}`", spec.name)))
        .collect::<Result<Vec<_>, _>>()?;
    let default_binary = request.parameters.binary_data_output;
    let outputs = match &request.outputs {
        None => (0..meta.outputs.len()).map(|i| (i, default_binary)).collect(),
        Some(asked) => asked
            .iter()
            .map(|o| {
                if o.parameters.classification.is_some() {
                    return Err(format!("output `{}`: the classification extension is not supported", o.name));
                }
                let i = meta.outputs.iter().position(|s| s.name == o.name).ok_or_else(|| {
                    format!("unexpected output `{}`: the model gives {}", o.name, names(&meta.outputs))
                })?;
                Ok((i, o.parameters.binary_data.unwrap_or(default_binary)))
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    Ok(Decoded { id: request.id, inputs, outputs, timeout: request.parameters.timeout.map(Duration::from_micros) })
}

/// Decodes one input, taking its binary data (if any) from the front of `binary`.
fn decode_input(input: &InputJson<'_>, spec: &TensorSpec, binary: &mut &[u8]) -> Result<Tensor, String> {
    let name = &input.name;
    let datatype: DataType = input.datatype.parse().map_err(|e| format!("input `{name}`: {e}"))?;
    let shape = input
        .shape
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| format!("input `{name}`: shape {:?} has a negative dimension", input.shape))
        })
        .collect::<Result<Vec<usize>, _>>()?;
    if !spec.accepts(&shape) {
        return Err(format!("input `{name}`: shape {shape:?} does not fit the model's {:?}", spec.shape));
    }
    let count = element_count(&shape).map_err(|e| format!("input `{name}`: {e}"))?;
    match (input.parameters.binary_data_size, input.data) {
        (Some(size), None) => {
            if datatype != spec.datatype {
                return Err(format!("input `{name}`: the model takes {}, got {datatype}", spec.datatype));
            }
            let size = usize::try_from(size).map_err(|_| format!("input `{name}`: binary_data_size is too large"))?;
            if size > binary.len() {
                return Err(format!(
                    "input `{name}`: binary_data_size is {size}, but only {} bytes of binary data are left",
                    binary.len()
                ));
            }
            let (bytes, rest) = binary.split_at(size);
            *binary = rest;
            decode_binary(name, datatype, shape, count, bytes)
        }
        (None, Some(data)) => {
            let convertible = datatype.is_float() && spec.datatype.is_float();
            if datatype != spec.datatype && !convertible {
                return Err(format!("input `{name}`: the model takes {}, got {datatype}", spec.datatype));
            }
            codec::decode_flat(data.get(), spec, shape)
        }
        (Some(_), Some(_)) => Err(format!("input `{name}` has both `data` and binary_data_size")),
        (None, None) => Err(format!("input `{name}` has neither `data` nor binary_data_size")),
    }
}

/// A tensor from its binary form: little-endian elements, or for BYTES a 4-byte length before each element.
fn decode_binary(
    name: &str,
    datatype: DataType,
    shape: Vec<usize>,
    count: usize,
    bytes: &[u8],
) -> Result<Tensor, String> {
    match datatype.size() {
        Some(size) => {
            let expected =
                count.checked_mul(size).ok_or_else(|| format!("input `{name}`: shape {shape:?} is too large"))?;
            if bytes.len() != expected {
                return Err(format!(
                    "input `{name}`: binary_data_size is {}, but {datatype} {shape:?} needs {expected} bytes",
                    bytes.len()
                ));
            }
            Tensor::new(datatype, shape, bytes.to_vec()).map_err(|e| format!("input `{name}`: {e}"))
        }
        None => {
            let mut elements = Vec::new();
            let mut rest = bytes;
            while rest.len() >= 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                rest = &rest[4..];
                if len > rest.len() {
                    return Err(format!("input `{name}`: a BYTES element of {len} bytes runs past its binary data"));
                }
                elements.push(rest[..len].to_vec());
                rest = &rest[len..];
                if elements.len() > count {
                    break;
                }
            }
            if !rest.is_empty() || elements.len() != count {
                return Err(format!(
                    "input `{name}`: the binary data holds {} BYTES elements{}, but shape {shape:?} needs {count}",
                    elements.len(),
                    if rest.is_empty() { "" } else { " and a partial one" }
                ));
            }
            Tensor::from_byte_strings(shape, elements).map_err(|e| format!("input `{name}`: {e}"))
        }
    }
}

#[derive(Serialize)]
struct InferResponseJson<'a> {
    model_name: &'a str,
    model_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    outputs: Vec<OutputResponseJson<'a>>,
}

#[derive(Serialize)]
struct OutputResponseJson<'a> {
    name: &'a str,
    datatype: DataType,
    shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<FlatJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<BinaryParameters>,
}

#[derive(Serialize)]
struct BinaryParameters {
    binary_data_size: usize,
}

/// The binary form of a tensor (see [`decode_binary`]).
fn binary_form(t: &Tensor, out: &mut Vec<u8>) {
    match (t.raw_bytes(), t.byte_strings()) {
        (Some(bytes), _) => out.extend_from_slice(bytes),
        (None, Some(strings)) => {
            for s in strings {
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s);
            }
        }
        (None, None) => {}
    }
}

/// Encodes an answer: the JSON, then the binary outputs in the JSON's order. Returns the body and, when binary
/// outputs follow, the JSON's length.
pub fn encode_infer(
    model: &str,
    id: Option<&str>,
    meta: &ModelMetadata,
    outputs: &[Tensor],
    selection: &[(usize, bool)],
) -> Result<(Vec<u8>, Option<usize>), String> {
    let mut binary = Vec::new();
    let mut json_outputs = Vec::with_capacity(selection.len());
    for &(i, as_binary) in selection {
        let t = outputs.get(i).ok_or_else(|| format!("the engine returned no output {i}"))?;
        let parameters = as_binary.then(|| {
            let start = binary.len();
            binary_form(t, &mut binary);
            BinaryParameters { binary_data_size: binary.len() - start }
        });
        json_outputs.push(OutputResponseJson {
            name: &meta.outputs[i].name,
            datatype: t.dtype(),
            shape: t.shape(),
            data: (!as_binary).then_some(FlatJson(t)),
            parameters,
        });
    }
    let response = InferResponseJson { model_name: model, model_version: MODEL_VERSION, id, outputs: json_outputs };
    let mut body = serde_json::to_vec(&response).map_err(|e| e.to_string())?;
    let json_len = body.len();
    let has_binary = selection.iter().any(|&(_, b)| b);
    body.extend_from_slice(&binary);
    Ok((body, has_binary.then_some(json_len)))
}

fn header_length(headers: &HeaderMap) -> Result<Option<usize>, AppError> {
    headers
        .get(HEADER_LENGTH)
        .map(|v| {
            v.to_str().ok().and_then(|s| s.trim().parse::<usize>().ok()).ok_or_else(|| {
                AppError::BadRequest("Inference-Header-Content-Length must be a non-negative integer".into())
            })
        })
        .transpose()
}

/// Runs an inference.
#[utoipa::path(post, path = "/v2/models/{model}/infer", tag = "kserve-v2", params(("model" = String, Path, description = "The model")),
    request_body(description = "JSON, or JSON followed by binary tensors (`Inference-Header-Content-Length`)",
        content((openapi::V2InferRequest = "application/json"), ("application/octet-stream"))),
    responses((status = 200, description = "JSON, or JSON followed by binary outputs",
        content((openapi::V2InferResponse = "application/json"), ("application/octet-stream"))), InferErrors),
    security(("api_key" = [])))]
async fn infer(
    State(state): State<AppState>,
    ModelName(name): ModelName,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    let batcher = state.batcher(&name)?;
    let body = body.map_err(body_error)?;
    let json_len = header_length(&headers)?;
    let (encoded, mut headers) = run_inference(
        &state,
        batcher,
        body,
        move |body, meta, limits| {
            codec::check_json_depth(&body[..json_len.unwrap_or(body.len()).min(body.len())], limits.max_json_depth)?;
            let request = decode_infer(body, json_len, meta)?;
            let deadline = request.timeout.and_then(deadline_in);
            Ok((InferRequest::new(request.inputs).with_deadline(deadline), (request.id, request.outputs)))
        },
        move |meta, outputs, (id, selection)| encode_infer(&name, id.as_deref(), meta, outputs, &selection),
    )
    .await?;
    let (body, json_len) = encoded;
    match json_len {
        Some(len) => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            headers.insert(HEADER_LENGTH, HeaderValue::from(len as u64));
        }
        None => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    Ok((headers, body).into_response())
}

// The same handlers under `/versions/{version}`: one function per documented path.

/// A model version's inputs and outputs.
#[utoipa::path(get, path = "/v2/models/{model}/versions/{version}", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "Always `1`")),
    responses((status = 200, body = openapi::V2ModelMetadata), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn version_metadata(state: State<AppState>, name: ModelName) -> Result<Response, AppError> {
    model_metadata(state, name).await
}

/// A model version's readiness.
#[utoipa::path(get, path = "/v2/models/{model}/versions/{version}/ready", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "Always `1`")),
    responses((status = 200, description = "Ready"), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn version_ready(state: State<AppState>, name: ModelName) -> Result<StatusCode, AppError> {
    model_ready(state, name).await
}

/// A model version's configuration.
#[utoipa::path(get, path = "/v2/models/{model}/versions/{version}/config", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "Always `1`")),
    responses((status = 200, body = Object, description = "Triton-style model configuration"),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
async fn version_config(state: State<AppState>, name: ModelName) -> Result<Response, AppError> {
    model_config(state, name).await
}

/// Runs an inference on a model version.
#[utoipa::path(post, path = "/v2/models/{model}/versions/{version}/infer", tag = "kserve-v2", params(("model" = String, Path, description = "The model"), ("version" = String, Path, description = "Always `1`")),
    request_body(description = "JSON, or JSON followed by binary tensors (`Inference-Header-Content-Length`)",
        content((openapi::V2InferRequest = "application/json"), ("application/octet-stream"))),
    responses((status = 200, description = "JSON, or JSON followed by binary outputs",
        content((openapi::V2InferResponse = "application/json"), ("application/octet-stream"))), InferErrors),
    security(("api_key" = [])))]
async fn version_infer(
    state: State<AppState>,
    name: ModelName,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AppError> {
    infer(state, name, headers, body).await
}

#[cfg(test)]
mod tests;
