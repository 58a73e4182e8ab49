//! Triton's logging and trace extensions over HTTP: the log's settings ([`crate::logging`]) and the trace settings,
//! the server's and each model's ([`crate::trace`]), read and changed while the server runs.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::json_request;
use crate::error::{AppError, ErrorBody};
use crate::logging::{logging, LogSettings, LogUpdate};
use crate::request::resolve_named;
use crate::state::AppState;
use crate::trace::Change;

/// The routes, behind the API key when one is configured.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(log_settings, update_log_settings))
        .routes(routes!(trace_settings, update_trace_settings))
        .routes(routes!(model_trace_settings, update_model_trace_settings))
}

/// The log's settings.
#[utoipa::path(get, path = "/v2/logging", tag = "kserve-v2", responses((status = 200, body = LogSettings)),
    security(("api_key" = [])))]
async fn log_settings() -> Json<LogSettings> {
    Json(logging().settings())
}

/// Changes some of the log's settings; answers them all.
#[utoipa::path(post, path = "/v2/logging", tag = "kserve-v2", request_body(content = LogUpdate),
    responses((status = 200, body = LogSettings), (status = 400, body = ErrorBody)), security(("api_key" = [])))]
async fn update_log_settings(body: Result<Bytes, BytesRejection>) -> Result<Json<LogSettings>, AppError> {
    let update: LogUpdate = json_request(body, "log settings")?;
    Ok(Json(logging().update(update)?))
}

/// Trace settings as Triton's HTTP API gives them: each a string, `trace_level` a list.
fn shown(settings: BTreeMap<&'static str, Vec<String>>) -> serde_json::Value {
    let fields = settings.into_iter().map(|(name, mut values)| {
        let value = match name {
            "trace_level" => serde_json::json!(values),
            _ => serde_json::json!(values.pop().unwrap_or_default()),
        };
        (name.to_owned(), value)
    });
    serde_json::Value::Object(fields.collect())
}

/// A trace settings body: each value a string or a list of strings, or `null` to reset it.
fn changes(body: Result<Bytes, BytesRejection>) -> Result<Vec<Change>, AppError> {
    let given: BTreeMap<String, serde_json::Value> = json_request(body, "trace settings")?;
    given
        .into_iter()
        .map(|(name, value)| {
            let values = match value {
                serde_json::Value::Null => None,
                serde_json::Value::String(one) => Some(vec![one]),
                serde_json::Value::Array(list) => Some(
                    list.into_iter()
                        .map(|v| match v {
                            serde_json::Value::String(s) => Ok(s),
                            _ => Err(AppError::bad_request(format!("trace setting `{name}` takes strings"))),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                _ => return Err(AppError::bad_request(format!("trace setting `{name}` takes a string or a list"))),
            };
            Ok((name, values))
        })
        .collect()
}

/// The server's trace settings.
#[utoipa::path(get, path = "/v2/trace/setting", tag = "kserve-v2", responses((status = 200, body = Object)),
    security(("api_key" = [])))]
async fn trace_settings(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(shown(state.traces().settings(None)))
}

/// Changes the server's trace settings (`null` resets one); answers them all.
#[utoipa::path(post, path = "/v2/trace/setting", tag = "kserve-v2", request_body(content = Object),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody)), security(("api_key" = [])))]
async fn update_trace_settings(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, AppError> {
    state.traces().update(None, changes(body)?)?;
    Ok(Json(shown(state.traces().settings(None))))
}

/// A model's trace settings: its own, and the server's where it has none.
#[utoipa::path(get, path = "/v2/models/{model}/trace/setting", tag = "kserve-v2",
    params(("model" = String, Path, description = "The model")),
    responses((status = 200, body = Object), (status = 404, body = ErrorBody)), security(("api_key" = [])))]
async fn model_trace_settings(
    State(state): State<AppState>,
    Path(model): Path<String>,
) -> Result<Json<serde_json::Value>, AppError> {
    resolve_named(state.registry(), &model, "")?;
    Ok(Json(shown(state.traces().settings(Some(&model)))))
}

/// Changes a model's trace settings (`null` makes one follow the server's again); answers them all.
#[utoipa::path(post, path = "/v2/models/{model}/trace/setting", tag = "kserve-v2",
    params(("model" = String, Path, description = "The model")), request_body(content = Object),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
async fn update_model_trace_settings(
    State(state): State<AppState>,
    Path(model): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, AppError> {
    resolve_named(state.registry(), &model, "")?;
    state.traces().update(Some(&model), changes(body)?)?;
    Ok(Json(shown(state.traces().settings(Some(&model)))))
}
