//! The routes that several protocols share, each served as the model's task says it serves ([`Service`]): `POST
//! /predict` and `/models/{model}/predict` (pictures to a vision model, TEI's `/predict` on a classifier, the seed's
//! tensors to every other model), SageMaker's `POST /invocations` (the default model's own route) and Vertex
//! AI's `POST /vertex` (each of its instances as `/invocations` takes it). No body is read to choose: the model's
//! service does.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use inferd_models::Service;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{images, predict, tei};
use crate::budget::Payload;
use crate::codec::predict::PredictResponse;
use crate::error::{body_error, AppError, ErrorBody};
use crate::request::{InflightHold, RoutedModel};
use crate::state::AppState;

/// An error of a route several protocols share: inferd's own `{"error"}`, or TEI's `{"error", "error_type"}` where
/// TEI's handler served the request (a classifier's `/predict`, a text model's `/invocations`).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SharedError {
    Own(ErrorBody),
    Tei(tei::TeiError),
}

/// The answers a shared route gives besides success, for the OpenAPI document.
#[derive(utoipa::IntoResponses)]
pub enum SharedErrors {
    /// A body the model's task does not take (in the shape of the protocol that serves the model).
    #[response(status = 400)]
    BadRequest(SharedError),
    /// An API key is configured and the request carries none, or a wrong one.
    #[response(status = 401)]
    Unauthorized(SharedError),
    /// No such model.
    #[response(status = 404)]
    NotFound(SharedError),
    /// The body, its tensor elements or its rows are over the server's limits.
    #[response(status = 413)]
    PayloadTooLarge(SharedError),
    /// The model's queue is full; retry after `Retry-After` seconds.
    #[response(status = 429)]
    Overloaded(SharedError),
    /// The model is not ready, the server is draining, or the request's deadline passed in the queue.
    #[response(status = 503)]
    Unavailable(SharedError),
}

/// `/predict`, which serves the default model.
pub fn default_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(predict_default))
}

/// `/models/{model}/predict`.
pub fn named_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(predict_named))
}

/// `/invocations`: SageMaker's inference route, serving the default model.
pub fn invocations_route() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(invocations))
}

twin_routes! {
    post serve, (
        state: State<AppState>,
        model: Result<RoutedModel, AppError>,
        hold: InflightHold,
        headers: HeaderMap,
        body: Payload,
    ) -> Response;
    "Serve `/predict` with the default model." predict_default at "/predict"
        (("x-inferd-timeout-ms" = Option<u64>, Header, description = "Milliseconds the request may wait in the queue; past that it is answered 503 and never runs"));
    "Serve `/predict` with the named model." predict_named at "/models/{model}/predict"
        (("model" = String, Path, description = "The model"),
         ("x-inferd-timeout-ms" = Option<u64>, Header, description = "Milliseconds the request may wait in the queue; past that it is answered 503 and never runs"));
    tag = "inference",
    request_body(content = Object, description = "As the model's task takes it. A tensor model (and a text model, its texts as tensors): one input as `input`, or several by name in `inputs`. A vision model: the file as the body (`Content-Type: image/*`), the parts of a `multipart/form-data` form, or `{\"image\": \"<base64>\"}` / `{\"images\": [...]}`; it answers `{model, device, predictions: [{width, height, outputs: {name: reading}}]}`. A classifier: TEI's `{\"inputs\": text | [a, b] | [[a], [b, c]]}`. Without `--default-model`, `/predict` serves the default classifier."),
    responses((status = 200, body = PredictResponse, headers(
        ("x-inferd-batch-size" = u64, description = "Rows in the batch that served the request"),
        ("x-inferd-queue-us" = u64, description = "Microseconds queued"),
        ("x-inferd-compute-us" = u64, description = "Microseconds the batch computed"))), SharedErrors),
    security(("api_key" = []))
}

/// Serve the default model as its own route would (a text model's body as TEI's `POST /` serves it, any other's as
/// `/predict`): SageMaker's container contract.
#[utoipa::path(
    post, path = "/invocations", tag = "inference",
    request_body(content = Object, description = "As the default model's own route takes it: TEI's `/embed`, `/embed_sparse`, `/rerank` or `/predict` body for a text model (its `POST /`), the seed's `/predict` body or pictures otherwise."),
    responses((status = 200, description = "As the model's own route answers"), SharedErrors),
    security(("api_key" = []))
)]
pub(crate) async fn invocations(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(bytes) => Payload::Whole(bytes),
        Err(rejected) => return body_error(rejected).into_response(),
    };
    let service = match &model {
        Ok(routed) => match routed.serving(state.registry()) {
            Ok(loaded) => loaded.service(),
            Err(e) => return e.into_response(),
        },
        // The model's own route says why there is none.
        Err(_) => Service::Tensors,
    };
    match service.takes_text() {
        // Read whole by the checkpoint: this route's body is never left unread.
        true => match body {
            Payload::Whole(bytes) => {
                tei::root(state, model, hold, Ok(bytes)).await.unwrap_or_else(IntoResponse::into_response)
            }
            Payload::Unread(_) => AppError::internal("an unread body on /invocations: this is a bug").into_response(),
        },
        false => serve(state, model, hold, headers, body).await,
    }
}

