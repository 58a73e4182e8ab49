//! GPU facts for /health: a small `GpuProbe` interface, NVML behind it, a fake for tests, and a snapshot that a
//! background task refreshes so that probes never block.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Serialize;

/// One GPU as /health reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub memory_free_bytes: u64,
    /// Percent of the last sample period a kernel ran.
    pub utilization_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    /// `major.minor`, e.g. `9.0` for an H100.
    pub compute_capability: Option<String>,
    pub driver_version: Option<String>,
}

/// Reads the GPUs present. Implementations may block (NVML does): callers run them off the async runtime.
pub trait GpuProbe: Send + Sync + 'static {
    fn gpus(&self) -> Result<Vec<GpuInfo>, String>;
}

/// A probe for machines without NVIDIA's management library: no GPUs.
#[derive(Debug, Default)]
pub struct NoGpu;

impl GpuProbe for NoGpu {
    fn gpus(&self) -> Result<Vec<GpuInfo>, String> {
        Ok(Vec::new())
    }
}

/// A probe that reports fixed GPUs, for tests.
#[derive(Debug, Clone, Default)]
pub struct FakeGpuProbe(pub Vec<GpuInfo>);

impl GpuProbe for FakeGpuProbe {
    fn gpus(&self) -> Result<Vec<GpuInfo>, String> {
        Ok(self.0.clone())
    }
}

/// NVML, loaded at run time from the driver's `libnvidia-ml.so.1`.
pub struct NvmlProbe {
    nvml: nvml_wrapper::Nvml,
}

impl NvmlProbe {
    /// Fails where the NVIDIA driver (and so NVML) is absent.
    pub fn new() -> Result<NvmlProbe, String> {
        nvml_wrapper::Nvml::init().map(|nvml| NvmlProbe { nvml }).map_err(|e| e.to_string())
    }
}

impl GpuProbe for NvmlProbe {
    fn gpus(&self) -> Result<Vec<GpuInfo>, String> {
        use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
        let count = self.nvml.device_count().map_err(|e| e.to_string())?;
        let driver_version = self.nvml.sys_driver_version().ok();
        (0..count)
            .map(|index| {
                let device = self.nvml.device_by_index(index).map_err(|e| e.to_string())?;
                let memory = device.memory_info().map_err(|e| e.to_string())?;
                Ok(GpuInfo {
                    index,
                    name: device.name().map_err(|e| e.to_string())?,
                    uuid: device.uuid().unwrap_or_default(),
                    memory_total_bytes: memory.total,
                    memory_used_bytes: memory.used,
                    memory_free_bytes: memory.free,
                    utilization_percent: device.utilization_rates().ok().map(|u| u.gpu),
                    temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok(),
                    compute_capability: device
                        .cuda_compute_capability()
                        .ok()
                        .map(|c| format!("{}.{}", c.major, c.minor)),
                    driver_version: driver_version.clone(),
                })
            })
            .collect()
    }
}

/// The probe this machine supports: NVML where the driver is, otherwise none.
pub fn system_probe() -> Arc<dyn GpuProbe> {
    match NvmlProbe::new() {
        Ok(probe) => Arc::new(probe),
        Err(e) => {
            tracing::info!(reason = %e, "NVML is not available: no NVIDIA GPU will be reported");
            Arc::new(NoGpu)
        }
    }
}

/// Reads the memory of the GPU a model's `cuda:N` names, through `probe`, for the models' load-time budget.
/// `cuda_visible_devices` is the process's `CUDA_VISIBLE_DEVICES`, which renumbers the GPUs CUDA sees.
pub fn memory_reader(
    probe: &Arc<dyn GpuProbe>,
    cuda_visible_devices: Option<String>,
) -> inferd_models::GpuMemoryReader {
    let probe = Arc::clone(probe);
    Arc::new(move |ordinal| {
        let gpus = probe.gpus().ok()?;
        let gpu = cuda_device(&gpus, cuda_visible_devices.as_deref(), ordinal)?;
        Some(inferd_models::DeviceMemory { free: gpu.memory_free_bytes, total: gpu.memory_total_bytes })
    })
}

