//! The listener: accepts connections up to `--max-connections`, serves HTTP/1.1 on each with hyper, times out
//! the ones that send a request head too slowly or sit idle too long, and takes part in the drain.
//!
//! Past `--max-connections`, up to [`OVERFLOW_CONNECTIONS`] more are still accepted, but answer only the probes
//! (`/health*`, `/v2/health/*`); anything else there gets a quick 503 with `Retry-After`, so that an orchestrator
//! still sees the server alive while it sheds load. Past those, a connection is closed as soon as it is accepted.
//!
//! From the start of a drain every response says `Connection: close`, so clients open a new connection for
//! their next request instead of sending it on one the server is about to close. When the drain stops taking
//! connections, those already waiting in the kernel's backlog are still accepted (closing the listener would
//! reset them), and the idle connections left are closed only once no request has run or started for
//! [`QUIET`]: a client that has just had an answer has sent its next request by then.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::{Json, Router};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::config::ServeConfig;
use crate::drain::Drain;
use crate::error::ErrorBody;
use crate::repoll::Repolled;
use crate::socket::{accept_any, Listener, Stream};

/// Connections past `--max-connections` that still answer the probes.
pub const OVERFLOW_CONNECTIONS: usize = 64;
/// How long an overflow connection has to send its request head.
const OVERFLOW_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the server must have been quiet before a drain closes the idle connections left.
pub const QUIET: Duration = Duration::from_millis(250);
/// How often each connection's timeouts are looked at: they fire within this much of their time.
const TICK: Duration = Duration::from_millis(200);

/// The connection settings (`--max-connections`, `--header-read-timeout`, `--idle-timeout`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionSettings {
    pub max_connections: usize,
    /// From a connection's acceptance, or the first byte of a later request, to the end of that request's head.
    pub header_read_timeout: Duration,
    /// Between the end of one answer and the first byte of the next request on a kept-alive connection.
    pub idle_timeout: Duration,
}

impl ConnectionSettings {
    /// The settings of `config`, `max_connections` capped to what `open_files` (the process's limit) leaves room
    /// for besides the overflow connections and the files the models and libraries hold, shared by `listeners`
    /// (HTTP's, and gRPC's when served: each takes up to `max_connections`).
    pub fn new(config: &ServeConfig, open_files: Option<u64>, listeners: usize) -> ConnectionSettings {
        const RESERVED: u64 = 256;
        let room = open_files.map_or(usize::MAX, |n| {
            usize::try_from(n.saturating_sub(RESERVED + OVERFLOW_CONNECTIONS as u64)).unwrap_or(usize::MAX)
                / listeners.max(1)
        });
        let max_connections = config.max_connections.min(room).max(1);
        if max_connections < config.max_connections {
            tracing::warn!(
                asked = config.max_connections,
                open_files,
                max_connections,
                "--max-connections is more than the open-files limit leaves room for: lowered"
            );
        }
        ConnectionSettings {
            max_connections,
            header_read_timeout: config.header_read_timeout(),
            idle_timeout: config.idle_timeout(),
        }
    }
}

/// Requests being served across every connection, and when the last one started: what the drain waits on.
#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    /// Milliseconds since `epoch` when the last request started.
    last_start_ms: AtomicU64,
}

/// What one connection is doing, for its timeouts: its IO notes the first byte of a request head, its service the
/// start and end of each request.
struct Clock {
    epoch: Instant,
    phase: AtomicU8,
    /// Milliseconds since `epoch` when the phase began.
    since_ms: AtomicU64,
}

const WAITING: u8 = 0;
const READING_HEAD: u8 = 1;
const BUSY: u8 = 2;

impl Clock {
    fn new() -> Clock {
        // A new connection is waiting for its first request head, which the header timeout bounds.
        Clock { epoch: Instant::now(), phase: AtomicU8::new(READING_HEAD), since_ms: AtomicU64::new(0) }
    }

