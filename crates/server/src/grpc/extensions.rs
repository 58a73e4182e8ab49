//! Triton's extensions beyond inference over gRPC, each the wire around the operation its HTTP route calls:
//! system shared memory's status, and the log and trace settings.

use crate::codec::grpc::proto::system_shared_memory_status_response::RegionStatus;
use crate::codec::grpc::proto::{SystemSharedMemoryStatusRequest, SystemSharedMemoryStatusResponse};
use crate::error::AppError;
use crate::state::AppState;

/// The registered system shared-memory regions, or the one named.
pub fn system_status(
    state: &AppState,
    request: SystemSharedMemoryStatusRequest,
) -> Result<SystemSharedMemoryStatusResponse, AppError> {
    let name = request.name;
    let regions = state.shared_memory().status((!name.is_empty()).then_some(name.as_str()))?;
    let regions = regions
        .into_iter()
        .map(|r| (r.name.clone(), RegionStatus { name: r.name, key: r.key, offset: r.offset, byte_size: r.byte_size }))
        .collect();
    Ok(SystemSharedMemoryStatusResponse { regions })
}
