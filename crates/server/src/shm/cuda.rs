//! A registered CUDA shared-memory region: a span of a client's GPU memory, opened from the IPC handle it exported
//! (`inferd_candle::ipc`, where the build's CUDA lives). Inputs are copied from it to the host and outputs back, on
//! a stream of the region's own; a build without CUDA refuses to register one, saying what to use instead.

use std::sync::Arc;

use bytes::Bytes;
use inferd_candle::ipc::IpcMemory;
use inferd_codec::shm::Region;

use crate::error::AppError;

/// `byte_size` bytes from the start of the allocation a client's handle names, on GPU `device_id`.
pub struct CudaRegion {
    pub device_id: u64,
    pub byte_size: u64,
    /// Held until the region drops, then closed off the async runtime (see `Drop`).
    memory: Option<IpcMemory>,
}

/// A CUDA region as the status calls show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct CudaRegionStatus {
    pub name: String,
    pub device_id: u64,
    pub byte_size: u64,
}

impl CudaRegion {
    /// Opens the memory `handle` names on GPU `device`: refused (400) where the handle, the GPU or the size is
    /// wrong, or first of all where the build has no CUDA. Blocks on the driver: off the async runtime.
    pub(super) fn open(handle: Handle, device: i64, byte_size: u64) -> Result<CudaRegion, AppError> {
        let refused = |e: inferd_core::Error| AppError::bad_request(format!("CUDA shared memory: {e}"));
        // The driver numbers GPUs with a C int.
        let gpu = i32::try_from(device).ok().and_then(|d| usize::try_from(d).ok()).ok_or_else(|| {
            AppError::bad_request(format!("device_id {device} is not a GPU: GPUs count from 0, as CUDA's ordinals"))
        })?;
        let device_id = gpu as u64;
        IpcMemory::supported(gpu).map_err(refused)?;
        let size = usize::try_from(byte_size)
            .map_err(|_| AppError::bad_request("the region is larger than this machine addresses"))?;
        let handle = match handle {
            Handle::Bytes(bytes) => bytes,
            Handle::Base64(b64) => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| AppError::bad_request(format!("raw_handle.b64 is not base64: {e}")))?
            }
        };
        let memory = IpcMemory::open(&handle, gpu, size).map_err(refused)?;
        Ok(CudaRegion { device_id, byte_size, memory: Some(memory) })
    }

    /// Closes the handle on this thread, now: for an unregister call, which answers once it is closed.
    pub(super) fn close(mut self) {
        self.memory = None;
    }

    fn memory(&self) -> &IpcMemory {
        self.memory.as_ref().expect("a region's memory is held until it drops: this is a bug")
    }

    pub(super) fn status(&self, name: &str) -> CudaRegionStatus {
        CudaRegionStatus { name: name.to_owned(), device_id: self.device_id, byte_size: self.byte_size }
    }
}

impl Region for CudaRegion {
    fn byte_size(&self) -> usize {
        self.memory().byte_size()
    }

    fn read(self: Arc<Self>, offset: usize, len: usize) -> std::io::Result<Bytes> {
        self.memory().read(offset, len).map(Bytes::from).map_err(std::io::Error::other)
    }

    fn write(&self, offset: usize, bytes: &[u8]) -> std::io::Result<()> {
        self.memory().write(offset, bytes).map_err(std::io::Error::other)
    }

    fn on_device(&self) -> bool {
        true
    }
}

impl Drop for CudaRegion {
    /// Closing the handle blocks on the driver, and with the last region of a server whose models are all on the
    /// CPU it releases the GPU's context too (a tenth of a second or more). A region still held when unregistered
    /// drops where its last request lets go of it, often on the async runtime: the close runs on a blocking thread
    /// where a runtime is about.
    fn drop(&mut self) {
        let Some(memory) = self.memory.take() else { return };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // Nothing waits for the close.
            let _detached = runtime.spawn_blocking(move || {
                let _closed_here = memory;
            });
        }
        // Else `memory` closes here, on this thread.
    }
}

/// A CUDA IPC handle as a protocol carries it: gRPC's bytes, or HTTP's base64 (`raw_handle: {"b64": ...}`).
pub enum Handle {
    Bytes(Vec<u8>),
    Base64(String),
}
