//! The candle engine on small weight files written here, checked against values worked out by hand or in f64.
//! The tests name their device; `gpu.rs` (feature `cuda`) runs them on a GPU, with device selection and GPU
//! memory limits: scripts/gpu-bundle.sh builds this test for scripts/gpu-check.sh to run on a GPU machine.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Device;
use inferd_candle::CandleEngine;
use inferd_core::{
    BatchingConfig, CandleOptions, DataType, DeviceSpec, Engine, ModelConfig, OnnxOptions, Precision, Tensor,
    TensorSpec,
};

/// fc1: 3 -> 2, fc2: 2 -> 2, as torch lays them out ([out, in]).
fn write_weights(dir: &Path) -> std::path::PathBuf {
    let cpu = Device::Cpu;
    let t = |v: &[f32], shape: &[usize]| candle_core::Tensor::from_vec(v.to_vec(), shape, &cpu).expect("tensor");
    let weights: HashMap<String, candle_core::Tensor> = [
        ("fc1.weight", t(&[1.0, 0.0, -1.0, 0.5, 0.5, 0.5], &[2, 3])),
        ("fc1.bias", t(&[0.0, -1.0], &[2])),
        ("fc2.weight", t(&[1.0, 1.0, 2.0, -1.0], &[2, 2])),
        ("fc2.bias", t(&[0.5, 0.0], &[2])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let path = dir.join("w.safetensors");
    candle_core::safetensors::save(&weights, &path).expect("save");
    path
}

/// The same network in f64, by hand: relu(W1 x + b1), then W2 h + b2.
fn reference(x: &[f64; 3]) -> [f64; 2] {
    let h = [(x[0] - x[2]).max(0.0), (0.5 * (x[0] + x[1] + x[2]) - 1.0).max(0.0)];
    [h[0] + h[1] + 0.5, 2.0 * h[0] - h[1]]
}

fn config(dir: &Path, file: std::path::PathBuf, precision: Option<Precision>) -> ModelConfig {
    ModelConfig {
        name: "tiny".into(),
        version: 1,
        dir: dir.to_path_buf(),
        config_file: dir.join(inferd_core::MODEL_CONFIG_FILE),
        version_policy: Default::default(),
        backend: inferd_core::Backend::Candle,
        file,
        device: DeviceSpec::Cpu,
        precision,
        instances: 1,
        batching: BatchingConfig::default(),
        inputs: vec![],
        outputs: vec![],
        task: inferd_core::Task::Tensors,
        text: Default::default(),
        warmup: Default::default(),
        image: None,
        postprocess: Vec::new(),
        onnx: OnnxOptions::default(),
        memory: Default::default(),
        candle: Some(CandleOptions {
            architecture: "mlp".into(),
            layers: vec![3, 2, 2],
            activations: vec!["relu".into(), "none".into()],
        }),
    }
}

const ROWS: [[f64; 3]; 3] = [[1.0, 2.0, 3.0], [4.0, 0.0, -2.0], [0.5, 0.5, 0.5]];

fn run(engine: &mut CandleEngine) -> Vec<f32> {
    let x: Vec<f32> = ROWS.iter().flatten().map(|&v| v as f32).collect();
    let out = engine.run(&[Tensor::from_slice(vec![3, 3], &x).expect("valid")]).expect("runs");
    assert_eq!(out[0].shape(), &[3, 2]);
    out[0].to_vec::<f32>().expect("fp32")
}

#[test]
fn fp32_matches_the_hand_computed_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    let mut engine = CandleEngine::load(&config(dir.path(), file, None), Precision::Fp16, &[]).expect("loads");
    let meta = engine.metadata().clone();
    assert_eq!(meta.device, "cpu");
    assert_eq!(meta.precision, Precision::Fp32, "the fp16 default does not apply on the CPU");
    assert_eq!(meta.inputs[0].shape, vec![-1, 3]);
    assert_eq!(meta.outputs[0].name, "output");
    let got = run(&mut engine);
    let want: Vec<f64> = ROWS.iter().flat_map(reference).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn fp16_and_bf16_stay_within_their_precision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    let want: Vec<f64> = ROWS.iter().flat_map(reference).collect();
    for (precision, tolerance) in [(Precision::Fp16, 1e-2), (Precision::Bf16, 5e-2)] {
        let mut engine = CandleEngine::load(&config(dir.path(), file.clone(), Some(precision)), Precision::Fp32, &[])
            .expect("loads");
        assert_eq!(engine.metadata().precision, precision);
        let got = run(&mut engine);
        for (g, w) in got.iter().zip(&want) {
            assert!((f64::from(*g) - w).abs() <= tolerance * w.abs().max(1.0), "{precision}: {got:?} vs {want:?}");
        }
    }
}

#[test]
fn fp16_inputs_and_outputs_are_served_natively() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    let mut c = config(dir.path(), file, Some(Precision::Fp16));
    c.inputs = vec![TensorSpec { name: "x".into(), datatype: DataType::Fp16, shape: vec![-1, 3], optional: false }];
    c.outputs = vec![TensorSpec { name: "y".into(), datatype: DataType::Fp16, shape: vec![-1, 2], optional: false }];
    let mut engine = CandleEngine::load(&c, Precision::Fp32, &[]).expect("loads");
    let x: Vec<half::f16> = ROWS[0].iter().map(|&v| half::f16::from_f64(v)).collect();
    let out = engine.run(&[Tensor::from_slice(vec![1, 3], &x).expect("valid")]).expect("runs");
    assert_eq!(out[0].dtype(), DataType::Fp16);
    let got: Vec<f64> = out[0].to_vec::<half::f16>().expect("fp16").iter().map(|v| v.to_f64()).collect();
    let want = reference(&ROWS[0]);
    assert!((got[0] - want[0]).abs() < 1e-2 && (got[1] - want[1]).abs() < 1e-2, "{got:?} vs {want:?}");
}

