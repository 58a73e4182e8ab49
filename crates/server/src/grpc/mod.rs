//! KServe v2 over gRPC, as Triton serves it (`inference.GRPCInferenceService`, [`service`]), and the standard
//! `grpc.health.v1.Health` service for Kubernetes' gRPC probes: one more protocol on the same inference path, in
//! the same process and runtime as HTTP, on its own port (`--grpc-port`).
//!
//! Every RPC passes a gate first, as every HTTP route passes its checkpoint: the API key (the same
//! `authorization: Bearer` as HTTP, in the metadata; the probes are open), the `grpc-timeout` deadline, and the
//! request-id and span layers the HTTP app has. A message over `--max-body-bytes` is refused from its length
//! prefix, before it is read. Connections are HTTP/2 only; on the drain each gets a GOAWAY, and the requests and
//! streams open on it finish.

mod service;

use std::convert::Infallible;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::Status;
use tonic_health::ServingStatus;
use tower::ServiceExt;

use crate::app::authorize;
use crate::drain::Drain;
use crate::state::AppState;

pub use service::{Inference, STREAM_IN_FLIGHT};

/// The service's generated server, over inferd-codec's message types.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

use proto::grpc_inference_service_server::GrpcInferenceServiceServer;

/// The gRPC service's full name: the health service reports it, and its RPCs' paths begin with it.
pub const SERVICE: &str = "inference.GRPCInferenceService";

/// The protocol extensions the gRPC service serves, as its server metadata lists them. perf_analyzer reads
/// `statistics` and then calls `ModelStatistics` around each measurement.
pub const EXTENSIONS: [&str; 3] = ["model_repository", "model_configuration", "statistics"];

/// How often the health service's status is brought up to date with the server's readiness (at once on each
/// drain phase).
const HEALTH_REFRESH: Duration = Duration::from_millis(100);

/// A request's deadline, from its `grpc-timeout`.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Instant);

/// The deadline the gate read for a request, if it had one.
fn deadline_of<T>(request: &tonic::Request<T>) -> Option<Deadline> {
    request.extensions().get::<Deadline>().copied()
}

/// The gRPC app: both services behind the gate, within the HTTP app's request-id and span layers.
pub fn app(state: AppState) -> (Router, tonic_health::server::HealthReporter) {
    let max_message = state.max_body_bytes();
    let (reporter, health) = tonic_health::server::health_reporter();
    let inference = GrpcInferenceServiceServer::new(Inference { state: state.clone() })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(usize::MAX);
    let router = tonic::service::Routes::new(inference)
        .add_service(health)
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(state, gate));
    let panicked = || Status::internal("the request handler panicked").into_http();
    (crate::app::outer_layers(router, panicked), reporter)
}

/// The RPCs open to all: the probes.
fn is_probe(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
        || path
            .strip_prefix("/inference.GRPCInferenceService/")
            .is_some_and(|m| m == "ServerLive" || m == "ServerReady")
}

/// The gate every RPC passes: the API key, then the deadline; and a message tonic refused for its size is
/// answered with the one error table's status.
async fn gate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    if !is_probe(request.uri().path()) {
        if let Err(refused) = authorize(&state, request.headers()) {
            return Status::from(refused).into_http();
        }
    }
    match grpc_timeout(request.headers()) {
        Ok(Some(after)) => {
            if let Some(at) = Instant::now().checked_add(after) {
                request.extensions_mut().insert(Deadline(at));
            }
        }
        Ok(None) => {}
        Err(e) => return Status::invalid_argument(e).into_http(),
    }
    let response = next.run(request).await;
    // A unary message past the limit is refused by tonic (OUT_OF_RANGE) from its length prefix, before it is read.
    match Status::from_header_map(response.headers()) {
        Some(status) if status.code() == tonic::Code::OutOfRange => {
            stream_error(status, state.max_body_bytes()).into_http()
        }
        _ => response,
    }
}

/// The status that ends a stream whose next message could not be read: one over the size limit is
/// RESOURCE_EXHAUSTED, as the one error table says of a body too large.
fn stream_error(status: Status, max_body_bytes: usize) -> Status {
    if status.code() == tonic::Code::OutOfRange {
        return Status::resource_exhausted(format!(
            "the message is larger than this server takes: {max_body_bytes} bytes (--max-body-bytes); {}",
            status.message()
        ));
    }
    status
}

/// The `grpc-timeout` header: up to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn grpc_timeout(headers: &HeaderMap) -> Result<Option<Duration>, String> {
    let Some(value) = headers.get("grpc-timeout") else { return Ok(None) };
    let bad =
        || format!("grpc-timeout `{}` is not 1 to 8 digits and a unit", String::from_utf8_lossy(value.as_bytes()));
    let text = value.to_str().map_err(|_| bad())?;
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let after = match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    };
    Ok(Some(after))
}

/// Keeps the health service's status in step with the server's readiness: `SERVING` (for the server, `""`, and
/// for [`SERVICE`]) while ready, `NOT_SERVING` while starting, degraded past what readiness allows, or draining.
pub async fn report_health(state: AppState, reporter: tonic_health::server::HealthReporter) {
    let mut phase = state.drain().watch();
    loop {
        let status = if state.readiness().is_none() { ServingStatus::Serving } else { ServingStatus::NotServing };
        reporter.set_service_status("", status).await;
        reporter.set_service_status(SERVICE, status).await;
        tokio::select! {
            changed = phase.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(HEALTH_REFRESH) => {}
        }
    }
}

/// Serves `app` over HTTP/2 on `listener` until the drain's closing phase; then takes no more connections, sends
/// each a GOAWAY, and returns once the requests and streams open on them have finished.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    max_connections: usize,
    drain: Arc<Drain>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut closing = pin!(drain.closing());
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Past --max-connections the connection is closed at once: the client retries elsewhere.
                    let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
                    let _ = stream.set_nodelay(true);
                    let app = app.clone();
                    let service = hyper::service::service_fn(move |request: axum::http::Request<Incoming>| {
                        let app = app.clone();
                        async move { Ok::<_, Infallible>(app.oneshot(request.map(Body::new)).await.unwrap_or_else(|e| match e {})) }
                    });
                    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    // Dead peers are found by pings rather than kept forever.
                    builder.timer(hyper_util::rt::TokioTimer::new()).keep_alive_interval(Duration::from_secs(60));
                    let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                    tokio::spawn(async move {
                        let _permit = permit;
                        if let Err(e) = connection.await {
                            tracing::debug!(error = %e, "a gRPC connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a gRPC connection failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            () = &mut closing => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests;
