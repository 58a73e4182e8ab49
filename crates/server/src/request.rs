//! What the checkpoint learns of a request and hands to its handler in the request's extensions: the model the
//! route names, resolved once (which also gives the request's metrics label), and the request's share of the
//! in-flight budget. Extractors take them out again, so handlers never look a model up a second time.

use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;

use crate::budget::Hold;
use crate::codec::quoted;
use crate::error::AppError;
use inferd_models::{registration, Defaults, LoadedModel, Service};

use crate::registry::{quoted_list, ModelEntry, Registry};
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
    /// The route serves the default model of a service: `/embed`, `/embed_sparse`, `/rerank`, TEI's `/predict`.
    DefaultOf(Service),
    /// TEI's `/` and `/info`: the default text model (see [`Defaults::text`]).
    DefaultText,
    /// The [`MODEL_PARAM`] path parameter, with [`VERSION_PARAM`] when the route has one.
    Path,
}

/// The model a route names, resolved by the checkpoint, the version the route asked for, and whether the path
/// named it.
#[derive(Clone)]
struct Resolved(Result<Arc<ModelEntry>, AppError>, Option<u64>, bool);

/// Resolves the model a request names (see [`ModelFrom`]) and keeps the outcome for the handler; returns the
/// model's metrics label, `None` where the server has no such model.
pub async fn resolve(state: &AppState, from: ModelFrom, parts: &mut Parts) -> Option<Arc<str>> {
    let registry = state.registry();
    let (resolved, version, label) = match from {
        ModelFrom::Default => labelled(default_model(registry, state.defaults())),
        ModelFrom::DefaultOf(service) => labelled(default_of(registry, state.defaults(), service)),
        ModelFrom::DefaultText => labelled(default_text(registry, state.defaults())),
        ModelFrom::Path => from_path(state, parts).await,
    };
    parts.extensions.insert(Resolved(resolved, version, from == ModelFrom::Path));
    label
}

/// A route's model or why there is none, the version it asked for, and the model's metrics label.
type Resolution = (Result<Arc<ModelEntry>, AppError>, Option<u64>, Option<Arc<str>>);

/// A resolution with no version asked for, and its label.
fn labelled(resolved: Result<Arc<ModelEntry>, AppError>) -> Resolution {
    let label = resolved.as_ref().ok().map(|m| m.label());
    (resolved, None, label)
}

/// The default model (`/predict`): `--default-model` or the only model; or else, for TEI's `/predict`, the default
/// classifier; or the 400 that asks for a name.
fn default_model(registry: &Registry, defaults: &Defaults) -> Result<Arc<ModelEntry>, AppError> {
    match defaults.model.as_deref().or_else(|| defaults.of(Service::Classify)) {
        Some(name) => registry.resolve(name, None),
        None => {
            let names = quoted_list(&registry.names(|_| true));
            Err(AppError::bad_request(format!(
                "this server has several models ({names}): use /models/{{model}}/predict, or start it with \
                 --default-model"
            )))
        }
    }
}

/// The default model of `service`, or the 400 that says why there is none and what to do instead.
pub fn default_of(registry: &Registry, defaults: &Defaults, service: Service) -> Result<Arc<ModelEntry>, AppError> {
    if let Some(name) = defaults.of(service) {
        return registry.resolve(name, None);
    }
    let names = registry.names(|m| registration(&m.config).service == service);
    let flag = if service == Service::Embed { "--default-embed-model" } else { "--default-model" };
    Err(AppError::bad_request(match names.is_empty() {
        true => format!("this server has no model that {}", service.does()),
        false => format!(
            "this server has several models that {} ({}): name one in the route (/models/{{model}}/…), or start it \
             with {flag}",
            service.does(),
            quoted_list(&names)
        ),
    }))
}

/// TEI's default text model (`POST /`, `/info`), or the 400 that says why there is none: the same as `/embed`'s
/// where the server has several embedders and none is chosen.
pub fn default_text(registry: &Registry, defaults: &Defaults) -> Result<Arc<ModelEntry>, AppError> {
    if let Some(name) = &defaults.text {
        return registry.resolve(name, None);
    }
    let service = |m: &ModelEntry| registration(&m.config).service;
    if !registry.names(|m| service(m) == Service::Embed).is_empty() {
        return default_of(registry, defaults, Service::Embed);
    }
    let names = registry.names(|m| service(m).takes_text());
    Err(AppError::bad_request(match names.is_empty() {
        true => "this server has no text model".to_owned(),
        false => format!(
            "this server has several text models ({}): use /models/{{model}}, or start it with --default-model",
            quoted_list(&names)
        ),
    }))
}

/// The model and version the path names, and the model's label, even where the version is not one of its own.
async fn from_path(state: &AppState, parts: &mut Parts) -> Resolution {
    let params = match RawPathParams::from_request_parts(parts, state).await {
        Ok(params) => params,
        Err(e) => return (Err(AppError::bad_request(e.body_text())), None, None),
    };
    let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
    let name = param(MODEL_PARAM).unwrap_or_default();
    let registry = state.registry();
    let label_of_name = || registry.find(name).map(|m| m.label());
    let version = match param(VERSION_PARAM).map(|v| parse_version(name, v)).transpose() {
        Ok(version) => version,
        Err(e) => return (Err(e), None, label_of_name()),
    };
    let resolved = registry.resolve(name, version);
    let label = match &resolved {
        Ok(model) => Some(model.label()),
        Err(_) => label_of_name(),
    };
    (resolved, version, label)
}

/// A version as a request names it: a positive number.
fn parse_version(model: &str, version: &str) -> Result<u64, AppError> {
    version.parse::<u64>().ok().filter(|&v| v > 0).ok_or_else(|| {
        AppError::not_found(format!(
            "model `{}` has no version `{}`: versions are positive numbers",
            quoted(model),
            quoted(version)
        ))
    })
}

/// The model `name` at `version`, as a message body names them (gRPC's): an empty version is the one the model's
/// policy serves.
pub fn resolve_named(registry: &Registry, name: &str, version: &str) -> Result<Arc<ModelEntry>, AppError> {
    let version = (!version.is_empty()).then(|| parse_version(name, version)).transpose()?;
    registry.resolve(name, version)
}

/// The model version the route names, as the checkpoint resolved it; or why there is none.
#[derive(Clone)]
pub struct RoutedModel {
    entry: Arc<ModelEntry>,
    /// The version the route asked for, if it named one.
    version: Option<u64>,
    named: bool,
}

impl RoutedModel {
    /// The model version as the registry has it now: the one resolved, unless model control replaced it since
    /// (while the request's body arrived, say), when it is resolved again.
    pub fn current(&self, registry: &Registry) -> Result<Arc<ModelEntry>, AppError> {
        match self.entry.retired() {
            false => Ok(self.entry.clone()),
            true => registry.resolve(self.entry.name(), self.version),
        }
    }

    /// Whether the route named the model (`/models/{model}/…`), rather than serving a default.
    pub fn named(&self) -> bool {
        self.named
    }

    /// The loaded model version, or why it is not served.
    pub fn serving(&self, registry: &Registry) -> Result<Arc<LoadedModel>, AppError> {
        self.current(registry)?.serving()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RoutedModel {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Resolved>() {
            Some(Resolved(resolved, version, named)) => {
                resolved.clone().map(|entry| RoutedModel { entry, version: *version, named: *named })
            }
            None => Err(AppError::internal("the route names no model to its checkpoint; this is a bug")),
        }
    }
}

/// The request's share of the in-flight budget, which the checkpoint holds for every inference request.
#[derive(Clone)]
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
