//! Triton's shared-memory extensions over HTTP: system and CUDA shared-memory regions registered, listed and
//! unregistered ([`crate::shm`]); inputs and outputs then name them in their parameters (the codec's
//! [`crate::codec::shm`]). A build without CUDA refuses to register a CUDA region, saying what to use instead.

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
use crate::shm::{CudaRegionStatus, Handle, Kind, RegionStatus};
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
    state.shared_memory().unregister(Kind::System, None).await;
    StatusCode::OK
}

/// Unregisters a system shared-memory region (a name not registered is no error); requests using it finish with
/// it.
#[utoipa::path(post, path = "/v2/systemsharedmemory/region/{region}/unregister", tag = "shared-memory",
    params(("region" = String, Path, description = "The region's name")),
    responses((status = 200, description = "Unregistered")), security(("api_key" = [])))]
async fn system_unregister(State(state): State<AppState>, Path(region): Path<String>) -> StatusCode {
    state.shared_memory().unregister(Kind::System, Some(&region)).await;
    StatusCode::OK
}

/// A CUDA shared-memory region to register: `byte_size` bytes of the GPU allocation whose IPC handle is `raw_handle`.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct CudaRegisterRequest {
    /// The `cudaIpcMemHandle_t`'s 64 bytes, in base64.
    pub raw_handle: RawHandle,
    /// The GPU the allocation is on.
    pub device_id: i64,
    pub byte_size: u64,
}

/// Binary data as Triton's JSON carries it.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct RawHandle {
    pub b64: String,
}

/// Every registered CUDA shared-memory region.
#[utoipa::path(get, path = "/v2/cudasharedmemory/status", tag = "shared-memory",
    responses((status = 200, body = Vec<CudaRegionStatus>)), security(("api_key" = [])))]
async fn cuda_status(State(state): State<AppState>) -> Result<Json<Vec<CudaRegionStatus>>, AppError> {
    Ok(Json(state.shared_memory().cuda_status(None)?))
}

/// One registered CUDA shared-memory region.
#[utoipa::path(get, path = "/v2/cudasharedmemory/region/{region}/status", tag = "shared-memory",
    params(("region" = String, Path, description = "The region's name")),
    responses((status = 200, body = Vec<CudaRegionStatus>), (status = 400, body = ErrorBody)),
    security(("api_key" = [])))]
async fn cuda_region_status(
    State(state): State<AppState>,
    Path(region): Path<String>,
) -> Result<Json<Vec<CudaRegionStatus>>, AppError> {
    Ok(Json(state.shared_memory().cuda_status(Some(&region))?))
}

/// Registers a CUDA shared-memory region (with `--allow-client-shm`, in the CUDA build).
#[utoipa::path(post, path = "/v2/cudasharedmemory/region/{region}/register", tag = "shared-memory",
    params(("region" = String, Path, description = "The name requests will give the region")),
    request_body(content = CudaRegisterRequest),
    responses((status = 200, description = "Registered"), (status = 400, body = ErrorBody)),
    security(("api_key" = [])))]
async fn cuda_register(
    State(state): State<AppState>,
    Path(region): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AppError> {
    let CudaRegisterRequest { raw_handle, device_id, byte_size } = json_request(body, "CUDA shared memory register")?;
    let handle = Handle::Base64(raw_handle.b64);
    state.shared_memory().register_cuda(region, handle, device_id, byte_size).await?;
    Ok(StatusCode::OK)
}

/// Unregisters every CUDA shared-memory region; requests using one finish with it.
#[utoipa::path(post, path = "/v2/cudasharedmemory/unregister", tag = "shared-memory",
    responses((status = 200, description = "Unregistered")), security(("api_key" = [])))]
async fn cuda_unregister_all(State(state): State<AppState>) -> StatusCode {
    state.shared_memory().unregister(Kind::Cuda, None).await;
    StatusCode::OK
}

/// Unregisters a CUDA shared-memory region (a name not registered is no error); requests using it finish with it.
#[utoipa::path(post, path = "/v2/cudasharedmemory/region/{region}/unregister", tag = "shared-memory",
    params(("region" = String, Path, description = "The region's name")),
    responses((status = 200, description = "Unregistered")), security(("api_key" = [])))]
async fn cuda_unregister(State(state): State<AppState>, Path(region): Path<String>) -> StatusCode {
    state.shared_memory().unregister(Kind::Cuda, Some(&region)).await;
    StatusCode::OK
}
