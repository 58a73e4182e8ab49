//! The layers every request passes first, over HTTP and gRPC alike: its request id (screened, made where missing,
//! echoed), its span, and a panic answered in the front end's own words: [`around`] any service. The HTTP app wraps
//! its routes in them ([`outer_layers`]), the gRPC app its services.

use std::convert::Infallible;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware;
use axum::response::Response;
use axum::routing::Route;
use axum::Router;
use tower::{Layer, Service, ServiceBuilder};
use tower_http::request_id::{MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

/// The request id: taken from the request, or made, and echoed in the response. A `HeaderName`, checked once: a
/// name given as a `&str` is parsed again on every lookup.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The layers every request passes first, over HTTP and gRPC alike: its request id (screened, made where
/// missing, echoed), its span, and a panic answered with `panicked`'s response; then `inner`, the caller's own (the
/// body's limits and compression), and the routes. All of them wrap the routes as one layer: axum boxes a router's
/// services again for each `Router::layer`, and each box is a clone of the service and a boxed future on every
/// request (nine of them on a `/predict`).
pub fn outer_layers<S, L>(routes: Router<S>, inner: L, panicked: fn() -> Response) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    routes.layer(tower::layer::layer_fn(move |route: Route| around(route, inner.clone(), panicked)))
}

/// [`outer_layers`]' layers around any `service`, `inner` innermost: the gRPC service has no router to wrap (see
/// `grpc::Services`).
pub fn around<S, L>(
    service: S,
    inner: L,
    panicked: fn() -> Response,
) -> impl Service<Request, Response = Response, Error = Infallible, Future: Send + 'static> + Clone + Send + Sync + 'static
where
    L: Layer<S>,
    L::Service: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request>>::Future: Send + 'static,
{
    let request_id = REQUEST_ID_HEADER;
    ServiceBuilder::new()
        // The layers' own bodies (the span's, the panic's) as axum's, as a router's `layer` makes them.
        .map_response(axum::response::IntoResponse::into_response)
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(move |_| panicked()))
        .layer(middleware::map_request(screen_request_id))
        .layer(SetRequestIdLayer::new(request_id.clone(), RandomRequestId))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(request_id))
        .layer(inner)
        .service(service)
}

/// The longest request id a client may choose.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Whether a client's request id is kept: 1 to [`MAX_REQUEST_ID_LEN`] visible characters from a safe set, so that
/// what the logs and the echoed header carry is an id and nothing a client smuggled in.
fn acceptable_request_id(id: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&id.len())
        && id.iter().all(|&c| c.is_ascii_alphanumeric() || b"-_.:/+=@".contains(&c))
}

/// Drops a request id that is not acceptable (or sent more than once): a new one is made in its place.
async fn screen_request_id(mut request: axum::extract::Request) -> axum::extract::Request {
    let ids = request.headers().get_all(REQUEST_ID_HEADER);
    let mut iter = ids.iter();
    let keep = match (iter.next(), iter.next()) {
        (None, _) => true,
        (Some(id), None) => acceptable_request_id(id.as_bytes()),
        (Some(_), Some(_)) => false,
    };
    if !keep {
        request.headers_mut().remove(REQUEST_ID_HEADER);
    } else if let Some(id) = request.headers_mut().get_mut(REQUEST_ID_HEADER) {
        never_indexed(id);
    }
    request
}

/// Marks a request id, which is echoed in the response, as never to be indexed by HTTP/2's header compression: an
/// id is used once, so entering it in the connection's table (as an HTTP/2 server does with a value it may send
/// again) costs the server and its client an insertion and an eviction on every response, and pushes out the
/// entries that are sent again. HTTP/1 writes it as before.
fn never_indexed(id: &mut HeaderValue) {
    id.set_sensitive(true);
}

/// Request ids for requests that come without one: random (version 4) UUIDs from a per-thread generator seeded
/// once, rather than a `getrandom` system call per request.
#[derive(Clone, Copy)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let id = uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes()).into_uuid();
        let mut text = uuid::Uuid::encode_buffer();
        let mut id = HeaderValue::from_str(id.hyphenated().encode_lower(&mut text)).ok()?;
        never_indexed(&mut id);
        Some(RequestId::new(id))
    }
}

/// The span every request runs in; the batcher carries it to the worker thread that serves the request.
fn request_span<B>(request: &axum::http::Request<B>) -> tracing::Span {
    let id = request.headers().get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default();
    tracing::info_span!("request", id = %id, method = %request.method(), path = %request.uri().path())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    async fn echoed_id(sent: Option<&str>) -> HeaderValue {
        let routes = Router::new().route("/", get(|| async { "ok" }));
        let app = outer_layers(routes, tower::layer::util::Identity::new(), || {
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        });
        let mut request = Request::get("/");
        if let Some(id) = sent {
            request = request.header(REQUEST_ID_HEADER, id);
        }
        let response = app.oneshot(request.body(Body::empty()).expect("request")).await.expect("response");
        response.headers().get(REQUEST_ID_HEADER).cloned().expect("an echoed request id")
    }

    /// The echoed id, made or the client's, is one HTTP/2 never enters in its header table.
    #[tokio::test]
    async fn request_ids_are_never_indexed() {
        let made = echoed_id(None).await;
        assert_eq!(made.len(), 36, "{made:?}");
        assert!(made.is_sensitive());
        let kept = echoed_id(Some("client-7")).await;
        assert_eq!(kept, "client-7");
        assert!(kept.is_sensitive());
        let replaced = echoed_id(Some("bad id")).await;
        assert_ne!(replaced, "bad id");
        assert!(replaced.is_sensitive());
    }
}
