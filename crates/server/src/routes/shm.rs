//! Triton's shared-memory extension over HTTP: system shared-memory regions registered, listed and unregistered
//! ([`crate::shm`]); inputs and outputs then name them in their parameters (the codec's [`crate::codec::shm`]).
//! CUDA shared memory answers as a server without such regions does: none listed, none to unregister, and
//! registering refused with a message that says what to use instead.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::json_request;
use crate::error::{AppError, ErrorBody};
use crate::shm::{cuda_refused, not_registered, RegionStatus};
use crate::state::AppState;

/// The routes, behind the API key when one is configured.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(system_status))
        .routes(routes!(system_region_status))
        .routes(routes!(system_register))
        .routes(routes!(system_unregister_all))
        .routes(routes!(system_unregister))
        .routes(routes!(cuda_status))
        .routes(routes!(cuda_region_status))
        .routes(routes!(cuda_register))
        .routes(routes!(cuda_unregister_all))
        .routes(routes!(cuda_unregister))
}

/// A system shared-memory region to register: `byte_size` bytes at `offset` in the object `key`.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct RegisterRequest {
    /// The object's POSIX shared-memory name, as its creator gave it to `shm_open` (`/name`).
    pub key: String,
    #[serde(default)]
    pub offset: u64,
    pub byte_size: u64,
}

/// Every registered system shared-memory region.
#[utoipa::path(get, path = "/v2/systemsharedmemory/status", tag = "shared-memory",
    responses((status = 200, body = Vec<RegionStatus>)), security(("api_key" = [])))]
async fn system_status(State(state): State<AppState>) -> Result<Json<Vec<RegionStatus>>, AppError> {
    Ok(Json(state.shared_memory().status(None)?))
}

/// One registered system shared-memory region.
#[utoipa::path(get, path = "/v2/systemsharedmemory/region/{region}/status", tag = "shared-memory",
    params(("region" = String, Path, description = "The region's name")),
    responses((status = 200, body = Vec<RegionStatus>), (status = 400, body = ErrorBody)), security(("api_key" = [])))]
async fn system_region_status(
    State(state): State<AppState>,
    Path(region): Path<String>,
) -> Result<Json<Vec<RegionStatus>>, AppError> {
    Ok(Json(state.shared_memory().status(Some(&region))?))
}

/// Registers a system shared-memory region (with `--allow-client-shm` only).
#[utoipa::path(post, path = "/v2/systemsharedmemory/region/{region}/register", tag = "shared-memory",
    params(("region" = String, Path, description = "The name requests will give the region")),
    request_body(content = RegisterRequest),
    responses((status = 200, description = "Registered"), (status = 400, body = ErrorBody)),
    security(("api_key" = [])))]
async fn system_register(
    State(state): State<AppState>,
    Path(region): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AppError> {
    let RegisterRequest { key, offset, byte_size } = json_request(body, "shared memory register")?;
    state.shared_memory().register(region, key, offset, byte_size).await?;
    Ok(StatusCode::OK)
}

/// Unregisters every system shared-memory region; requests using one finish with it.
#[utoipa::path(post, path = "/v2/systemsharedmemory/unregister", tag = "shared-memory",
    responses((status = 200, description = "Unregistered")), security(("api_key" = [])))]
async fn system_unregister_all(State(state): State<AppState>) -> StatusCode {
    state.shared_memory().unregister(None);
    StatusCode::OK
}

/// Unregisters a system shared-memory region (a name not registered is no error); requests using it finish with
/// it.
#[utoipa::path(post, path = "/v2/systemsharedmemory/region/{region}/unregister", tag = "shared-memory",
    params(("region" = String, Path, description = "The region's name")),
    responses((status = 200, description = "Unregistered")), security(("api_key" = [])))]
async fn system_unregister(State(state): State<AppState>, Path(region): Path<String>) -> StatusCode {
    state.shared_memory().unregister(Some(&region));
    StatusCode::OK
}

/// Every registered CUDA shared-memory region: none.
#[utoipa::path(get, path = "/v2/cudasharedmemory/status", tag = "shared-memory",
    responses((status = 200, body = Vec<Object>)), security(("api_key" = [])))]
async fn cuda_status() -> Json<Vec<serde_json::Value>> {
    Json(Vec::new())
}

/// One registered CUDA shared-memory region: none is.
#[utoipa::path(get, path = "/v2/cudasharedmemory/region/{region}/status", tag = "shared-memory",
    params(("region" = String, Path, description = "The region's name")),
    responses((status = 400, body = ErrorBody)), security(("api_key" = [])))]
async fn cuda_region_status(Path(region): Path<String>) -> AppError {
    not_registered(&region)
}

/// Registering a CUDA shared-memory region: refused, saying what to use instead.
#[utoipa::path(post, path = "/v2/cudasharedmemory/region/{region}/register", tag = "shared-memory",
    params(("region" = String, Path, description = "The region's name")),
    responses((status = 400, body = ErrorBody)), security(("api_key" = [])))]
async fn cuda_register(Path(_region): Path<String>) -> AppError {
    cuda_refused()
}

/// Unregisters every CUDA shared-memory region: there are none (clients such as perf_analyzer call it first).
#[utoipa::path(post, path = "/v2/cudasharedmemory/unregister", tag = "shared-memory",
    responses((status = 200, description = "Nothing to unregister")), security(("api_key" = [])))]
async fn cuda_unregister_all() -> StatusCode {
    StatusCode::OK
}

/// Unregisters a CUDA shared-memory region: none is registered.
#[utoipa::path(post, path = "/v2/cudasharedmemory/region/{region}/unregister", tag = "shared-memory",
    params(("region" = String, Path, description = "The region's name")),
    responses((status = 200, description = "Nothing to unregister")), security(("api_key" = [])))]
async fn cuda_unregister(Path(_region): Path<String>) -> StatusCode {
    StatusCode::OK
}
