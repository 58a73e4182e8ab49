//! KServe v2 over gRPC, as Triton serves it (`inference.GRPCInferenceService`, [`service`]), and the standard
//! `grpc.health.v1.Health` service for Kubernetes' gRPC probes: one more protocol on the same inference path, in
//! the same process and runtime as HTTP, on its own port (`--grpc-port`).
//!
//! Every RPC passes a gate first, as every HTTP route passes its checkpoint: the API key (the same
//! `authorization: Bearer` as HTTP, in the metadata; the probes are open), the `grpc-timeout` deadline, and the
//! request-id and span layers the HTTP app has. A message over `--max-body-bytes` is refused from its length
//! prefix, before it is read. Connections are HTTP/2 only; on the drain each gets a GOAWAY, and the requests and
//! streams open on it finish.

mod codec;
mod extensions;
mod health;
mod messages;
mod service;
mod unary;

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tonic::Status;
use tower::ServiceExt;

use crate::budget::Hold;
use crate::connections::{accept_until, ConnectionSettings};
use crate::drain::Drain;
use crate::error::AppError;
use crate::repoll::{Repolled, StreamsInline};
use crate::socket::{Listener, Stream};
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

/// A request's deadline, from its `grpc-timeout`.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Instant);

/// The deadline the gate read for a request, if it had one.
fn deadline_of<T>(request: &tonic::Request<T>) -> Option<Deadline> {
    request.extensions().get::<Deadline>().copied()
}

/// The gRPC app: both services behind the gate, within the HTTP app's request-id and span layers.
pub fn app(state: AppState) -> impl GrpcApp {
    let max_message = state.max_body_bytes();
    let inference = GrpcInferenceServiceServer::new(Inference { state: state.clone() })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(usize::MAX);
    let services = Services { inference, health: health::service(state.clone()), state: state.clone() };
    let panicked = || Status::internal("the request handler panicked").into_http();
    crate::layers::around(services, axum::middleware::from_fn_with_state(state, gate), panicked)
}

/// What [`app`] makes and [`serve`] serves: a request's answer, cloned for each request.
pub trait GrpcApp:
    tower::Service<Request, Response = Response, Error = Infallible, Future: Send + 'static> + Clone + Send + Sync + 'static
{
}

impl<S> GrpcApp for S where
    S: tower::Service<Request, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// Both services, each RPC sent to the one its path names (`/{service}/{method}`) as tonic's `Routes` sends it, but
/// without a router: `Routes` matched every call's path against a pattern per service and kept the method as a path
/// parameter, and a router's layers box the service again and clone it for each call. Any other path is
/// UNIMPLEMENTED, as there. `ModelInfer` is read and answered in [`unary`], past tonic's generic unary call.
#[derive(Clone)]
struct Services {
    inference: GrpcInferenceServiceServer<Inference>,
    health: health::Server,
    state: AppState,
}

/// The answer of either service, as both give it, and its future.
type Answer = Result<axum::http::Response<tonic::body::Body>, Infallible>;
type Answering = std::pin::Pin<Box<dyn std::future::Future<Output = Answer> + Send>>;

impl tower::Service<Request> for Services {
    type Response = Response;
    type Error = Infallible;
    type Future = futures_util::future::Either<
        futures_util::future::Map<Answering, fn(Answer) -> Result<Response, Infallible>>,
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, Infallible>> + Send>>,
    >;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        // Both are always ready (a tonic-generated server's `poll_ready` is), so a call goes straight to either.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        use futures_util::FutureExt;
        use tonic::server::NamedService;

        fn named<S: NamedService>(path: &str) -> bool {
            path.strip_prefix('/').and_then(|p| p.strip_prefix(S::NAME)).is_some_and(|p| p.starts_with('/'))
        }
        let path = request.uri().path();
        if path == UNARY_INFER && unary::read_here(request.headers()) {
            return futures_util::future::Either::Right(Box::pin(unary::model_infer(self.state.clone(), request)));
        }
        let inference = named::<GrpcInferenceServiceServer<Inference>>(path);
        let health = !inference && named::<health::Server>(path);
        let request = request.map(tonic::body::Body::new);
        let answer: Answering = if inference {
            tower::Service::call(&mut self.inference, request)
        } else if health {
            tower::Service::call(&mut self.health, request)
        } else {
            Box::pin(std::future::ready(Ok(Status::unimplemented("").into_http())))
        };
        futures_util::future::Either::Left(answer.map(|answer| answer.map(|response| response.map(Body::new))))
    }
}

/// A call's status, in its answer's trailers (or its headers, for a refusal made before any answer): a
/// `HeaderName`, checked once, where tonic parses the name from a string on every lookup.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// The paths of the RPCs the gate treats apart.
const UNARY_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
const STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";

/// The RPCs open to all: the probes.
fn is_probe(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
        || matches!(path, "/inference.GRPCInferenceService/ServerLive" | "/inference.GRPCInferenceService/ServerReady")
}

