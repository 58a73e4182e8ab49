//! The v2 codec's edge cases: header lengths, binary sizes that disagree with shapes, output choices, limits,
//! and round trips.

use bytes::Bytes;
use inferd_core::half::f16;
use inferd_core::Precision;
use serde_json::json;

use super::*;
use crate::shm::NoRegions;

/// A model of an FP32 and a BYTES input, and an FP16 and an INT64 output: the gRPC codec's tests use it too.
pub(crate) fn meta() -> ModelMetadata {
    let spec = |name: &str, datatype, shape: &[i64]| TensorSpec {
        name: name.into(),
        datatype,
        shape: shape.to_vec(),
        optional: false,
    };
    ModelMetadata {
        inputs: vec![spec("x", DataType::Fp32, &[-1, 2]), spec("s", DataType::Bytes, &[-1, 1])],
        outputs: vec![spec("y", DataType::Fp16, &[-1, 2]), spec("n", DataType::Int64, &[-1])],
        device: "cpu".into(),
        precision: Precision::Fp32,
        platform: "test",
        text: None,
    }
}

/// A body of `json` followed by `binary`, and its header length.
fn body(json: &serde_json::Value, binary: &[u8]) -> (Bytes, usize) {
    let mut b = json.to_string().into_bytes();
    let len = b.len();
    b.extend_from_slice(binary);
    (b.into(), len)
}