/// The GPU that CUDA calls device `ordinal`, among `gpus` as NVML lists them. NVML numbers every GPU of the
/// machine; CUDA only those `CUDA_VISIBLE_DEVICES` names, in its order: by NVML index (CUDA's own order, which is
/// NVML's where the GPUs are alike; `CUDA_DEVICE_ORDER=FASTEST_FIRST`, the default, may differ on a machine of mixed
/// GPUs) or by UUID or a unique prefix of one. As CUDA does, the list ends at the first entry that names no GPU, or
/// one named before; a MIG instance (`MIG-…`) is not one NVML's GPU list can answer for, so it ends there too.
fn cuda_device<'a>(gpus: &'a [GpuInfo], visible: Option<&str>, ordinal: usize) -> Option<&'a GpuInfo> {
    let Some(visible) = visible else {
        return gpus.iter().find(|g| g.index as usize == ordinal);
    };
    let named = |entry: &str| -> Option<&'a GpuInfo> {
        if let Ok(index) = entry.parse::<u32>() {
            return gpus.iter().find(|g| g.index == index);
        }
        if !entry.starts_with("GPU-") {
            return None;
        }
        let mut matches = gpus.iter().filter(|g| g.uuid.starts_with(entry));
        match (matches.next(), matches.next()) {
            (Some(gpu), None) => Some(gpu),
            _ => None,
        }
    };
    let mut listed: Vec<&GpuInfo> = Vec::new();
    for entry in visible.split(',').map(str::trim) {
        match named(entry) {
            Some(gpu) if !listed.iter().any(|g| g.index == gpu.index) => listed.push(gpu),
            _ => break,
        }
    }
    listed.get(ordinal).copied()
}

/// The latest GPU facts, shared by /health (readers) and the refresh task (the only writer).
#[derive(Clone)]
pub struct GpuMonitor {
    probe: Arc<dyn GpuProbe>,
    snapshot: Arc<RwLock<Arc<Vec<GpuInfo>>>>,
}

impl GpuMonitor {
    pub fn new(probe: Arc<dyn GpuProbe>) -> Self {
        GpuMonitor { probe, snapshot: Arc::new(RwLock::new(Arc::new(Vec::new()))) }
    }

    /// The last snapshot taken; never blocks on the GPU.
    pub fn snapshot(&self) -> Arc<Vec<GpuInfo>> {
        self.snapshot.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// Takes a new snapshot, off the async runtime's threads.
    pub async fn refresh(&self) {
        let probe = self.probe.clone();
        match tokio::task::spawn_blocking(move || probe.gpus()).await {
            Ok(Ok(gpus)) => {
                if let Ok(mut s) = self.snapshot.write() {
                    *s = Arc::new(gpus);
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "reading the GPUs failed; keeping the last snapshot"),
            Err(e) => tracing::warn!(error = %e, "the GPU probe panicked; keeping the last snapshot"),
        }
    }

    /// Refreshes every `period` until the task is dropped.
    pub async fn refresh_every(self, period: Duration) {
        let mut ticks = tokio::time::interval(period.max(Duration::from_millis(100)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.refresh().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str, free: u64) -> GpuInfo {
        GpuInfo {
            index,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: uuid.into(),
            memory_total_bytes: 80 << 30,
            memory_used_bytes: (80 << 30) - free,
            memory_free_bytes: free,
            utilization_percent: None,
            temperature_celsius: None,
            compute_capability: Some("9.0".into()),
            driver_version: None,
        }
    }

    #[test]
    fn cuda_ordinals_follow_cuda_visible_devices() {
        let gpus = [gpu(0, "GPU-aaa-0", 10), gpu(1, "GPU-abb-1", 11), gpu(2, "GPU-ccc-2", 12)];
        let free = |visible: Option<&str>, ordinal| cuda_device(&gpus, visible, ordinal).map(|g| g.memory_free_bytes);
        // Unset: CUDA sees every GPU, in NVML's order.
        assert_eq!([free(None, 0), free(None, 2), free(None, 3)], [Some(10), Some(12), None]);
        // An allocation of GPUs 2 and 0 (as Slurm sets it, or a shared host): cuda:0 is GPU 2.
        assert_eq!([free(Some("2,0"), 0), free(Some("2, 0"), 1), free(Some("2,0"), 2)], [Some(12), Some(10), None]);
        // By UUID, whole or a unique prefix; an ambiguous prefix names no GPU.
        assert_eq!([free(Some("GPU-ccc-2,GPU-abb"), 0), free(Some("GPU-ccc-2,GPU-abb"), 1)], [Some(12), Some(11)]);
        assert_eq!(free(Some("GPU-a"), 0), None, "GPU-a could be either of two");
        // The list ends at the first entry that names no GPU, as CUDA's does.
        assert_eq!([free(Some("1,7,2"), 0), free(Some("1,7,2"), 1)], [Some(11), None]);
        assert_eq!(free(Some(""), 0), None, "an empty list hides every GPU");
        assert_eq!([free(Some("0,0,1"), 0), free(Some("0,0,1"), 1)], [Some(10), None], "a GPU named twice ends it");
        assert_eq!(free(Some("MIG-4b0b3f1e"), 0), None);
    }

    #[test]
    fn the_budget_reads_the_gpu_cuda_uses() {
        let probe: Arc<dyn GpuProbe> = Arc::new(FakeGpuProbe(vec![gpu(0, "GPU-aaa", 10), gpu(1, "GPU-bbb", 11)]));
        let read = memory_reader(&probe, Some("1".into()));
        assert_eq!(read(0), Some(inferd_models::DeviceMemory { free: 11, total: 80 << 30 }));
        assert_eq!(read(1), None);
        assert_eq!(memory_reader(&probe, None)(1).map(|m| m.free), Some(11));
    }
}