/// The gate every RPC passes: the API key, then the deadline; and a message tonic refused for its size is
/// answered with the one error table's status.
async fn gate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    if !is_probe(request.uri().path()) {
        if let Err(refused) = state.authorize(request.headers()) {
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
    // Unary RPCs end with the request timeout and the drain, as HTTP routes do; streams bound their own requests.
    let streaming = matches!(request.uri().path(), STREAM_INFER | HEALTH_WATCH);
    // A unary inference message's bytes count against the in-flight budget as they arrive, before tonic has read
    // it whole, as HTTP bodies do; the RPC holds them until it is answered.
    let mut refused = None;
    if request.uri().path() == UNARY_INFER {
        let hold = state.budget().hold();
        request.extensions_mut().insert(hold.clone());
        let refusal = refused.insert(Arc::new(OnceLock::new())).clone();
        request = request.map(|body| Body::new(Budgeted { body, hold, refused: refusal }));
    }
    let response = if streaming {
        next.run(request).await
    } else {
        state.bounded(next.run(request), |e| Status::from(e).into_http()).await
    };
    if let Some(refusal) = refused.as_ref().and_then(|r| r.get()) {
        return Status::from(refusal.clone()).into_http();
    }
    // A unary message past the limit is refused OUT_OF_RANGE (by `unary`, or by tonic) from its length prefix,
    // before it is read.
    // An answer's status is in its trailers: only a refusal has one in its headers. Looked up by a `HeaderName`
    // first, since tonic's lookup parses the name from a string on every call.
    if !response.headers().contains_key(GRPC_STATUS) {
        return response;
    }
    match Status::from_header_map(response.headers()) {
        Some(status) if status.code() == tonic::Code::OutOfRange => {
            stream_error(status, state.max_body_bytes()).into_http()
        }
        _ => response,
    }
}

/// A request body whose bytes are held against the in-flight budget as they arrive; past the budget it fails, and
/// says why in `refused`.
struct Budgeted {
    body: Body,
    hold: Arc<Hold>,
    refused: Arc<OnceLock<AppError>>,
}

impl hyper::body::Body for Budgeted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.body).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                if let Err(refusal) = this.hold.take(data.len()) {
                    let _ = this.refused.set(refusal.clone());
                    return std::task::Poll::Ready(Some(Err(axum::Error::new(refusal))));
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
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
    const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
    let Some(value) = headers.get(GRPC_TIMEOUT) else { return Ok(None) };
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

/// Serves `app` over HTTP/2 on `listener` until the drain's closing phase; then takes what waits in the backlog and
/// no more connections, sends each a GOAWAY, and returns once the requests and streams open on them have finished.
/// A connection that sends nothing within `--header-read-timeout` of its acceptance is closed; past
/// `--max-connections` of its own, one is closed at once. Dropping the future (the drain's end) drops every
/// connection.
pub async fn serve(
    listeners: Vec<Listener>,
    app: impl GrpcApp,
    settings: ConnectionSettings,
    drain: Arc<Drain>,
) -> std::io::Result<()> {
    let mut server = Connections {
        app,
        graceful: GracefulShutdown::new(),
        slots: Arc::new(Semaphore::new(settings.max_connections)),
        tasks: JoinSet::new(),
        first_bytes: settings.header_read_timeout,
    };
    accept_until(listeners, drain.closing(), |stream| server.take(stream)).await;
    server.graceful.shutdown().await;
    Ok(())
}

/// The gRPC listener's connections.
struct Connections<A> {
    app: A,
    graceful: GracefulShutdown,
    /// One permit per connection.
    slots: Arc<Semaphore>,
    /// Every connection's task: aborted with this listener.
    tasks: JoinSet<()>,
    /// How long a new connection has to send its first bytes.
    first_bytes: Duration,
}

impl<A: GrpcApp> Connections<A> {
    fn take(&mut self, stream: Stream) {
        while self.tasks.try_join_next().is_some() {}
        // Past --max-connections the connection is closed at once: the client retries elsewhere.
        let Ok(permit) = self.slots.clone().try_acquire_owned() else { return };
        stream.set_nodelay();
        let app = self.app.clone();
        let service = hyper::service::service_fn(move |request: axum::http::Request<Incoming>| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(app.oneshot(request.map(Body::new)).await.unwrap_or_else(|e| match e {})) }
        });
        // A stream is run where hyper hands it over, in the connection's task, and spawned only if that does not
        // finish it (see `repoll`).
        let mut builder = hyper::server::conn::http2::Builder::new(StreamsInline);
        // Dead peers are found by pings rather than kept forever. No `date` header: gRPC's clients read none (nor
        // do gRPC's own servers send one), and each answer's would be read from the clock and compressed into h2's
        // header table for nothing.
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(Duration::from_secs(60))
            .auto_date_header(false);
        let first_bytes = self.first_bytes;
        let watcher = self.graceful.watcher();
        self.tasks.spawn(async move {
            let _permit = permit;
            // A connection that never speaks would hold its slot, and the drain, forever.
            if !matches!(tokio::time::timeout(first_bytes, stream.spoke()).await, Ok(Ok(true))) {
                tracing::debug!("closing a gRPC connection that sent nothing");
                return;
            }
            // Repolled: a stream answered inside the connection's poll wakes the connection, to send its answer.
            let connection = Repolled::new(watcher.watch(builder.serve_connection(TokioIo::new(stream), service)));
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a gRPC connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests;
