//! The app: every protocol's routes assembled behind their checkpoint, the OpenAPI document and Swagger UI, and
//! the layers around it all (request ids and spans, compression, body limits, panics). The only module that
//! knows every route module.

mod checkpoint;
mod openapi;

use axum::extract::DefaultBodyLimit;
use axum::http::HeaderValue;
use axum::middleware;
use axum::response::IntoResponse;
use axum::Router;
use inferd_models::Service;
use tower::ServiceBuilder;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use self::checkpoint::{Checkpoint, Guard};
use crate::error::{AppError, ErrorKind};
use crate::layers::{outer_layers, REQUEST_ID_HEADER};
use crate::metrics::Protocol;
use crate::request::ModelFrom;
use crate::routes::{cohere, dispatch, health, openai, settings, shm, tei, v2};
use crate::state::AppState;

/// Every documented route, and the OpenAPI document built from the same registrations.
pub fn api(state: &AppState) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let guarded = |routes: OpenApiRouter<AppState>, guard: Guard| {
        let checkpoint = Checkpoint { state: state.clone(), guard };
        routes.route_layer(middleware::from_fn_with_state(checkpoint, checkpoint::pass))
    };
    let open = Guard::OPEN;
    let keyed = Guard { protected: true, ..Guard::OPEN };
    let model = |from| Guard { model: Some(from), ..keyed };
    let infer = |protocol, from| Guard { protocol: Some(protocol), ..model(from) };
    let metrics = Guard { protected: state.protect_metrics(), ..open };
    let default_predict = infer(Protocol::Predict, ModelFrom::Default);
    let (routes, api) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(guarded(health::probe_routes().merge(v2::probe_routes()), open))
        .merge(guarded(health::metrics_routes(), metrics))
        .merge(guarded(v2::routes().merge(openai::routes()).merge(shm::routes()).merge(settings::routes()), keyed))
        .merge(guarded(v2::model_routes(), model(ModelFrom::Path)))
        .merge(guarded(dispatch::default_route(), Guard { streams: true, ..default_predict }))
        .merge(guarded(dispatch::invocations_route().merge(dispatch::vertex_routes()), default_predict))
        .merge(guarded(dispatch::named_route(), Guard { streams: true, ..infer(Protocol::Predict, ModelFrom::Path) }))
        .merge(guarded(v2::inference_routes(), infer(Protocol::V2, ModelFrom::Path)))
        .merge(tei_routes(&guarded, keyed))
        .merge(guarded(cohere::routes(), Guard { protocol: Some(Protocol::Cohere), refuse: cohere::failure, ..keyed }))
        .merge(guarded(
            openai::inference_routes(),
            Guard { protocol: Some(Protocol::OpenAi), refuse: openai::failure, ..keyed },
        ))
        .split_for_parts();
    let routes = routes.merge(vertex_aliases(state, &api, default_predict));
    (routes, api)
}

/// TEI's routes, each serving its task's default model and, under `/models/{model}/…`, the named one.
fn tei_routes(
    guarded: &impl Fn(OpenApiRouter<AppState>, Guard) -> OpenApiRouter<AppState>,
    keyed: Guard,
) -> OpenApiRouter<AppState> {
    let tei = |from| Guard { model: Some(from), refuse: tei::failure, ..keyed };
    let infer = |from| Guard { protocol: Some(Protocol::Tei), ..tei(from) };
    let default = ModelFrom::DefaultOf;
    OpenApiRouter::new()
        .merge(guarded(tei::default_route(), infer(default(Service::Embed))))
        .merge(guarded(tei::similarity_default_routes(), infer(default(Service::Embed))))
        .merge(guarded(tei::sparse_default_routes(), infer(default(Service::EmbedSparse))))
        .merge(guarded(tei::score::default_routes(), infer(default(Service::Rerank))))
        .merge(guarded(tei::info::root_default_routes(), infer(ModelFrom::DefaultText)))
        .merge(guarded(tei::info::info_default_routes(), tei(ModelFrom::DefaultText)))
        .merge(guarded(tei::tokens::default_routes(), tei(ModelFrom::DefaultText)))
        .merge(guarded(
            tei::named_route()
                .merge(tei::similarity_named_routes())
                .merge(tei::sparse_named_routes())
                .merge(tei::score::named_routes())
                .merge(tei::info::root_named_routes()),
            infer(ModelFrom::Path),
        ))
        .merge(guarded(tei::info::info_named_routes().merge(tei::tokens::named_routes()), tei(ModelFrom::Path)))
}

