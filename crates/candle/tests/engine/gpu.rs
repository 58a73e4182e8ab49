//! GPU tests (feature `cuda`): device selection, precision casts and GPU memory limits on a real NVIDIA GPU.
//! CI compiles them (scripts/gpu-bundle.sh); scripts/gpu-check.sh runs them where a GPU is. They fail, rather
//! than pass quietly, on a machine without one.

use std::io::Write;

use candle_core::cuda_backend::cudarc::driver::CudaContext;
use candle_core::DType;

use super::*;

/// How many GPUs the CUDA driver sees; at least one, or the test fails.
fn gpu_count() -> usize {
    let count = CudaContext::device_count().expect("the CUDA driver answers");
    assert!(count > 0, "the GPU tests need an NVIDIA GPU");
    count as usize
}

/// A device's free and total memory now, as its driver reports them.
fn memory(device: &Device) -> (usize, usize) {
    let cuda = device.as_cuda_device().expect("a CUDA device");
    cuda.cuda_stream().context().mem_get_info().expect("the driver reports memory")
}

#[test]
fn devices_are_chosen_as_configured() {
    let count = gpu_count();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    for (spec, want) in [(DeviceSpec::Cuda(0), "cuda:0"), (DeviceSpec::Auto, "cuda:0"), (DeviceSpec::Cpu, "cpu")] {
        let mut c = config(dir.path(), file.clone(), None);
        c.device = spec;
        let mut engine = CandleEngine::load(&c, Precision::Fp32, &[]).expect("loads");
        assert_eq!(engine.metadata().device, want, "{spec}");
        let got = run(&mut engine);
        let want: Vec<f64> = ROWS.iter().flat_map(reference).collect();
        for (g, w) in got.iter().zip(&want) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{spec}: {got:?} vs {want:?}");
        }
    }
    let mut c = config(dir.path(), file, None);
    c.device = DeviceSpec::Cuda(count);
    let err = CandleEngine::load(&c, Precision::Fp32, &[]).expect_err("there is no such GPU").to_string();
    assert!(err.contains(&format!("cannot use GPU {count}")), "{err}");
}

#[test]
fn the_default_precision_applies_on_a_gpu() {
    gpu_count();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    let mut c = config(dir.path(), file, None);
    c.device = DeviceSpec::Cuda(0);
    for default in [Precision::Fp16, Precision::Bf16, Precision::Fp32] {
        let engine = CandleEngine::load(&c, default, &[]).expect("loads");
        assert_eq!(engine.metadata().precision, default, "no precision in model.toml: the server's default applies");
    }
}

#[test]
fn every_precision_matches_the_reference_on_the_gpu() {
    gpu_count();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    let want: Vec<f64> = ROWS.iter().flat_map(reference).collect();
    for (precision, tolerance) in [(Precision::Fp32, 1e-6), (Precision::Fp16, 1e-2), (Precision::Bf16, 5e-2)] {
        let mut c = config(dir.path(), file.clone(), Some(precision));
        c.device = DeviceSpec::Cuda(0);
        let mut engine = CandleEngine::load(&c, Precision::Fp32, &[]).expect("loads");
        assert_eq!((engine.metadata().device.as_str(), engine.metadata().precision), ("cuda:0", precision));
        let got = run(&mut engine);
        for (g, w) in got.iter().zip(&want) {
            assert!((f64::from(*g) - w).abs() <= tolerance * w.abs().max(1.0), "{precision}: {got:?} vs {want:?}");
        }
    }
}

#[test]
fn fp16_inputs_and_outputs_stay_fp16_on_the_gpu() {
    gpu_count();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    let mut c = config(dir.path(), file, Some(Precision::Fp16));
    c.device = DeviceSpec::Cuda(0);
    c.inputs = vec![TensorSpec { name: "x".into(), datatype: DataType::Fp16, shape: vec![-1, 3], optional: false }];
    c.outputs = vec![TensorSpec { name: "y".into(), datatype: DataType::Fp16, shape: vec![-1, 2], optional: false }];
    let mut engine = CandleEngine::load(&c, Precision::Fp32, &[]).expect("loads");
    let x: Vec<half::f16> = ROWS[1].iter().map(|&v| half::f16::from_f64(v)).collect();
    let out = engine.run(&[Tensor::from_slice(vec![1, 3], &x).expect("valid")]).expect("runs");
    assert_eq!(out[0].dtype(), DataType::Fp16);
    let got: Vec<f64> = out[0].to_vec::<half::f16>().expect("fp16").iter().map(|v| v.to_f64()).collect();
    let want = reference(&ROWS[1]);
    assert!((got[0] - want[0]).abs() < 1e-2 && (got[1] - want[1]).abs() < 1e-2, "{got:?} vs {want:?}");
}

#[test]
fn a_wide_network_on_the_gpu_agrees_with_f64() {
    gpu_count();
    wide_network_agrees_with_f64(DeviceSpec::Cuda(0), "cuda:0");
}

