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

/// Reads one GPU's memory through `probe`, for the models' load-time budget.
pub fn memory_reader(probe: &Arc<dyn GpuProbe>) -> inferd_models::GpuMemoryReader {
    let probe = Arc::clone(probe);
    Arc::new(move |index| {
        let gpus = probe.gpus().ok()?;
        let gpu = gpus.into_iter().find(|g| g.index as usize == index)?;
        Some(inferd_models::DeviceMemory { free: gpu.memory_free_bytes, total: gpu.memory_total_bytes })
    })
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
