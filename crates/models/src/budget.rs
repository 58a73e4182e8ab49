//! A model's memory budget at load: its weights and its configured working set (`[memory] working_set`) set
//! against the memory left where it will run, on its GPU or on the host, before any of it is taken; and, once it
//! is loaded, what it took.

use std::sync::Arc;

pub use inferd_core::HostMemory;
use inferd_core::{Backend, DeviceSpec, ModelConfig};

/// The variable cuBLAS reads, as it makes a handle, for the size of that handle's workspace.
pub const CUBLAS_WORKSPACE_VARIABLE: &str = "CUBLAS_WORKSPACE_CONFIG";

/// MiB of workspace per cuBLAS handle unless the operator says otherwise. Each candle model instance on a GPU
/// holds a handle (ONNX Runtime's CUDA provider one per session), and cuBLAS 13 gives each 64 MiB on an H100:
/// 64 MiB of GPU memory for a model of 38 KB. MiniLM ran as fast with 8 MiB and with none (benches/README.md, "A
/// model's GPU memory").
pub const DEFAULT_CUBLAS_WORKSPACE_MIB: u64 = 8;

/// The `CUBLAS_WORKSPACE_CONFIG` value for `mib` of workspace per handle: 4 MiB buffers, rounded up; none for 0.
pub fn cublas_workspace_config(mib: u64) -> String {
    match mib {
        0 => ":0:0".to_owned(),
        n => format!(":4096:{}", n.div_ceil(4)),
    }
}

/// Sizes every cuBLAS handle's workspace through `CUBLAS_WORKSPACE_CONFIG`, unless that is set already (the
/// operator's own value wins). Call before any other thread starts: the environment is the process's.
pub fn set_cublas_workspace(mib: u64) {
    if std::env::var_os(CUBLAS_WORKSPACE_VARIABLE).is_none() {
        std::env::set_var(CUBLAS_WORKSPACE_VARIABLE, cublas_workspace_config(mib));
    }
}

/// A GPU's memory as the server's probe reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub free: u64,
    pub total: u64,
}

/// Reads GPU `n`'s memory; `None` where there is no such GPU. May block (NVML does): loads run off the runtime.
pub type GpuMemoryReader = Arc<dyn Fn(usize) -> Option<DeviceMemory> + Send + Sync>;

/// Where a model's memory will come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Host,
    Gpu(usize),
}

/// What a model will need: its weights (an estimate from its files) for each instance, and its working set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Need {
    pub(crate) weights: u64,
    pub(crate) instances: u64,
    pub(crate) working_set: u64,
}

impl Need {
    pub(crate) fn of(config: &ModelConfig) -> Need {
        let weights = match config.backend {
            Backend::Onnx => inferd_onnx::stored_weight_bytes(&config.file),
            Backend::Candle => None,
        };
        let weights = weights.or_else(|| std::fs::metadata(&config.file).ok().map(|m| m.len())).unwrap_or(0);
        let instances = config.instances as u64;
        Need { weights, instances, working_set: config.memory.working_set.saturating_mul(instances) }
    }

    pub(crate) fn total(&self) -> u64 {
        self.weights.saturating_mul(self.instances).saturating_add(self.working_set)
    }
}

/// Where the model's memory comes from, judged before it loads: the GPU it names, or GPU 0 for `auto` where the
/// probe sees one; else the host. Candle checks its own GPU weights exactly when it loads (`inferd-candle`).
pub(crate) fn place(config: &ModelConfig, gpu: Option<&GpuMemoryReader>) -> (Place, Option<DeviceMemory>) {
    let read = |n: usize| gpu.and_then(|read| read(n));
    match config.device {
        DeviceSpec::Cpu => (Place::Host, None),
        // A GPU model whose GPU cannot be read (no NVML, a MIG instance) is not checked, never checked against the
        // host's memory.
        DeviceSpec::Cuda(n) => (Place::Gpu(n), read(n)),
        DeviceSpec::Auto => match read(0) {
            Some(memory) => (Place::Gpu(0), Some(memory)),
            None => (Place::Host, None),
        },
    }
}

/// Refuses a model whose need does not fit in what is left where it will run.
pub(crate) fn check(
    need: Need,
    place: Place,
    gpu: Option<DeviceMemory>,
    host: Option<HostMemory>,
) -> anyhow::Result<()> {
    let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
    let (left, room) = match (place, gpu, host) {
        (Place::Gpu(n), Some(gpu), _) => {
            (gpu.free, format!("GPU {n} has {:.2} GiB free of {:.2} GiB", gib(gpu.free), gib(gpu.total)))
        }
        (Place::Host, _, Some(host)) => {
            let limit = host.limit.map(|l| format!(" (under the container's limit of {:.2} GiB)", gib(l)));
            (
                host.available,
                format!("the host has {:.2} GiB available{}", gib(host.available), limit.unwrap_or_default()),
            )
        }
        _ => return Ok(()),
    };
    if need.total() <= left {
        return Ok(());
    }
    let on = match place {
        Place::Gpu(_) => "GPU memory",
        Place::Host => "host memory",
    };
    anyhow::bail!(
        "it needs {:.2} GiB of {on} ({:.2} GiB of weights x {} instance(s), and [memory] working_set {:.2} GiB), but \
         {room}; free some, lower instances or working_set, or place it elsewhere (device)",
        gib(need.total()),
        gib(need.weights),
        need.instances,
        gib(need.working_set),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cublas_workspace_is_whole_4_mib_buffers() {
        assert_eq!(cublas_workspace_config(0), ":0:0");
        assert_eq!(cublas_workspace_config(1), ":4096:1");
        assert_eq!(cublas_workspace_config(8), ":4096:2");
        assert_eq!(cublas_workspace_config(9), ":4096:3");
        assert_eq!(cublas_workspace_config(64), ":4096:16");
    }
}