/// Serves a `/predict` body as the model's task says.
async fn serve(
    State(state): State<AppState>,
    model: Result<RoutedModel, AppError>,
    InflightHold(hold): InflightHold,
    headers: HeaderMap,
    body: Payload,
) -> Response {
    let answer = async {
        let deadline = predict::queue_deadline(&headers)?;
        let model = model?.serving(state.registry())?;
        let service = model.service();
        let carrier = images::carrier(&headers, model.task.takes_pictures())?;
        let tensors = !matches!(service, Service::Classify | Service::Images) && carrier.is_none();
        if tensors {
            // Every other model, whatever its task, by its tensor face (a text model: texts in as `BYTES`): the
            // one body here that can be decoded as it arrives.
            return predict::serve(&state, &model, &hold, body, deadline).await;
        }
        let body = body.whole(&hold, &headers, state.max_body_bytes()).await?;
        Ok::<_, AppError>(match service {
            Service::Classify => tei::score::predict(&state, &model, &hold, body).await.into_response(),
            // A vision model, or pictures sent to a model that takes none: its task says so.
            _ => images::predict(&state, &model, &hold, carrier, body, deadline).await?,
        })
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// `/vertex`, and Vertex AI's prediction route where `AIP_PREDICT_ROUTE` names one.
pub fn vertex_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(vertex))
}

/// Vertex AI's prediction request. Its `parameters` are taken and ignored: each instance says how it is served.
#[derive(serde::Deserialize, utoipa::ToSchema)]
pub struct VertexRequest {
    /// Each a body as `/invocations` takes it for the default model (TEI's `/embed` or `/rerank` body for a text
    /// model, the seed's `/predict` body for a tensor model).
    #[schema(value_type = Vec<Object>)]
    instances: Vec<Box<serde_json::value::RawValue>>,
}

/// Serve each instance as `/invocations` would, concurrently (so that they batch together): Vertex AI's custom
/// container contract.
#[utoipa::path(
    post, path = "/vertex", tag = "inference", request_body = VertexRequest,
    responses((status = 200, description = "`{\"predictions\": [...]}`: each instance's answer, in order"), SharedErrors),
    security(("api_key" = []))
)]
pub(crate) async fn vertex(
    state: State<AppState>,
    model: Result<RoutedModel, AppError>,
    hold: InflightHold,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answer = async {
        let body = body.map_err(body_error)?;
        let request: VertexRequest = serde_json::from_slice(&body)
            .map_err(|e| AppError::bad_request(format!("invalid Vertex AI request: {e}")))?;
        drop(body);
        if request.instances.is_empty() {
            return Err(AppError::bad_request("`instances` is empty: there is nothing to predict"));
        }
        let json = || {
            let mut headers = HeaderMap::new();
            headers.insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
            headers
        };
        let answers = request.instances.into_iter().map(|instance| {
            let body = Bytes::from(instance.get().to_owned());
            invocations(state.clone(), model.clone(), hold.clone(), json(), Ok(body))
        });
        let mut predictions = Vec::new();
        for (i, response) in futures_util::future::join_all(answers).await.into_iter().enumerate() {
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .map_err(|e| AppError::internal(format!("instance {i}: its answer could not be read: {e}")))?;
            if !status.is_success() {
                // The whole request fails with the first instance that does, in its own words.
                let mut failed = (status, bytes).into_response();
                failed
                    .headers_mut()
                    .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
                return Ok(failed);
            }
            predictions.push(
                serde_json::from_slice::<Box<serde_json::value::RawValue>>(&bytes)
                    .map_err(|e| AppError::internal(format!("instance {i}: its answer is not JSON: {e}")))?,
            );
        }
        let body = serde_json::to_vec(&serde_json::json!({ "predictions": predictions }))
            .map_err(|e| AppError::internal(format!("encoding the predictions: {e}")))?;
        Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}