#[test]
fn bad_configurations_are_refused_with_the_field_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    type Edit = Box<dyn Fn(&mut ModelConfig)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|c| c.candle.as_mut().expect("candle").layers = vec![3]), "candle.layers"),
        (
            Box::new(|c| c.candle.as_mut().expect("candle").activations = vec!["relu".into()]),
            "candle.activations: one per",
        ),
        (Box::new(|c| c.candle.as_mut().expect("candle").activations[0] = "swish".into()), "candle.activations[0]"),
        (Box::new(|c| c.candle.as_mut().expect("candle").architecture = "bert".into()), "candle.architecture"),
        (Box::new(|c| c.candle.as_mut().expect("candle").layers = vec![4, 2, 2]), "cannot load the weights"),
        (Box::new(|c| c.file = c.dir.join("missing.safetensors")), "does not exist"),
        (
            Box::new(|c| {
                c.inputs =
                    vec![TensorSpec { name: "x".into(), datatype: DataType::Fp32, shape: vec![-1, 4], optional: false }]
            }),
            "input[0].shape",
        ),
        (
            Box::new(|c| {
                c.inputs = vec![TensorSpec {
                    name: "x".into(),
                    datatype: DataType::Int32,
                    shape: vec![-1, 3],
                    optional: false,
                }]
            }),
            "input[0].datatype",
        ),
    ];
    for (edit, expected) in cases {
        let mut c = config(dir.path(), file.clone(), None);
        edit(&mut c);
        let err = CandleEngine::load(&c, Precision::Fp32, &[]).expect_err("refused").to_string();
        assert!(err.contains(expected), "expected {expected:?} in {err:?}");
    }
}

/// A network wide enough for real matrix products: `WIDE` layers, relu then tanh, weights scaled by 1/√fan-in,
/// from a fixed-seed generator. Returns the weights file and the f64 reference outputs for `wide_inputs()`.
const WIDE: [usize; 4] = [256, 1024, 1024, 16];
const WIDE_ROWS: usize = 64;

