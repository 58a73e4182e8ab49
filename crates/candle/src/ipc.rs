//! Another process's GPU memory, opened from the CUDA IPC handle that process exported (`cudaIpcGetMemHandle`):
//! Triton's CUDA shared memory. The memory is opened once, in the GPU's primary context (the one candle's models
//! run in), and read and written by copies between it and host memory on a stream of its own, which waits for no
//! model's work. A build without CUDA opens none, saying so.

use inferd_core::{Error, Result};

/// The bytes of a CUDA IPC memory handle (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// Whether this build opens CUDA IPC memory: the CUDA build does.
pub const SUPPORTED: bool = cfg!(feature = "cuda");

/// `byte_size` bytes of another process's GPU memory, from the start of the allocation its handle names; closed
/// when dropped.
pub struct IpcMemory {
    byte_size: usize,
    #[cfg(feature = "cuda")]
    opened: cuda::Opened,
}

impl std::fmt::Debug for IpcMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcMemory").field("byte_size", &self.byte_size).finish_non_exhaustive()
    }
}

impl IpcMemory {
    /// Opens the memory `handle` names on GPU `device`, for `byte_size` bytes: refused where the handle is not one,
    /// the GPU is not this machine's, the allocation is smaller than `byte_size`, or the build has no CUDA. Blocks
    /// for as long as the driver takes (the first call on a GPU makes its context): call it off the async runtime.
    pub fn open(handle: &[u8], device: usize, byte_size: usize) -> Result<IpcMemory> {
        IpcMemory::supported(device)?;
        let handle: &[u8; IPC_HANDLE_BYTES] = handle.try_into().map_err(|_| {
            Error::InvalidInput(format!(
                "a CUDA IPC memory handle is {IPC_HANDLE_BYTES} bytes (cudaIpcMemHandle_t), not {}",
                handle.len()
            ))
        })?;
        if byte_size == 0 {
            return Err(Error::InvalidInput("a CUDA shared memory region's byte_size must be 1 or more".into()));
        }
        IpcMemory::open_handle(handle, device, byte_size)
    }

    #[cfg(feature = "cuda")]
    fn open_handle(handle: &[u8; IPC_HANDLE_BYTES], device: usize, byte_size: usize) -> Result<IpcMemory> {
        Ok(IpcMemory { byte_size, opened: cuda::Opened::new(handle, device, byte_size)? })
    }

    #[cfg(not(feature = "cuda"))]
    fn open_handle(_: &[u8; IPC_HANDLE_BYTES], device: usize, _: usize) -> Result<IpcMemory> {
        IpcMemory::supported(device)?;
        unreachable!("a build without CUDA refuses every handle: this is a bug")
    }

    /// Refused, saying what to use instead, where this build cannot open GPU memory (it has no CUDA): what a
    /// client hears first, whatever else is wrong with its request.
    pub fn supported(device: usize) -> Result<()> {
        if SUPPORTED {
            return Ok(());
        }
        Err(Error::Unsupported(format!(
            "CUDA shared memory on GPU {device} needs inferd's CUDA build (the CUDA image, or --features cuda): this \
             one has no CUDA. Register system shared memory (/v2/systemsharedmemory) instead, or send the tensors \
             in the request"
        )))
    }

    pub fn byte_size(&self) -> usize {
        self.byte_size
    }

    /// `len` bytes from `offset`, copied to the host: refused past the end.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.within(offset, len)?;
        #[cfg(feature = "cuda")]
        return self.opened.read(offset, len);
        #[cfg(not(feature = "cuda"))]
        unreachable!("no IpcMemory opens without CUDA")
    }

    /// Copies `bytes` to `offset`: refused past the end.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.within(offset, bytes.len())?;
        #[cfg(feature = "cuda")]
        return self.opened.write(offset, bytes);
        #[cfg(not(feature = "cuda"))]
        unreachable!("no IpcMemory opens without CUDA")
    }

    fn within(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.byte_size => Ok(()),
            _ => Err(Error::InvalidInput(format!(
                "bytes {offset} to {} are past the end of {} bytes of CUDA shared memory",
                offset.saturating_add(len),
                self.byte_size
            ))),
        }
    }
}

