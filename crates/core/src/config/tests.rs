//! `model.toml` read as written: defaults, every field, the errors that name file and field, versions and warm-up files.

use super::*;
use crate::dtype::DataType;

fn parse(text: &str) -> Result<ModelConfig> {
    ModelConfig::parse("m", Path::new("/models/m"), text)
}

#[test]
fn a_minimal_onnx_model_takes_the_defaults() {
    let c = parse("backend = \"onnx\"\nfile = \"model.onnx\"\n").expect("valid");
    assert_eq!((c.backend, c.device, c.memory.working_set), (Backend::Onnx, DeviceSpec::Auto, 0));
    assert_eq!(c.file, Path::new("/models/m/model.onnx"));
    assert_eq!(c.precision, None);
    assert_eq!(c.instances, 1);
    assert_eq!(c.batching, BatchingConfig::default());
    assert!(c.inputs.is_empty());
}

#[test]
fn every_field_is_read() {
    let c = parse(
        r#"
        backend = "candle"
        file = "w.safetensors"
        device = "cuda:1"
        precision = "bf16"
        instances = 2
        [batching]
        max_batch_size = 32
        max_queue_delay_us = 500
        preferred_batch_sizes = [8, 16]
        max_queue_size = 10
        timeout_ms = 250
        release_after_idle_ms = 30000
        run_inline_under_us = 20
        [candle]
        architecture = "mlp"
        layers = [4, 3]
        activations = ["none"]
        [[input]]
        name = "x"
        datatype = "FP16"
        shape = [-1, 4]
        [[output]]
        name = "y"
        datatype = "FP32"
        shape = [-1, 3]
        "#,
    )
    .expect("valid");
    assert_eq!(c.device, DeviceSpec::Cuda(1));
    assert_eq!(c.precision, Some(Precision::Bf16));
    assert_eq!(c.instances, 2);
    assert_eq!(c.batching.preferred_batch_sizes, vec![8, 16]);
    assert_eq!(c.batching.timeout_ms, 250);
    assert_eq!(c.batching.release_after_idle_ms, 30_000);
    assert_eq!(c.batching.run_inline_under_us, 20);
    assert_eq!(c.inputs[0].datatype, DataType::Fp16);
    assert_eq!(c.outputs[0].shape, vec![-1, 3]);
    assert_eq!(c.candle.as_ref().map(|c| c.layers.clone()), Some(vec![4, 3]));
}

fn error_of(text: &str) -> String {
    parse(text).expect_err("invalid").to_string()
}

#[test]
fn errors_name_the_file_and_the_field() {
    let base = "backend = \"onnx\"\nfile = \"m.onnx\"\n";
    let cases = [
        (format!("{base}device = \"gpu\""), "unknown device `gpu`"),
        (format!("{base}precision = \"fp8\""), "precision"),
        (format!("{base}instances = 0"), "instances: must be between 1"),
        (format!("{base}[batching]\nmax_batch_size = 70000"), "batching.max_batch_size"),
        ("backend = \"candle\"\ntask = \"embed\"\n[batching]\nmax_batch_size = 0".to_owned(), "0 is for tensor models"),
        (format!("{base}[warmup.inputs.x]\nshape = [1, 0]"), "warmup.inputs.x.shape"),
        (format!("{base}[warmup.inputs.x]\nshape = [65536, 65536]"), "warmup.inputs.x.shape"),
        (format!("{base}[warmup.inputs.x]\nshape = [1]\nsize = 3"), "unknown field `size`"),
        ("backend = \"candle\"\ntask = \"embed\"\n[warmup.inputs.x]\nshape = [1]".to_owned(), "only `skip`"),
        (format!("{base}[batching]\nmax_queue_size = 0"), "batching.max_queue_size"),
        (format!("{base}[batching]\npreferred_batch_sizes = [128]"), "batching.preferred_batch_sizes: 128"),
        (format!("{base}[batching]\nmax_batch_sise = 3"), "max_batch_sise"),
        (format!("{base}[batching]\nrun_inline_under_us = 1001"), "batching.run_inline_under_us: at most 1000"),
        (format!("{base}[[input]]\nname = \"x\"\ndatatype = \"FLOAT\"\nshape = [-1]"), "unknown datatype `FLOAT`"),
        (
            format!("{base}[[input]]\nname = \"x\"\ndatatype = \"FP32\"\nshape = [1, 4]"),
            "input[0].shape: must start with -1",
        ),
        (
            format!(
                "{base}[batching]\nmax_batch_size = 0\n[[input]]\nname = \"x\"\ndatatype = \"FP32\"\nshape = [1, -2]"
            ),
            "input[0].shape: -2",
        ),
        (format!("{base}[[input]]\nname = \"x\"\ndatatype = \"FP32\"\nshape = [-1, 0]"), "input[0].shape: 0"),
        (format!("{base}[candle]\narchitecture = \"mlp\""), "candle: only a candle model"),
        ("backend = \"candle\"\nfile = \"w\"".to_owned(), "needs a [candle] table"),
        ("backend = \"tf\"\nfile = \"w\"".to_owned(), "backend"),
        ("file = \"w\"".to_owned(), "missing field `backend`"),
    ];
    for (text, expected) in cases {
        let err = error_of(&text);
        assert!(err.starts_with("/models/m/model.toml: "), "{err}");
        assert!(err.contains(expected), "{text:?}: expected {expected:?} in {err:?}");
        assert!(!err.contains('\n'), "one line: {err:?}");
    }
}

#[test]
fn a_model_without_a_batch_dimension_declares_whole_shapes() {
    let c = parse(
        "backend = \"onnx\"\nfile = \"m.onnx\"\n[batching]\nmax_batch_size = 0\n\
         [[input]]\nname = \"images\"\ndatatype = \"FP32\"\nshape = [1, 3, -1, -1]\n",
    )
    .expect("valid");
    assert_eq!(c.batching.max_batch_size, 0);
    assert_eq!(c.inputs[0].shape, vec![1, 3, -1, -1]);
}

#[test]
fn warm_up_inputs_are_read_with_their_files_resolved() {
    let c = parse(
        "backend = \"onnx\"\nfile = \"m.onnx\"\n[warmup.inputs.images]\nshape = [1, 3, 64, 96]\n\
         file = \"warmup/images.bin\"\n[warmup.inputs.scale]\nshape = [1, 2]\n",
    )
    .expect("valid");
    assert!(!c.warmup.skip);
    assert_eq!(c.warmup.inputs["images"].shape, vec![1, 3, 64, 96]);
    assert_eq!(c.warmup.inputs["images"].file.as_deref(), Some(Path::new("/models/m/warmup/images.bin")));
    assert_eq!(c.warmup.inputs["scale"].file, None);
    assert!(parse("backend = \"onnx\"\nfile = \"m.onnx\"\n[warmup]\nskip = true\n").expect("valid").warmup.skip);
}

#[test]
fn load_reads_the_folder_and_names_the_model_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model_dir = dir.path().join("resnet-50");
    std::fs::create_dir(&model_dir).expect("mkdir");
    let err = ModelConfig::load(&model_dir).expect_err("no model.toml yet").to_string();
    assert!(err.contains("model.toml: cannot read"), "{err}");
    std::fs::write(model_dir.join(MODEL_CONFIG_FILE), "backend = \"onnx\"\nfile = \"model.onnx\"\n").expect("write");
    let c = ModelConfig::load(&model_dir).expect("valid");
    assert_eq!(c.name, "resnet-50");
    assert_eq!(c.file, model_dir.join("model.onnx"));
}