    fn set(&self, phase: u8) {
        self.since_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.phase.store(phase, Ordering::Relaxed);
    }

    /// Bytes arrived: between requests, they begin a request head.
    fn read(&self) {
        if self.phase.load(Ordering::Relaxed) == WAITING {
            self.set(READING_HEAD);
        }
    }

    /// Bytes left: an answer still being written to a slow reader is not idle.
    fn wrote(&self) {
        if self.phase.load(Ordering::Relaxed) == WAITING {
            self.set(WAITING);
        }
    }

    /// Whether the connection has outlived its phase's timeout.
    fn expired(&self, header_read_timeout: Duration, idle_timeout: Duration) -> Option<&'static str> {
        let elapsed = self.epoch.elapsed().saturating_sub(Duration::from_millis(self.since_ms.load(Ordering::Relaxed)));
        match self.phase.load(Ordering::Relaxed) {
            READING_HEAD if elapsed > header_read_timeout => Some("the request head was not read in time"),
            WAITING if elapsed > idle_timeout => Some("idle"),
            _ => None,
        }
    }
}

/// A connection's socket, which tells its clock when bytes arrive.
struct Watched {
    stream: Stream,
    clock: Arc<Clock>,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.read();
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.clock.wrote();
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.clock.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A request being served, from its start until its answer is handed to hyper or it is dropped (its client gone,
/// its connection closed): the drain's count of requests in flight must come down on every path.
struct InFlight {
    activity: Arc<Activity>,
    clock: Arc<Clock>,
}

impl InFlight {
    fn start(activity: Arc<Activity>, clock: Arc<Clock>, epoch: Instant) -> Self {
        clock.set(BUSY);
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        activity.last_start_ms.store(epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
        InFlight { activity, clock }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.clock.set(WAITING);
    }
}

/// Whether `path` is a probe, which an overflow connection still answers.
fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/health/live" | "/health/ready" | "/v2/health/live" | "/v2/health/ready")
}

/// Serves `app` on `listeners` (a TCP port, a Unix socket: one limit of connections for all) until `closing`
/// resolves; then takes what waits in the backlog, takes no more connections, waits for the server to go quiet,
/// and closes the idle connections left; returns once every connection has closed. Runs until then: the drain
/// bounds it from outside.
pub async fn serve(
    listeners: Vec<Listener>,
    app: Router,
    settings: ConnectionSettings,
    drain: Arc<Drain>,
    closing: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let server = Server {
        app,
        settings,
        drain,
        slots: Arc::new(Semaphore::new(settings.max_connections)),
        overflow: Arc::new(Semaphore::new(OVERFLOW_CONNECTIONS)),
        activity: Arc::new(Activity::default()),
        epoch: Instant::now(),
        graceful: GracefulShutdown::new(),
    };
    accept_until(listeners, closing, |stream| server.take(stream)).await;
    server.wait_quiet().await;
    // Closes each connection now if idle, after its answer if busy, and waits until every one has closed.
    server.graceful.shutdown().await;
    Ok(())
}

/// Hands each connection `listeners` accept to `take` until `closing` resolves; then those the kernel completed
/// but nobody accepted yet (closing a listener would reset them); then closes the listeners. HTTP's and gRPC's
/// alike.
pub async fn accept_until(listeners: Vec<Listener>, closing: impl Future<Output = ()>, mut take: impl FnMut(Stream)) {
    // A new connection ends an idle thread's poll, as a request does (see `idle`).
    listeners.iter().for_each(crate::idle::watch);
    let mut closing = pin!(closing);
    loop {
        tokio::select! {
            accepted = accept_any(&listeners) => match accepted {
                Ok(stream) => take(stream),
                // Out of file descriptors, say: the connections already open keep being served.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            () = &mut closing => break,
        }
    }
    while let Ok(Ok(stream)) = tokio::time::timeout(Duration::ZERO, accept_any(&listeners)).await {
        take(stream);
    }
}

struct Server {
    app: Router,
    settings: ConnectionSettings,
    drain: Arc<Drain>,
    /// One permit per connection served in full.
    slots: Arc<Semaphore>,
    /// One permit per connection that answers only the probes.
    overflow: Arc<Semaphore>,
    activity: Arc<Activity>,
    epoch: Instant,
    /// Every connection being served, for the drain to close them once quiet and wait for them.
    graceful: GracefulShutdown,
}

impl Server {
    /// Serves an accepted connection in full, or the probes only, or closes it: whatever the limits allow.
    fn take(&self, stream: Stream) {
        stream.set_nodelay();
        let (permit, full) = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => (permit, true),
            Err(_) => match self.overflow.clone().try_acquire_owned() {
                Ok(permit) => (permit, false),
                Err(_) => return drop(stream),
            },
        };
        // A new connection is activity too: one taken from the backlog as the drain begins may hold a request
        // hyper has not read yet, and closing it as idle would lose it.
        self.activity.last_start_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
        let clock = Arc::new(Clock::new());
        let service = {
            let (app, drain, activity, clock, epoch) =
                (self.app.clone(), self.drain.clone(), self.activity.clone(), clock.clone(), self.epoch);
            let max = self.settings.max_connections;
            hyper::service::service_fn(move |request: Request<Incoming>| {
                let (app, drain, activity, clock) = (app.clone(), drain.clone(), activity.clone(), clock.clone());
                async move {
                    let _in_flight = InFlight::start(activity, clock, epoch);
                    let mut response = if full || is_probe(request.uri().path()) {
                        app.oneshot(request.map(Body::new)).await.unwrap_or_else(|e| match e {})
                    } else {
                        over_capacity(max)
                    };
                    if !full || drain.is_draining() {
                        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, Infallible>(response)
                }
            })
        };
        let header_read_timeout = if full { self.settings.header_read_timeout } else { OVERFLOW_HEADER_TIMEOUT };
        let idle_timeout = self.settings.idle_timeout;
        let io = TokioIo::new(Watched { stream, clock: clock.clone() });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.keep_alive(full);
        // Repolled: reading a request's body wakes the connection's own task (see `repoll`).
        let connection = Repolled::new(self.graceful.watch(builder.serve_connection(io, service)));
        tokio::spawn(async move {
            let _permit = permit;
            let mut connection = pin!(connection);
            // hyper's own header timer would also run while a kept-alive connection is idle, so the idle and
            // header-read timeouts could not differ: the connection's clock keeps both.
            let mut ticks = tokio::time::interval(TICK);
            loop {
                tokio::select! {
                    _ = connection.as_mut() => break,
                    _ = ticks.tick() => {
                        // Nothing of a request is lost: none had begun, or its head never arrived.
                        if let Some(why) = clock.expired(header_read_timeout, idle_timeout) {
                            tracing::debug!(reason = why, "closing a connection");
                            break;
                        }
                    }
                }
            }
        });
    }

    /// Waits until no request is in flight and none has started for [`QUIET`].
    async fn wait_quiet(&self) {
        loop {
            let since_start = self
                .epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(self.activity.last_start_ms.load(Ordering::SeqCst)));
            if self.activity.in_flight.load(Ordering::SeqCst) == 0 && since_start >= QUIET {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The answer of an overflow connection to anything but a probe. Not logged: under a flood there would be one
/// line per shed request.
fn over_capacity(max: usize) -> Response<Body> {
    let body = ErrorBody { error: format!("the server has --max-connections ({max}) open: retry shortly") };
    (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, HeaderValue::from_static("1"))], Json(body))
        .into_response()
}

/// Raises this process's soft limit on open files to its hard limit, so that `--max-connections` and the
/// overflow fit; returns the limit in force (`None`: unlimited).
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return limit.current;
    }
    match setrlimit(Resource::Nofile, Rlimit { current: limit.maximum, maximum: limit.maximum }) {
        Ok(()) => limit.maximum,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
            limit.current
        }
    }
}