#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda {
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
    use inferd_core::{Error, Result};

    use super::IPC_HANDLE_BYTES;

    /// The opened memory, its context and the stream its copies run on.
    pub(super) struct Opened {
        context: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        /// The start of the allocation, in this process's address space.
        base: sys::CUdeviceptr,
    }

    // SAFETY: `base` is a device address, valid in the context for as long as this lives (closed on drop); every
    // use binds the context to the calling thread first.
    unsafe impl Send for Opened {}
    // SAFETY: as above; copies from several threads are ordered on the one stream.
    unsafe impl Sync for Opened {}

    impl Opened {
        pub(super) fn new(handle: &[u8; IPC_HANDLE_BYTES], device: usize, byte_size: usize) -> Result<Opened> {
            let failed = |doing: &str, e: DriverError| Error::InvalidInput(format!("{doing} on GPU {device}: {e}"));
            // The CUDA driver bindings may panic rather than fail when no driver is present.
            let context = std::panic::catch_unwind(|| CudaContext::new(device))
                .map_err(|_| Error::Unsupported(format!("GPU {device}: the CUDA driver is not usable here")))?
                .map_err(|e| failed("cannot use the GPU", e))?;
            // SAFETY: event tracking orders `CudaSlice`s across streams, and this context makes none. Without it, the
            // context's first stream waits for every kernel on the GPU (the models' too) before it is made.
            unsafe { context.disable_event_tracking() };
            let stream = context.new_stream().map_err(|e| failed("cannot make a stream", e))?;
            let mut raw = sys::CUipcMemHandle_st { reserved: [0; IPC_HANDLE_BYTES] };
            for (to, from) in raw.reserved.iter_mut().zip(handle) {
                *to = *from as std::ffi::c_char;
            }
            let mut base: sys::CUdeviceptr = 0;
            let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
            // SAFETY: the context is current on this thread (`CudaContext::new` bound it); `base` receives the
            // address of the mapping, which `Drop` closes.
            unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, raw, flags) }
                .result()
                .map_err(|e| failed("cannot open the CUDA IPC memory handle", e))?;
            let opened = Opened { context, stream, base };
            let (mut start, mut size) = (0, 0usize);
            // SAFETY: `base` is the address just opened; the call only reads the allocation's range.
            unsafe { sys::cuMemGetAddressRange_v2(&mut start, &mut size, base) }
                .result()
                .map_err(|e| failed("cannot read the CUDA IPC allocation's size", e))?;
            let held = size.saturating_sub((base - start) as usize);
            if byte_size > held {
                return Err(Error::InvalidInput(format!(
                    "the CUDA IPC allocation holds {held} bytes: too small for a region of {byte_size}"
                )));
            }
            Ok(opened)
        }

        pub(super) fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
            if len == 0 {
                return Ok(Vec::new());
            }
            let mut bytes = vec![0u8; len];
            self.copy(|stream| {
                // SAFETY: the span was checked against the region, which the allocation holds; `bytes` is the
                // host memory the copy fills, alive until the stream is synchronised below.
                unsafe { result::memcpy_dtoh_async(&mut bytes, self.base + offset as u64, stream) }
            })?;
            Ok(bytes)
        }

        pub(super) fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
            if bytes.is_empty() {
                return Ok(());
            }
            self.copy(|stream| {
                // SAFETY: as in `read`, the other way.
                unsafe { result::memcpy_htod_async(self.base + offset as u64, bytes, stream) }
            })
        }

        /// Runs `copy` on the region's stream and waits for it.
        fn copy(&self, copy: impl FnOnce(sys::CUstream) -> std::result::Result<(), DriverError>) -> Result<()> {
            self.context
                .bind_to_thread()
                .and_then(|()| copy(self.stream.cu_stream()))
                .and_then(|()| self.stream.synchronize())
                .map_err(|e| Error::engine(format!("copying CUDA shared memory: {e}")))
        }
    }

    impl Drop for Opened {
        fn drop(&mut self) {
            // SAFETY: the address `cuIpcOpenMemHandle` gave; no copy is in flight (each waits for its own).
            let closed =
                self.context.bind_to_thread().and_then(|()| unsafe { sys::cuIpcCloseMemHandle(self.base) }.result());
            if let Err(e) = closed {
                tracing::warn!(error = %e, "cannot close a CUDA IPC memory handle");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU check opens real handles from another process; here, the CPU build's answer.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_build_without_cuda_refuses_every_handle_before_reading_it() {
        for handle in [&[0u8; IPC_HANDLE_BYTES][..], &[1, 2, 3], &[]] {
            let refused = IpcMemory::open(handle, 0, 64).expect_err("no CUDA here").to_string();
            assert!(refused.contains("needs inferd's CUDA build"), "{refused}");
            assert!(refused.contains("system shared memory"), "{refused}");
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn a_handle_is_64_bytes_and_a_region_one_byte_or_more() {
        let short = IpcMemory::open(&[0; 3], 0, 64).expect_err("3 bytes").to_string();
        assert!(short.contains("64 bytes (cudaIpcMemHandle_t), not 3"), "{short}");
        let empty = IpcMemory::open(&[0; IPC_HANDLE_BYTES], 0, 0).expect_err("0 bytes").to_string();
        assert!(empty.contains("1 or more"), "{empty}");
    }
}