fn fp32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn bytes_element(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

fn request(x_binary: Option<usize>, s_binary: Option<usize>) -> serde_json::Value {
    let x = match x_binary {
        Some(n) => json!({ "name": "x", "shape": [2, 2], "datatype": "FP32", "parameters": { "binary_data_size": n } }),
        None => json!({ "name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]] }),
    };
    let s = match s_binary {
        Some(n) => {
            json!({ "name": "s", "shape": [2, 1], "datatype": "BYTES", "parameters": { "binary_data_size": n } })
        }
        None => json!({ "name": "s", "shape": [2, 1], "datatype": "BYTES", "data": ["a", "bc"] }),
    };
    json!({ "id": "r1", "inputs": [x, s] })
}

#[test]
fn json_and_binary_inputs_decode_alike() {
    let (json_only, _) = body(&request(None, None), &[]);
    let from_json = decode_infer(&json_only, None, &meta(), &Limits::NONE, &NoRegions).expect("valid");
    let mut blobs = fp32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let strings: Vec<u8> = [bytes_element(b"a"), bytes_element(b"bc")].concat();
    let (mixed, len) = body(&request(Some(16), Some(strings.len())), &[blobs.clone(), strings.clone()].concat());
    let from_binary = decode_infer(&mixed, Some(len), &meta(), &Limits::NONE, &NoRegions).expect("valid");
    assert_eq!(from_json.inputs, from_binary.inputs);
    assert_eq!(from_json.id.as_deref(), Some("r1"));
    assert_eq!(from_json.inputs[0].as_ref().expect("given").to_vec::<f32>().expect("fp32"), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(chosen(&from_json.outputs), vec![(0, false), (1, false)]);
    // Binary in JSON order even when that differs from the model's order.
    blobs.clear();
    let reordered = json!({ "inputs": [request(None, Some(strings.len()))["inputs"][1].clone(), request(Some(16), None)["inputs"][0].clone()] });
    let (b, len) = body(&reordered, &[strings, fp32_bytes(&[1.0, 2.0, 3.0, 4.0])].concat());
    assert_eq!(
        decode_infer(&b, Some(len), &meta(), &Limits::NONE, &NoRegions).expect("valid").inputs,
        from_json.inputs
    );
}

#[test]
fn a_binary_input_is_a_slice_of_the_body_where_it_is_aligned() {
    let strings: Vec<u8> = [bytes_element(b"a"), bytes_element(b"bc")].concat();
    let binary = [fp32_bytes(&[1.0, 2.0, 3.0, 4.0]), strings].concat();
    let (json, _) = body(&request(Some(16), Some(binary.len() - 16)), &[]);
    let mut shared = 0;
    // JSON of four lengths in a row, so that the FP32 elements after it fall at each offset mod 4.
    for pad in 0..4 {
        let b = Bytes::from([&json[..], &vec![b' '; pad], &binary].concat());
        let len = json.len() + pad;
        let call = decode_infer(&b, Some(len), &meta(), &Limits::NONE, &NoRegions).expect("valid");
        let x = call.inputs[0].as_ref().expect("given");
        assert_eq!(x.to_vec::<f32>().expect("fp32"), [1.0, 2.0, 3.0, 4.0]);
        let at = x.raw_bytes().expect("fixed").as_ptr();
        assert_eq!(at.align_offset(4), 0, "an input left unaligned for its engine");
        shared += usize::from(at == b[len..].as_ptr());
        assert_eq!(call.inputs[1].as_ref().and_then(Tensor::byte_strings).map(<[Vec<u8>]>::len), Some(2));
    }
    assert_eq!(shared, 1, "the one aligned body was copied, or an unaligned one shared");
}

fn error(body: &[u8], header: Option<usize>) -> String {
    decode_infer(&Bytes::copy_from_slice(body), header, &meta(), &Limits::NONE, &NoRegions)
        .expect_err("refused")
        .to_string()
}

#[test]
fn header_lengths_out_of_range_are_refused() {
    let (b, len) = body(&request(None, None), &[]);
    assert!(error(&b, Some(b.len() + 1)).contains("body holds only"));
    assert!(error(&b, Some(0)).contains("invalid inference request JSON"));
    assert!(error(&b, Some(len - 1)).contains("invalid inference request JSON"));
}

#[test]
fn binary_sizes_that_disagree_with_shapes_are_refused() {
    let strings: Vec<u8> = [bytes_element(b"a"), bytes_element(b"bc")].concat();
    let cases: Vec<(serde_json::Value, Vec<u8>, &str)> = vec![
        // 12 bytes for a 2x2 FP32 tensor.
        (request(Some(12), None), fp32_bytes(&[1.0, 2.0, 3.0]), "needs 16 bytes"),
        // A size larger than what is left.
        (request(Some(64), None), fp32_bytes(&[1.0, 2.0, 3.0, 4.0]), "only 16 bytes of binary data are left"),
        // Bytes left over.
        (request(Some(16), None), fp32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0]), "4 bytes of binary data follow"),
        // A BYTES element whose length runs past its data.
        (request(None, Some(10)), [bytes_element(b"a"), vec![9, 0, 0, 0, b'x']].concat(), "runs past"),
        // A length prefix cut short.
        (request(None, Some(7)), [bytes_element(b"a"), vec![9, 0]].concat(), "and a partial one"),
        // One BYTES element for a shape of two.
        (request(None, Some(5)), bytes_element(b"a"), "holds 1 BYTES elements"),
        // Three BYTES elements for a shape of two.
        (request(None, Some(strings.len() + 5)), [strings.clone(), bytes_element(b"d")].concat(), "needs 2"),
    ];
    for (json, binary, expected) in cases {
        let (b, len) = body(&json, &binary);
        let err = error(&b, Some(len));
        assert!(err.contains(expected), "expected {expected:?} in {err:?}");
    }
}

#[test]
fn an_optional_input_may_be_left_out_and_a_required_one_may_not() {
    let mut m = meta();
    m.inputs[1].optional = true;
    let without_s = json!({ "inputs": [request(None, None)["inputs"][0].clone()] }).to_string();
    let call = decode_infer(&Bytes::from(without_s), None, &m, &Limits::NONE, &NoRegions).expect("`s` is optional");
    assert!(call.inputs[0].is_some() && call.inputs[1].is_none(), "{:?}", call.inputs);
    let without_x = json!({ "inputs": [request(None, None)["inputs"][1].clone()] }).to_string();
    let err = decode_infer(&Bytes::from(without_x), None, &m, &Limits::NONE, &NoRegions).expect_err("`x` is required");
    assert!(err.to_string().contains("missing input `x`"), "{err}");
}

#[test]
fn shapes_datatypes_and_names_are_checked() {
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut r = request(None, None);
        edit(&mut r);
        error(r.to_string().as_bytes(), None)
    };
    assert!(with(&|r| r["inputs"][0]["shape"] = json!([2, 3])).contains("does not fit the model's [-1, 2]"));
    assert!(with(&|r| r["inputs"][0]["shape"] = json!([-2, 2])).contains("negative dimension"));
    assert!(with(&|r| r["inputs"][0]["shape"] = json!([3, 2])).contains("holds 4 elements, but shape [3, 2] needs 6"));
    assert!(with(&|r| r["inputs"][0]["shape"] = json!([1, 2])).contains("more elements than its shape holds"));
    assert!(with(&|r| r["inputs"][0]["datatype"] = json!("INT32")).contains("the model takes FP32, got INT32"));
    assert!(with(&|r| r["inputs"][0]["datatype"] = json!("FLOAT")).contains("unknown datatype"));
    assert!(with(&|r| r["inputs"][0]["name"] = json!("z")).contains("unexpected input `z`"));
    assert!(with(&|r| r["inputs"][1] = r["inputs"][0].clone()).contains("given twice"));
    assert!(with(&|r| r["inputs"] = json!([r["inputs"][0].clone()])).contains("missing input `s`"));
    assert!(with(&|r| r["inputs"][0]["data"] = json!(null)).contains("neither"));
    assert!(with(&|r| r["outputs"] = json!([{ "name": "q" }])).contains("unexpected output `q`"));
    assert!(with(&|r| r["outputs"] = json!([{ "name": "y", "parameters": { "classification": 0 } }]))
        .contains("`classification` must be 1 or more"));
    assert!(with(&|r| r["parameters"] = json!({ "timeout": "soon" })).contains("invalid inference request JSON"));
}

#[test]
fn a_claimed_shape_far_larger_than_the_body_allocates_nothing_for_it() {
    let r = json!({ "inputs": [
        { "name": "x", "shape": [1_000_000_000_000u64, 2], "datatype": "FP32", "parameters": { "binary_data_size": 8 } },
        { "name": "s", "shape": [1, 1], "datatype": "BYTES", "data": ["a"] },
    ]});
    let (b, len) = body(&r, &fp32_bytes(&[1.0, 2.0]));
    assert!(error(&b, Some(len)).contains("needs 8000000000000 bytes"));
    let r = json!({ "inputs": [
        { "name": "x", "shape": [4_611_686_018_427_387_904u64, 4], "datatype": "FP32", "data": [1, 2] },
        { "name": "s", "shape": [1, 1], "datatype": "BYTES", "data": ["a"] },
    ]});
    assert!(error(r.to_string().as_bytes(), None).contains("does not fit"));
}

#[test]
fn json_numbers_are_converted_for_float_inputs_and_timeouts_read() {
    let mut r = request(None, None);
    r["inputs"][0]["datatype"] = json!("FP64");
    r["parameters"] = json!({ "timeout": 2500, "priority": 1, "binary_data_output": true });
    r["outputs"] = json!([{ "name": "n" }, { "name": "y", "parameters": { "binary_data": false } }]);
    let d = decode_infer(&Bytes::from(r.to_string()), None, &meta(), &Limits::NONE, &NoRegions).expect("valid");
    assert_eq!(d.inputs[0].as_ref().expect("given").dtype(), DataType::Fp32);
    assert_eq!(d.timeout, Some(Duration::from_micros(2500)));
    assert_eq!(chosen(&d.outputs), vec![(1, true), (0, false)]);
}

#[test]
fn answers_put_binary_outputs_after_the_json() {
    let y = Tensor::from_slice(vec![1, 2], &[f16::from_f32(0.5), f16::from_f32(-2.0)]).expect("valid");
    let n = Tensor::from_slice(vec![1], &[7i64]).expect("valid");
    let (body, len) =
        encode_infer("m", 1, Some("r1"), &meta(), &[y, n], &wanted(&[(1, false), (0, true)]), &[]).expect("encodes");
    let len = len.expect("a binary output follows");
    let json: serde_json::Value = serde_json::from_slice(&body[..len]).expect("JSON");
    assert_eq!(json["model_name"], "m");
    assert_eq!(json["model_version"], "1");
    assert_eq!(json["id"], "r1");
    assert_eq!(json["outputs"][0], json!({ "name": "n", "datatype": "INT64", "shape": [1], "data": [7] }));
    assert_eq!(
        json["outputs"][1],
        json!({ "name": "y", "datatype": "FP16", "shape": [1, 2], "parameters": { "binary_data_size": 4 } })
    );
    assert_eq!(&body[len..], &[0x00, 0x38, 0x00, 0xc0]);
    let (body, len) = encode_infer(
        "m",
        1,
        None,
        &meta(),
        &[
            Tensor::from_slice(vec![1, 2], &[f16::from_f32(0.5), f16::from_f32(-2.0)]).expect("valid"),
            Tensor::from_slice(vec![1], &[7i64]).expect("valid"),
        ],
        &wanted(&[(0, false)]),
        &[],
    )
    .expect("encodes");
    assert_eq!(len, None);
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(json["outputs"][0]["data"], json!([0.5, -2.0]));
    assert!(json.get("id").is_none());
}

#[test]
fn outputs_asked_twice_or_unknown_are_refused_and_long_names_are_cut() {
    let with_outputs = |outputs: serde_json::Value| {
        let mut r = request(None, None);
        r["outputs"] = outputs;
        decode_infer(&Bytes::from(r.to_string()), None, &meta(), &Limits::NONE, &NoRegions)
    };
    let twice = with_outputs(json!([{ "name": "y" }, { "name": "n" }, { "name": "y" }])).expect_err("twice");
    assert_eq!(twice, CodecError::Invalid("output `y` is asked for twice".into()));
    let many: Vec<serde_json::Value> = (0..100_000).map(|_| json!({ "name": "n" })).collect();
    assert!(matches!(with_outputs(json!(many)), Err(CodecError::Invalid(m)) if m.contains("asked for twice")));
    let long = "q".repeat(10_000);
    let unknown = with_outputs(json!([{ "name": long }])).expect_err("unknown").to_string();
    assert!(unknown.starts_with(&format!("unexpected output `{}…`", "q".repeat(64))), "{unknown:.200}");
    assert!(unknown.len() < 200, "{} characters", unknown.len());
    let chosen_outputs = with_outputs(json!([{ "name": "n" }, { "name": "y", "parameters": { "binary_data": true } }]));
    assert_eq!(chosen(&chosen_outputs.expect("valid").outputs), vec![(1, false), (0, true)]);
}

#[test]
fn rows_and_elements_over_the_limits_are_refused_before_decoding() {
    let limits = Limits { max_rows: 2, max_elements: 5, max_json_depth: 32 };
    let r = request(None, None);
    // x holds 4 elements and s 2: 6 in all.
    let err = decode_infer(&Bytes::from(r.to_string()), None, &meta(), &limits, &NoRegions).expect_err("over");
    assert!(
        matches!(&err, CodecError::OverLimit(m) if m.contains("--max-elements") && m.contains("input `s`")),
        "{err}"
    );
    let limits = Limits { max_elements: 6, ..limits };
    assert!(decode_infer(&Bytes::from(r.to_string()), None, &meta(), &limits, &NoRegions).is_ok());
    // A claimed shape over the row limit is refused before its (absent) data is looked at.
    let mut r = request(Some(1 << 40), None);
    r["inputs"][0]["shape"] = json!([3, 2]);
    let err = decode_infer(&Bytes::from(r.to_string()), None, &meta(), &limits, &NoRegions).expect_err("over");
    assert!(matches!(&err, CodecError::OverLimit(m) if m.contains("--max-rows")), "{err}");
    let deep = json!({ "inputs": [], "parameters": { "a": [[[[[1]]]]] } });
    let limits = Limits { max_json_depth: 4, ..limits };
    let err = decode_infer(&Bytes::from(deep.to_string()), None, &meta(), &limits, &NoRegions).expect_err("deep");
    assert!(matches!(&err, CodecError::Invalid(m) if m.contains("--max-json-depth")), "{err}");
}

/// The outputs a request chose: (index, in binary?) each.
pub(crate) fn chosen(outputs: &[Wanted]) -> Vec<(usize, bool)> {
    outputs.iter().map(|w| (w.index, w.binary)).collect()
}

/// Outputs to answer with, none in shared memory: (index, in binary?) each.
pub(crate) fn wanted(outputs: &[(usize, bool)]) -> Vec<Wanted> {
    outputs.iter().map(|&(index, binary)| Wanted { index, binary, memory: None, finite: false }).collect()
}
