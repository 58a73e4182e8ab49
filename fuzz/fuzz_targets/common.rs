//! What every decoder target decodes against: two models' inputs, and small limits, so that a run explores the
//! decoders rather than allocating.

use inferd_codec::Limits;
use inferd_core::{DataType, ModelMetadata, Precision, TensorSpec};

pub const LIMITS: Limits = Limits { max_elements: 4096, max_rows: 64, max_json_depth: 16 };

fn spec(name: &str, datatype: DataType, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), datatype, shape: shape.to_vec(), optional: false }
}

/// A tensor model of one FP32 input; one of BYTES, INT64, FP16 and BOOL inputs with variable dimensions (BOOL's
/// optional); and one without a batch dimension (`max_batch_size = 0`), whose inputs are a fixed shape and a scalar.
pub fn models() -> [ModelMetadata; 3] {
    let meta = |inputs, outputs| ModelMetadata {
        inputs,
        outputs,
        device: "cpu".into(),
        precision: Precision::Fp32,
        platform: "fuzz",
        text: None,
    };
    [
        meta(vec![spec("input", DataType::Fp32, &[-1, 4])], vec![spec("output", DataType::Fp32, &[-1, 2])]),
        meta(
            vec![
                spec("text", DataType::Bytes, &[-1]),
                spec("ids", DataType::Int64, &[-1, -1]),
                spec("half", DataType::Fp16, &[-1, 3]),
                TensorSpec { optional: true, ..spec("flag", DataType::Bool, &[-1, 1]) },
            ],
            vec![spec("y", DataType::Fp32, &[-1, 2])],
        ),
        meta(
            vec![spec("image", DataType::Fp32, &[2, 3]), spec("threshold", DataType::Fp32, &[])],
            vec![spec("score", DataType::Fp32, &[])],
        ),
    ]
}

/// What a successful decode must hold: one slot an input, each tensor fitting its own, every required input given,
/// within the limits.
pub fn check(tensors: &[Option<inferd_core::Tensor>], meta: &ModelMetadata) {
    assert_eq!(tensors.len(), meta.inputs.len());
    let mut elements = 0;
    for (t, spec) in tensors.iter().zip(&meta.inputs) {
        let Some(t) = t else {
            assert!(spec.optional, "required input `{}` left out", spec.name);
            continue;
        };
        assert!(
            spec.datatype == t.dtype() && spec.accepts(t.shape()),
            "input `{}` decoded as {:?} {:?}",
            spec.name,
            t.dtype(),
            t.shape()
        );
        assert!(t.rows() <= LIMITS.max_rows, "{} rows", t.rows());
        elements += t.element_count();
    }
    assert!(elements <= LIMITS.max_elements, "{elements} elements");
}
