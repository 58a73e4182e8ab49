//! GPU memory at load time: what a model's weights will take on the device, read from the safetensors header
//! alone, checked against what the GPU has free, so that a model too large is a clear load error and never a
//! half-copied model or an out-of-memory failure in the middle of serving.
//! And what CUDA's memory pool keeps of freed tensors, given back to the GPU at a load, after a warm-up and when a
//! model drops.

use std::io::Read;
use std::path::Path;

use candle_core::{DType, Device};
use inferd_core::{Error, Precision, Result};

/// A GPU's memory, as its driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuMemory {
    pub(crate) free: u64,
    pub(crate) total: u64,
}

/// The safetensors format's own limit on its JSON header.
const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// Bytes the tensors of `file` take once loaded with floats in `dtype` (other tensors keep their stored size).
pub(crate) fn weights_bytes(file: &Path, dtype: DType) -> Result<u64> {
    let bad = |message: String| Error::config(file, message);
    let mut reader = std::fs::File::open(file).map_err(|e| bad(format!("cannot read the weights: {e}")))?;
    let mut length = [0u8; 8];
    reader.read_exact(&mut length).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
    let length = u64::from_le_bytes(length);
    if length > MAX_HEADER_BYTES {
        return Err(bad(format!("not a safetensors file: a header of {length} bytes")));
    }
    let mut header = Vec::with_capacity(length as usize);
    reader.take(length).read_to_end(&mut header).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("not a safetensors header: {e}")))?;
    let mut total = 0u64;
    for (name, entry) in header.iter().filter(|(name, _)| name.as_str() != "__metadata__") {
        let stored = entry["dtype"].as_str().unwrap_or_default();
        let [Some(start), Some(end)] = [0, 1].map(|i| entry["data_offsets"][i].as_u64()) else {
            return Err(bad(format!("tensor `{name}` has no data_offsets")));
        };
        let stored_bytes = end.saturating_sub(start);
        let bytes = match stored_size(stored) {
            // A float tensor is cast to the model's dtype when it is loaded.
            Some((size, true)) => stored_bytes / size * dtype.size_in_bytes() as u64,
            _ => stored_bytes,
        };
        total = total.saturating_add(bytes);
    }
    Ok(total)
}

/// The element size of a safetensors dtype, and whether it is a float that loading casts.
fn stored_size(dtype: &str) -> Option<(u64, bool)> {
    Some(match dtype {
        "F64" => (8, true),
        "F32" => (4, true),
        "F16" | "BF16" => (2, true),
        "I64" | "U64" => (8, false),
        "I32" | "U32" => (4, false),
        "I16" | "U16" => (2, false),
        _ => return None,
    })
}

/// Refuses a model whose weights (`need` bytes) do not fit in the GPU's free memory.
pub(crate) fn check_fits(model: &str, need: u64, precision: Precision, device: &str, gpu: GpuMemory) -> Result<()> {
    if need <= gpu.free {
        return Ok(());
    }
    let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
    let hint = match precision {
        Precision::Fp32 => "use precision = \"fp16\" or \"bf16\" (half the memory), ",
        _ => "",
    };
    Err(Error::Unsupported(format!(
        "model `{model}`: its weights need {:.2} GiB of GPU memory in {precision}, but {device} has {:.2} GiB free \
         of {:.2} GiB; {hint}free the GPU, or give the model another device",
        gib(need),
        gib(gpu.free),
        gib(gpu.total),
    )))
}