/// Vertex AI's routes where its environment names them: its prediction route served as `/vertex` (behind the same
/// checkpoint, `guard`), its health route as readiness. A path the API already serves (`/health`, say) stays as it is.
fn vertex_aliases(state: &AppState, api: &utoipa::openapi::OpenApi, guard: Guard) -> Router<AppState> {
    let mut routes = Router::new();
    let ours = |path: &&str| !api.paths.paths.contains_key(*path);
    let (predict, health) = state.vertex_routes();
    let (predict, health) = (predict.filter(ours), health.filter(ours).filter(|h| Some(*h) != predict));
    if let Some(path) = predict {
        let checkpoint = Checkpoint { state: state.clone(), guard };
        routes = routes.route(
            path,
            axum::routing::post(dispatch::vertex)
                .route_layer(middleware::from_fn_with_state(checkpoint, checkpoint::pass)),
        );
    }
    if let Some(path) = health {
        routes = routes.route(path, axum::routing::get(health::readiness));
    }
    routes
}

/// Where the OpenAPI document is served, and where Swagger UI reads it.
const OPENAPI_PATH: &str = "/openapi.json";

/// A handler answering with `api` as JSON, written once: the document's tree (over 2 MB of small maps and strings
/// for this API) is dropped once the app is built, where serving it as a `Json` kept it for the life of the process.
fn document(api: &utoipa::openapi::OpenApi) -> impl Fn() -> std::future::Ready<axum::response::Response> + Clone {
    let json = serde_json::to_vec(api).map(axum::body::Bytes::from).map_err(|e| e.to_string());
    if let Err(e) = &json {
        tracing::error!("the OpenAPI document cannot be written as JSON: {e}");
    }
    move || {
        std::future::ready(match &json {
            Ok(json) => {
                let content_type = (axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                ([content_type], json.clone()).into_response()
            }
            Err(e) => {
                AppError::internal(format!("the OpenAPI document cannot be written as JSON: {e}")).into_response()
            }
        })
    }
}

/// The whole app over `state`.
pub fn app(state: AppState) -> Router {
    let max_body = state.max_body_bytes();
    let (routes, api) = api(&state);
    let routes = routes
        .merge(utoipa_swagger_ui::SwaggerUi::new("/docs").config(utoipa_swagger_ui::Config::new([OPENAPI_PATH])))
        .route(OPENAPI_PATH, axum::routing::get(document(&api)))
        .fallback(|| async { AppError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            AppError::new(ErrorKind::MethodNotAllowed, "method not allowed on this route")
        });
    // The body limit applies to what the decompression layer hands on, so a small compressed body cannot expand
    // past it.
    let body = ServiceBuilder::new()
        .map_response(IntoResponse::into_response)
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(tower_http::decompression::RequestDecompressionLayer::new())
        .layer(DefaultBodyLimit::max(max_body));
    let routes = outer_layers(routes, body, || AppError::internal("the request handler panicked").into_response());
    match cors(state.cors_allow_origin()) {
        Some(cors) => routes.layer(cors).with_state(state),
        None => routes.with_state(state),
    }
}

/// The CORS layer for `origins` (`--cors-allow-origin`; `*` for any), or none: then no CORS headers are sent, and
/// browsers keep other origins' pages out. It answers preflight requests itself, before the API key is asked for
/// (a browser sends none with them), and allows what the API's own clients send: `GET` and `POST`, a JSON or
/// binary body, an API key and a request id.
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{header, Method};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = match origins.iter().any(|o| o == "*") {
        true => AllowOrigin::any(),
        false => AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o.trim()).ok())),
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                header::CONTENT_TYPE,
                header::AUTHORIZATION,
                REQUEST_ID_HEADER,
                crate::routes::v2::JSON_LENGTH,
            ])
            .expose_headers([REQUEST_ID_HEADER]),
    )
}

#[cfg(test)]
mod tests;
