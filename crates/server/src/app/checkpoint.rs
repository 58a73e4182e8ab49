//! The checkpoint every routed request passes, as one layer: the API key (on protected routes), the overall
//! timeout, the end of the drain, and the request metrics of inference routes. One layer rather than one per
//! concern: each layer costs every request a clone of the route it wraps.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::{AppError, ErrorKind};
use crate::metrics::Protocol;
use crate::routes::openai::ServedModel;
use crate::state::AppState;

/// What the checkpoint knows of the routes it guards.
#[derive(Clone)]
pub struct Checkpoint {
    pub state: AppState,
    /// The routes need an API key, when the server has any.
    pub protected: bool,
    /// Set on inference routes: their requests are counted in the metrics.
    pub inference: Option<InferenceRoute>,
}

/// An inference route's protocol, and where it names its model.
#[derive(Clone, Copy)]
pub struct InferenceRoute {
    pub protocol: Protocol,
    pub model: ModelFrom,
}

/// Where an inference route names its model.
#[derive(Clone, Copy)]
pub enum ModelFrom {
    /// The route serves the default model.
    Default,
    /// The route serves the default text model.
    DefaultEmbed,
    /// This path parameter.
    Path(&'static str),
    /// The body: the handler sets [`ServedModel`] on its response. Such requests have no in-flight gauge.
    Body,
}

/// The checkpoint as an axum middleware function.
pub async fn pass(State(checkpoint): State<Checkpoint>, request: Request, next: Next) -> Response {
    let state = &checkpoint.state;
    let (labels, request) = match checkpoint.inference {
        None => (None, request),
        Some(route) => {
            let (mut parts, body) = request.into_parts();
            let model = model_label(state, route, &mut parts).await;
            (Some((model, route.protocol)), Request::from_parts(parts, body))
        }
    };
    let metrics = state.metrics();
    let body_named = matches!(checkpoint.inference, Some(InferenceRoute { model: ModelFrom::Body, .. }));
    let in_flight = labels
        .as_ref()
        .filter(|_| !body_named)
        .map(|(model, protocol)| Held::new(metrics.in_flight(model.as_deref().unwrap_or_default(), *protocol)));
    let started = Instant::now();
    let response = match checkpoint.protected.then(|| authorize(state, &request)) {
        Some(Err(refused)) => refused.into_response(),
        _ => {
            let timeout = state.request_timeout();
            let served = async {
                if checkpoint.inference.is_none() {
                    return next.run(request).await;
                }
                // An inference request's body and tensors count against the in-flight budget until it is answered.
                let hold = state.budget().hold();
                let (parts, body) = request.into_parts();
                match hold.collect(&parts.headers, body, state.max_body_bytes()).await {
                    Ok(bytes) => hold.scope(next.run(Request::from_parts(parts, Body::from(bytes)))).await,
                    Err(refused) => refused.into_response(),
                }
            };
            tokio::select! {
                response = served => response,
                () = tokio::time::sleep(timeout) => AppError::unavailable(format!(
                    "the request took longer than {} s (--request-timeout)", timeout.as_secs_f64()
                )).into_response(),
                () = state.drain().expired() => {
                    AppError::unavailable("the server shut down before the request finished (--drain-timeout)")
                        .into_response()
                }
            }
        }
    };
    drop(in_flight);
    if let Some((mut model, protocol)) = labels {
        if body_named {
            model = response.extensions().get::<ServedModel>().and_then(|m| state.find(&m.0)).map(|m| m.label());
        }
        let model = model.as_deref().unwrap_or_default();
        metrics.request_done(model, protocol, response.status().as_u16(), started.elapsed());
    }
    response
}

/// One request on an in-flight gauge, taken off when dropped: also when its client goes away and the request's
/// future is dropped part-way.
struct Held(metrics::Gauge);

impl Held {
    fn new(gauge: metrics::Gauge) -> Self {
        gauge.increment(1);
        Held(gauge)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.decrement(1);
    }
}

/// The `model` label of an inference request: the model's own name, shared. A model this server does not have
/// is `None`, labelled `""`, so that clients cannot mint series.
async fn model_label(
    state: &AppState,
    route: InferenceRoute,
    parts: &mut axum::http::request::Parts,
) -> Option<Arc<str>> {
    let name = match route.model {
        ModelFrom::Default => state.default_model(),
        ModelFrom::DefaultEmbed => state.default_embed_model(),
        ModelFrom::Body => None,
        ModelFrom::Path(param) => {
            let params = RawPathParams::from_request_parts(parts, state).await.ok()?;
            return params.iter().find(|(k, _)| *k == param).and_then(|(_, name)| state.find(name)).map(|m| m.label());
        }
    };
    name.and_then(|name| state.find(name)).map(|m| m.label())
}

/// Lets a request through when no key is configured or it carries one of the keys. Keys are compared in
/// constant time, every key every time.
fn authorize(state: &AppState, request: &Request) -> Result<(), AppError> {
    let keys = state.api_keys();
    if keys.is_empty() {
        return Ok(());
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim().as_bytes());
    let Some(given) = given else {
        return Err(AppError::new(
            ErrorKind::Unauthorized,
            "this route needs an API key: send `Authorization: Bearer <key>`",
        ));
    };
    let accepted = keys.iter().fold(subtle::Choice::from(0), |ok, key| ok | key.expose().as_bytes().ct_eq(given));
    if bool::from(accepted) {
        Ok(())
    } else {
        Err(AppError::new(ErrorKind::Unauthorized, "the API key is not valid"))
    }
}