/// Free and total bytes of a GPU's memory, once what this process's freed tensors left in the allocator's pool
/// is given back (see [`release_pooled`]); `None` on the CPU.
#[cfg(feature = "cuda")]
pub(crate) fn gpu_memory(device: &Device) -> Option<GpuMemory> {
    release_pooled(device);
    gpu_free(device)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn gpu_memory(_device: &Device) -> Option<GpuMemory> {
    None
}

/// Free and total bytes of a GPU's memory as the driver reports them now.
#[cfg(feature = "cuda")]
fn gpu_free(device: &Device) -> Option<GpuMemory> {
    let cuda = device.as_cuda_device().ok()?;
    let (free, total) = cuda.cuda_stream().context().mem_get_info().ok()?;
    Some(GpuMemory { free: free as u64, total: total as u64 })
}

/// candle allocates with `cuMemAllocAsync`: a freed tensor's memory goes back to the device's memory pool once
/// its stream reaches the free, and the pool returns it to the driver only at a later synchronisation, so until
/// then the driver counts it as used, by this process, for ever if no batch follows. Waits for every stream of the
/// context (every model's batches on this GPU: a pause of one batch at most), then trims the device's pool, which
/// every candle model on the GPU shares, to what live tensors hold; the others' next batches take their working
/// memory back from the driver. At a model's load, after its warm-up, when its worker has been idle a while
/// (`[batching] release_after_idle_ms`), and when it drops: never per batch.
#[cfg(feature = "cuda")]
pub(crate) fn release_pooled(device: &Device) {
    use candle_core::cuda_backend::cudarc::driver::result;
    let Ok(cuda) = device.as_cuda_device() else { return };
    let context = cuda.cuda_stream().context().clone();
    // A failed free is only recorded, and reading memory clears the record: report it first.
    if let Err(e) = context.check_err() {
        tracing::warn!(device = %crate::device_name(device), error = %e, "an earlier CUDA call on this GPU failed");
    }
    if !context.has_async_alloc() {
        return; // without memory pools a free goes straight back to the driver
    }
    // What the trim gave back is read only for the debug line that says it.
    let before = tracing::enabled!(tracing::Level::DEBUG).then(|| gpu_free(device)).flatten();
    // SAFETY: the pool is the device's own (cuDeviceGetMemPool), valid while the context lives; trimming releases
    // only memory that no allocation holds.
    #[allow(unsafe_code)]
    let trimmed = context.synchronize().and_then(|()| unsafe {
        let pool = result::device::get_mem_pool(context.cu_device())?;
        result::mem_pool::trim_to(pool, 0)
    });
    match trimmed {
        Ok(()) => tracing::debug!(
            device = %crate::device_name(device),
            free_before = before.map(|m| m.free),
            free_after = gpu_free(device).map(|m| m.free),
            "gave the memory pool's cached blocks back to the GPU"
        ),
        Err(e) => tracing::warn!(device = %crate::device_name(device), error = %e, "cannot trim the GPU's memory pool"),
    }
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn release_pooled(_device: &Device) {}

/// Makes the GPU's context current on this thread (a no-op on the CPU).
#[cfg(feature = "cuda")]
pub(crate) fn bind_context(device: &Device) {
    if let Ok(cuda) = device.as_cuda_device() {
        if let Err(e) = cuda.cuda_stream().context().bind_to_thread() {
            tracing::warn!(device = %crate::device_name(device), error = %e, "cannot make the GPU's context current");
        }
    }
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn bind_context(_device: &Device) {}

/// Logs what the GPU has free at a step of a model's load: where its memory goes (context, libraries, weights).
pub(crate) fn log_gpu_free(device: &Device, model: &str, step: &str) {
    #[cfg(feature = "cuda")]
    if let Some(memory) = tracing::enabled!(tracing::Level::DEBUG).then(|| gpu_free(device)).flatten() {
        tracing::debug!(model, device = %crate::device_name(device), free = memory.free, step, "GPU memory");
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (device, model, step);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_that_does_not_fit_is_refused_with_the_figures() {
        let gpu = GpuMemory { free: 3 << 30, total: 80 << 30 };
        assert!(check_fits("m", 3 << 30, Precision::Fp32, "cuda:0", gpu).is_ok());
        let err = check_fits("m", 4 << 30, Precision::Fp32, "cuda:0", gpu).expect_err("too large").to_string();
        assert!(err.contains("need 4.00 GiB of GPU memory in fp32"), "{err}");
        assert!(err.contains("cuda:0 has 3.00 GiB free of 80.00 GiB"), "{err}");
        assert!(err.contains("precision = \"fp16\""), "{err}");
        let err = check_fits("m", 4 << 30, Precision::Fp16, "cuda:1", gpu).expect_err("too large").to_string();
        assert!(!err.contains("precision ="), "no hint to halve what is already half: {err}");
    }

    #[test]
    fn floats_count_at_the_model_dtype_and_integers_as_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("w.safetensors");
        let cpu = candle_core::Device::Cpu;
        let weights: std::collections::HashMap<String, candle_core::Tensor> = [
            ("w".to_owned(), candle_core::Tensor::zeros((3, 5), DType::F32, &cpu).expect("f32")),
            ("h".to_owned(), candle_core::Tensor::zeros(7, DType::F16, &cpu).expect("f16")),
            ("ids".to_owned(), candle_core::Tensor::zeros((1, 4), DType::I64, &cpu).expect("i64")),
        ]
        .into_iter()
        .collect();
        candle_core::safetensors::save(&weights, &file).expect("save");
        // 22 floats and 4 int64s.
        assert_eq!(weights_bytes(&file, DType::F32).expect("reads"), 22 * 4 + 4 * 8);
        assert_eq!(weights_bytes(&file, DType::F16).expect("reads"), 22 * 2 + 4 * 8);
        assert_eq!(weights_bytes(&file, DType::BF16).expect("reads"), 22 * 2 + 4 * 8);
    }

    #[test]
    fn a_file_that_is_not_safetensors_is_a_config_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, bytes) in [
            ("short", &b"abc"[..]),
            ("huge-header", &u64::MAX.to_le_bytes()[..]),
            ("not-json", &[4, 0, 0, 0, 0, 0, 0, 0, b'{', b'{', b'}', b'}'][..]),
        ] {
            let file = dir.path().join(name);
            std::fs::write(&file, bytes).expect("write");
            let err = weights_bytes(&file, DType::F32).expect_err("refused").to_string();
            assert!(err.contains("safetensors"), "{name}: {err}");
        }
    }
}