#[test]
fn a_large_batch_leaves_no_gpu_memory_behind_once_released() {
    gpu_count();
    let dir = tempfile::tempdir().expect("tempdir");
    // A hidden layer of 4096 FP32: a batch of 16,384 rows holds 256 MiB in it, 512 MiB with its activation.
    let (_, c) = write_sparse_mlp(dir.path(), 4096);
    let mut engine = CandleEngine::load(&c, Precision::Fp32, &[]).expect("loads");
    let device = Device::new_cuda(0).expect("GPU 0");
    let rows = 16_384;
    let input = Tensor::from_slice(vec![rows, 64], &vec![1f32; rows * 64]).expect("valid");
    // A first batch loads the kernels' code onto the GPU, which stays: the measure starts after it.
    engine.run(std::slice::from_ref(&input)).expect("runs");
    engine.release_cached_memory();
    let (idle, _) = memory(&device);
    let out = engine.run(&[input]).expect("runs");
    assert_eq!(out[0].shape(), [rows, 10]);
    let (held, _) = memory(&device);
    engine.release_cached_memory();
    let (after, _) = memory(&device);
    eprintln!(
        "a batch of {rows} rows: {} MiB held after it, {} MiB once released",
        (idle.saturating_sub(held)) >> 20,
        (idle.saturating_sub(after)) >> 20
    );
    // CUDA's memory pool keeps a freed tensor's memory until a later synchronisation; released, it is the GPU's.
    assert!(idle.saturating_sub(after) < 32 << 20, "{} MiB stayed after the release", idle.saturating_sub(after) >> 20);
}

#[test]
fn an_unloaded_model_gives_its_gpu_memory_back() {
    gpu_count();
    let dir = tempfile::tempdir().expect("tempdir");
    // 512 MiB of weights.
    let (_, c) = write_sparse_mlp(dir.path(), hidden_for(512 << 20));
    let device = Device::new_cuda(0).expect("GPU 0");
    let engine = CandleEngine::load(&c, Precision::Fp32, &[]).expect("loads");
    let (loaded, _) = memory(&device);
    drop(engine);
    let (unloaded, _) = memory(&device);
    let back = unloaded.saturating_sub(loaded);
    assert!(back >= 480 << 20, "{} MiB came back of 512 MiB of weights", back >> 20);
}

/// The hidden width that gives a sparse mlp (below) about `bytes` of FP32 weights.
fn hidden_for(bytes: usize) -> usize {
    bytes / (4 * (64 + 1 + 10))
}

/// An mlp `[64, hidden, 10]` whose weights file declares its tensors but is sparse: it takes no disk, reads as
/// zeros, and is as large on the GPU as a real one.
fn write_sparse_mlp(dir: &Path, hidden: usize) -> (std::path::PathBuf, ModelConfig) {
    let shapes = [
        ("fc1.weight", vec![hidden, 64]),
        ("fc1.bias", vec![hidden]),
        ("fc2.weight", vec![10, hidden]),
        ("fc2.bias", vec![10]),
    ];
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in &shapes {
        let bytes = shape.iter().product::<usize>() * 4;
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut header = serde_json::to_vec(&header).expect("json");
    header.resize(header.len().next_multiple_of(8), b' ');
    let path = dir.join(format!("sparse-{hidden}.safetensors"));
    let mut file = std::fs::File::create(&path).expect("create");
    file.write_all(&(header.len() as u64).to_le_bytes()).expect("write");
    file.write_all(&header).expect("write");
    file.set_len((8 + header.len() + offset) as u64).expect("a sparse file");
    let mut c = config(dir, path.clone(), Some(Precision::Fp32));
    c.device = DeviceSpec::Cuda(0);
    let candle = c.candle.as_mut().expect("candle");
    candle.layers = vec![64, hidden, 10];
    candle.activations = vec!["relu".into(), "none".into()];
    (path, c)
}

#[test]
fn a_model_larger_than_the_gpu_is_a_clean_load_error() {
    gpu_count();
    let dir = tempfile::tempdir().expect("tempdir");
    // Weights of twice the GPU's memory: refused from the file's header, before anything is copied.
    let (_, total) = memory(&Device::new_cuda(0).expect("GPU 0"));
    let (_, c) = write_sparse_mlp(dir.path(), hidden_for(2 * total));
    let err = CandleEngine::load(&c, Precision::Fp32, &[]).expect_err("does not fit").to_string();
    assert!(err.contains("GPU memory in fp32") && err.contains("cuda:0 has"), "{err}");
    // The GPU is unharmed: a model that fits loads and runs.
    let file = write_weights(dir.path());
    let mut small = config(dir.path(), file, None);
    small.device = DeviceSpec::Cuda(0);
    let mut engine = CandleEngine::load(&small, Precision::Fp32, &[]).expect("a small model still loads");
    run(&mut engine);
}

#[test]
fn a_model_that_fits_the_gpu_but_not_its_free_memory_is_refused_until_memory_frees() {
    gpu_count();
    let dir = tempfile::tempdir().expect("tempdir");
    // 1 GiB of weights.
    let (_, c) = write_sparse_mlp(dir.path(), hidden_for(1 << 30));
    let device = Device::new_cuda(0).expect("GPU 0");
    let (free, _) = memory(&device);
    // Another tenant holds all but 512 MiB.
    let hog = candle_core::Tensor::zeros(free - (512 << 20), DType::U8, &device).expect("a plain allocation");
    let err = CandleEngine::load(&c, Precision::Fp32, &[]).expect_err("no room while the memory is held").to_string();
    assert!(err.contains("need 1.00 GiB of GPU memory"), "{err}");
    drop(hog);
    let mut engine = CandleEngine::load(&c, Precision::Fp32, &[]).expect("loads once the memory is free");
    let out = engine.run(&[Tensor::from_slice(vec![1, 64], &[1f32; 64]).expect("valid")]).expect("runs");
    assert_eq!(out[0].to_vec::<f32>().expect("fp32"), vec![0f32; 10], "zero weights give zero logits");
}