fn lcg(state: &mut u64) -> f32 {
    *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn wide_inputs() -> Vec<f32> {
    let mut state = 7;
    (0..WIDE_ROWS * WIDE[0]).map(|_| lcg(&mut state)).collect()
}

fn write_wide(dir: &Path) -> (std::path::PathBuf, Vec<f64>) {
    let mut state = 42;
    let cpu = Device::Cpu;
    let mut weights = HashMap::new();
    let mut layers = Vec::new();
    for (i, io) in WIDE.windows(2).enumerate() {
        let (fan_in, fan_out) = (io[0], io[1]);
        let scale = 1.0 / (fan_in as f32).sqrt();
        let w: Vec<f32> = (0..fan_in * fan_out).map(|_| lcg(&mut state) * scale).collect();
        let b: Vec<f32> = (0..fan_out).map(|_| lcg(&mut state) * 0.1).collect();
        let tensor =
            |v: &[f32], shape: &[usize]| candle_core::Tensor::from_vec(v.to_vec(), shape, &cpu).expect("tensor");
        weights.insert(format!("fc{}.weight", i + 1), tensor(&w, &[fan_out, fan_in]));
        weights.insert(format!("fc{}.bias", i + 1), tensor(&b, &[fan_out]));
        layers.push((w, b, fan_in, fan_out));
    }
    let path = dir.join("wide.safetensors");
    candle_core::safetensors::save(&weights, &path).expect("save");
    let mut x: Vec<f64> = wide_inputs().into_iter().map(f64::from).collect();
    for (i, (w, b, fan_in, fan_out)) in layers.iter().enumerate() {
        let mut y = vec![0f64; WIDE_ROWS * fan_out];
        for r in 0..WIDE_ROWS {
            for o in 0..*fan_out {
                let dot: f64 = (0..*fan_in).map(|k| f64::from(w[o * fan_in + k]) * x[r * fan_in + k]).sum();
                let v = dot + f64::from(b[o]);
                y[r * fan_out + o] = match i {
                    0 => v.max(0.0),
                    1 => v.tanh(),
                    _ => v,
                };
            }
        }
        x = y;
    }
    (path, x)
}

/// The wide network on `device` in each precision agrees with the f64 reference: the largest error, relative to
/// the largest output, stays within what the precision's rounding allows.
fn wide_network_agrees_with_f64(device: DeviceSpec, expect_device: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, want) = write_wide(dir.path());
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    for (precision, tolerance) in [(Precision::Fp32, 1e-5), (Precision::Fp16, 1e-2), (Precision::Bf16, 5e-2)] {
        let mut c = config(dir.path(), file.clone(), Some(precision));
        c.device = device;
        let candle = c.candle.as_mut().expect("candle");
        candle.layers = WIDE.to_vec();
        candle.activations = vec!["relu".into(), "tanh".into(), "none".into()];
        let mut engine = CandleEngine::load(&c, Precision::Fp32, &[]).expect("loads");
        assert_eq!(engine.metadata().device, expect_device);
        let x = Tensor::from_slice(vec![WIDE_ROWS, WIDE[0]], &wide_inputs()).expect("valid");
        let got = engine.run(&[x]).expect("runs")[0].to_vec::<f32>().expect("fp32");
        let error = got.iter().zip(&want).fold(0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs())) / scale;
        eprintln!("wide network, {precision} on {expect_device}: largest error {error:.2e} of the largest output");
        assert!(error <= tolerance, "{precision} on {expect_device}: relative error {error:.2e} > {tolerance:.0e}");
    }
}

#[test]
fn a_wide_network_on_the_cpu_agrees_with_f64() {
    wide_network_agrees_with_f64(DeviceSpec::Cpu, "cpu");
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(not(feature = "cuda"))]
#[test]
fn a_gpu_is_refused_with_a_clear_message_in_a_cpu_build() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_weights(dir.path());
    let mut c = config(dir.path(), file, None);
    c.device = DeviceSpec::Cuda(0);
    let err = CandleEngine::load(&c, Precision::Fp32, &[]).expect_err("no CUDA here").to_string();
    assert!(err.contains("built without CUDA support"), "{err}");
}
