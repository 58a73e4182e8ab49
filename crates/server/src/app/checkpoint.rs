//! The checkpoint every routed request passes, as one layer: the model the route names, resolved once (see
//! [`crate::request`]); the API key (on protected routes); the overall timeout; the end of the drain; the
//! in-flight budget and the request metrics of inference routes. One layer rather than one per concern: each
//! layer costs every request a clone of the route it wraps.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};

use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::budget::Unread;
use crate::error::AppError;
use crate::metrics::Protocol;
use crate::request::{self, ModelFrom, ServedModel};
use crate::state::AppState;

/// The checkpoint of a group of routes.
#[derive(Clone)]
pub struct Checkpoint {
    pub state: AppState,
    pub guard: Guard,
}

/// What the checkpoint does for the routes it guards.
#[derive(Clone, Copy)]
pub struct Guard {
    /// The routes need an API key, when the server has any.
    pub protected: bool,
    /// Where the routes name their model, when they do: it is resolved here, once.
    pub model: Option<ModelFrom>,
    /// Set on inference routes: their bodies count against the in-flight budget, and their requests in the
    /// metrics under this protocol. Where `model` is `None` the body names the model, and the handler sets
    /// [`ServedModel`] on its response.
    pub protocol: Option<Protocol>,
    /// How the routes' clients expect an error the checkpoint answers itself.
    pub refuse: fn(AppError) -> Response,
    /// The routes decode a body as it arrives: one that declares no `Content-Length` (a compressed body, inflating
    /// as it is read) is handed on unread ([`crate::budget::Payload::Unread`]), so that their limits stop the reading
    /// where they are met, before the body is held whole.
    pub streams: bool,
}

impl Guard {
    /// Open routes that name no model.
    pub const OPEN: Guard = Guard { protected: false, model: None, protocol: None, refuse: plain, streams: false };
}

fn plain(e: AppError) -> Response {
    e.into_response()
}

/// The checkpoint as an axum middleware function.
pub async fn pass(State(checkpoint): State<Checkpoint>, request: Request, next: Next) -> Response {
    let Checkpoint { state, guard } = &checkpoint;
    let (mut parts, body) = request.into_parts();
    let label = match guard.model {
        Some(from) => request::resolve(state, from, &mut parts).await,
        None => None,
    };
    let metrics = state.metrics();
    let counted = guard.protocol.map(|protocol| (protocol, guard.model.is_some()));
    let in_flight = match counted {
        Some((protocol, true)) => Some(metrics.enter(label.as_deref().unwrap_or_default(), protocol)),
        _ => None,
    };
    let started = Instant::now();
    let response = match guard.protected.then(|| state.authorize(&parts.headers)) {
        Some(Err(refused)) => (guard.refuse)(refused),
        _ => {
            let served = async {
                if guard.protocol.is_none() {
                    return next.run(Request::from_parts(parts, body)).await;
                }
                // An inference request's body and tensors count against the in-flight budget until it is answered.
                let hold = state.budget().hold();
                if guard.streams && !parts.headers.contains_key(header::CONTENT_LENGTH) {
                    parts.extensions.insert(hold);
                    parts.extensions.insert(Unread);
                    return next.run(Request::from_parts(parts, body)).await;
                }
                match hold.collect(&parts.headers, body, state.max_body_bytes()).await {
                    Ok(bytes) => {
                        parts.extensions.insert(hold.clone());
                        next.run(Request::from_parts(parts, Body::from(bytes))).await
                    }
                    Err(refused) => (guard.refuse)(refused),
                }
            };
            state.bounded(served, guard.refuse).await
        }
    };
    drop(in_flight);
    if let Some((protocol, named_by_route)) = counted {
        // A handler that served another model than the route's (TEI's `/predict` with `inputs`) says which.
        let served = response.extensions().get::<ServedModel>().map(|m| m.0.clone());
        let label = served.or(if named_by_route { label } else { None });
        metrics.request_done(
            label.as_deref().unwrap_or_default(),
            protocol,
            response.status().as_u16(),
            started.elapsed(),
        );
    }
    response
}
