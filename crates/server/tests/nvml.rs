//! The NVML probe against the real library (feature `cuda`): what /health reports of each GPU must be what
//! `nvidia-smi` reports. CI compiles this (scripts/gpu-bundle.sh); scripts/gpu-check.sh runs it on a GPU machine,
//! where it fails, rather than passes quietly, if NVML or nvidia-smi is missing.
#![cfg(feature = "cuda")]

use inferd_server::gpu::{GpuProbe, NvmlProbe};

const MIB: u64 = 1 << 20;

#[test]
fn nvml_reports_each_gpu_as_nvidia_smi_does() {
    let probe = NvmlProbe::new().expect("NVML loads where the NVIDIA driver is");
    let gpus = probe.gpus().expect("NVML lists the GPUs");
    let smi = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=index,name,uuid,memory.total,driver_version,compute_cap", "--format=csv,noheader,nounits"])
        .output()
        .expect("nvidia-smi runs");
    assert!(smi.status.success(), "nvidia-smi: {}", String::from_utf8_lossy(&smi.stderr));
    let rows: Vec<Vec<String>> = String::from_utf8_lossy(&smi.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.split(',').map(|field| field.trim().to_owned()).collect())
        .collect();
    assert!(!gpus.is_empty(), "NVML sees no GPU");
    assert_eq!(gpus.len(), rows.len(), "NVML and nvidia-smi disagree on the GPU count: {gpus:?} vs {rows:?}");
    for (gpu, row) in gpus.iter().zip(&rows) {
        let [index, name, uuid, total_mib, driver, capability] = &row[..] else {
            panic!("unexpected nvidia-smi row {row:?}");
        };
        assert_eq!(gpu.index.to_string(), *index);
        assert_eq!(gpu.name, *name);
        assert_eq!(gpu.uuid, *uuid);
        assert_eq!((gpu.memory_total_bytes / MIB).to_string(), *total_mib, "total memory in MiB");
        assert_eq!(gpu.driver_version.as_deref(), Some(driver.as_str()));
        assert_eq!(gpu.compute_capability.as_deref(), Some(capability.as_str()));
        assert!(gpu.memory_free_bytes > 0 && gpu.memory_used_bytes <= gpu.memory_total_bytes, "{gpu:?}");
        assert!(gpu.memory_free_bytes <= gpu.memory_total_bytes, "{gpu:?}");
        assert!(gpu.utilization_percent.is_some_and(|u| u <= 100), "{gpu:?}");
    }
}
