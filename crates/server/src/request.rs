//! What the checkpoint learns of a request and hands to its handler in the request's extensions: the model the
//! route names, resolved once (which also gives the request's metrics label), and the request's share of the
//! in-flight budget. Extractors take them out again, so handlers never look a model up a second time.

use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;

use crate::budget::Hold;
use crate::codec::quoted;
use crate::error::AppError;
use crate::registry::{quoted_list, ModelEntry};
use crate::state::AppState;

/// The path parameter that names the model on every route that has one.
pub const MODEL_PARAM: &str = "model";
/// The path parameter that names a model's version.
pub const VERSION_PARAM: &str = "version";

/// Where a route names its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFrom {
    /// The route serves the default model (`/predict`).
    Default,
    /// The route serves the default text model (`/embed`).
    DefaultEmbed,
    /// The [`MODEL_PARAM`] path parameter, with [`VERSION_PARAM`] when the route has one.
    Path,
}

/// The model a route names, resolved by the checkpoint.
#[derive(Clone)]
struct Resolved(Result<Arc<ModelEntry>, AppError>);

/// Resolves the model a request names (see [`ModelFrom`]) and keeps the outcome for the handler; returns the
/// model's metrics label, `None` where there is no such model.
pub async fn resolve(state: &AppState, from: ModelFrom, parts: &mut Parts) -> Option<Arc<str>> {
    let resolved = match from {
        ModelFrom::Default => default(state, state.defaults().model.as_deref(), || {
            format!(
                "this server has several models ({}): use /models/{{model}}/predict, or start it with --default-model",
                quoted_list(&state.registry().names(|_| true))
            )
        }),
        ModelFrom::DefaultEmbed => default(state, state.defaults().embed.as_deref(), || {
            let names = state.registry().names(|m| m.config.task == inferd_core::Task::Embed);
            if names.is_empty() {
                "this server has no text model: /embed serves a model whose task is `embed`".to_owned()
            } else {
                format!(
                    "this server has several text models ({}): use /models/{{model}}/embed, or start it with \
                     --default-embed-model",
                    quoted_list(&names)
                )
            }
        }),
        ModelFrom::Path => from_path(state, parts).await,
    };
    let label = resolved.as_ref().ok().map(|m| m.label());
    parts.extensions.insert(Resolved(resolved));
    label
}

fn default(state: &AppState, name: Option<&str>, none: impl FnOnce() -> String) -> Result<Arc<ModelEntry>, AppError> {
    match name {
        Some(name) => state.registry().resolve(name, None),
        None => Err(AppError::bad_request(none())),
    }
}

async fn from_path(state: &AppState, parts: &mut Parts) -> Result<Arc<ModelEntry>, AppError> {
    let params =
        RawPathParams::from_request_parts(parts, state).await.map_err(|e| AppError::bad_request(e.body_text()))?;
    let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
    let name = param(MODEL_PARAM).unwrap_or_default();
    let version = match param(VERSION_PARAM) {
        None => None,
        Some(v) => Some(v.parse::<u64>().ok().filter(|&v| v > 0).ok_or_else(|| {
            AppError::not_found(format!(
                "model `{}` has no version `{}`: versions are positive numbers",
                quoted(name),
                quoted(v)
            ))
        })?),
    };
    state.registry().resolve(name, version)
}

/// The model version the route names, as the checkpoint resolved it; or why there is none.
pub struct RoutedModel(pub Arc<ModelEntry>);

impl<S: Send + Sync> FromRequestParts<S> for RoutedModel {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Resolved>() {
            Some(Resolved(resolved)) => resolved.clone().map(RoutedModel),
            None => Err(AppError::internal("the route names no model to its checkpoint; this is a bug")),
        }
    }
}

/// The request's share of the in-flight budget, which the checkpoint holds for every inference request.
pub struct InflightHold(pub Arc<Hold>);

impl<S: Send + Sync> FromRequestParts<S> for InflightHold {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Arc<Hold>>()
            .cloned()
            .map(InflightHold)
            .ok_or_else(|| AppError::internal("an inference route runs without its budget hold; this is a bug"))
    }
}

/// Set by a handler whose model the body named (OpenAI's): its metrics label.
#[derive(Clone, Debug)]
pub struct ServedModel(pub Arc<str>);
