//! The JSON codecs: `/predict` bodies, element types, ragged and over-limit tensors, and nested answers.

use inferd_core::half::{bf16, f16};
use inferd_core::{DataType, Tensor, TensorSpec};

use super::json::NestedJson;
use super::predict::decode_predict;
use super::*;

/// Every input of a body that must give each.
fn decode(body: &[u8], specs: &[TensorSpec]) -> Result<Vec<Tensor>, CodecError> {
    Ok(decode_predict(body, specs, &Limits::NONE)?.into_iter().map(|t| t.expect("every input is required")).collect())
}

fn spec(name: &str, datatype: DataType, shape: &[i64]) -> TensorSpec {
    TensorSpec { name: name.into(), datatype, shape: shape.to_vec(), optional: false }
}

fn digits() -> Vec<TensorSpec> {
    vec![spec("input", DataType::Fp32, &[-1, 3])]
}

#[test]
fn json_depth_counts_arrays_and_objects_but_not_brackets_in_strings() {
    assert!(check_json_depth(br#"{"input": [[1, 2]]}"#, 3).is_ok());
    let err = check_json_depth(br#"{"input": [[[1]]]}"#, 3).expect_err("four levels").to_string();
    assert!(err.contains("deeper than 3"), "{err}");
    assert!(check_json_depth(br#"{"id": "[[[[\"[[[", "x": []}"#, 2).is_ok());
    assert!(check_json_depth(&[b'['; 100_000], 32).is_err());
}

#[test]
fn a_single_input_decodes_into_fp32_rows() {
    let t = decode(br#"{"input": [[1, 2.5, 3], [4, 5, 6e0]]}"#, &digits()).expect("valid");
    assert_eq!(t[0].shape(), &[2, 3]);
    assert_eq!(t[0].to_vec::<f32>().expect("fp32"), vec![1.0, 2.5, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn named_inputs_land_in_the_models_order() {
    let specs = vec![spec("a", DataType::Int64, &[-1, 2]), spec("b", DataType::Bool, &[-1])];
    let t = decode(br#"{"inputs": {"b": [true, false], "a": [[1, -2], [3, 4]]}}"#, &specs).expect("valid");
    assert_eq!(t[0].to_vec::<i64>().expect("i64"), vec![1, -2, 3, 4]);
    assert_eq!(t[1].to_vec::<bool>().expect("bool"), vec![true, false]);
}

#[test]
fn fp16_and_bf16_inputs_take_json_numbers() {
    let t = decode(br#"{"input": [[0.5, -2, 1024]]}"#, &[spec("x", DataType::Fp16, &[-1, 3])]).expect("valid");
    let values: Vec<f32> = t[0].to_vec::<f16>().expect("fp16").iter().map(|v| v.to_f32()).collect();
    assert_eq!(values, vec![0.5, -2.0, 1024.0]);
    let t = decode(br#"{"input": [[0.5]]}"#, &[spec("x", DataType::Bf16, &[-1, 1])]).expect("valid");
    assert_eq!(t[0].to_vec::<bf16>().expect("bf16")[0].to_f32(), 0.5);
}

#[test]
fn a_scalar_input_is_one_element_without_an_array() {
    // A model without a batch dimension may take a scalar (shape []), such as a threshold beside an image.
    let specs = vec![spec("image", DataType::Fp32, &[2]), spec("threshold", DataType::Fp32, &[])];
    let t = decode(br#"{"inputs": {"image": [1, 2], "threshold": 0.25}}"#, &specs).expect("valid");
    assert_eq!(t[1].shape(), &[] as &[usize]);
    assert_eq!(t[1].to_vec::<f32>().expect("fp32"), vec![0.25]);
    let err = error(r#"{"inputs": {"image": [1, 2], "threshold": [0.5]}}"#, &specs);
    assert!(err.contains("threshold"), "{err}");
    let answer = serde_json::to_string(&NestedJson(&t[1])).expect("serializes");
    assert_eq!(answer, "0.25");
}

fn error(body: &str, specs: &[TensorSpec]) -> String {
    decode(body.as_bytes(), specs).expect_err("refused").to_string()
}

#[test]
fn bad_bodies_are_refused_with_what_was_wrong() {
    let d = digits();
    let cases = [
        (r#"{"input": [[1, 2]]}"#, "dimension 1 must have 3 elements"),
        (r#"{"input": [[1, 2, 3, 4]]}"#, "dimension 1 must have 3 elements"),
        (r#"{"input": [1, 2, 3]}"#, "nested array of 2 dimensions"),
        (r#"{"input": [[[1], [2], [3]]]}"#, "a number (an element of input `input`"),
        (r#"{"input": [[1, "2", 3]]}"#, "invalid type: string"),
        (r#"{"input": [[1, null, 3]]}"#, "invalid type: null"),
        (r#"{"input": [[1, true, 3]]}"#, "invalid type: boolean"),
        (r#"{"input": []}"#, "has no rows"),
        (r#"{"input": [[]]}"#, "dimension 1 is empty"),
        (r#"{"input": [[1, 2, 1e39]]}"#, "out of range for FP32"),
        (r#"{"inputs": {"image": [[1, 2, 3]]}}"#, "no input `image`"),
        (r#"{"input": [[1, 2, 3]], "input": [[1, 2, 3]]}"#, "given twice"),
        (r#"{"inputz": [[1, 2, 3]]}"#, "unknown field `inputz`"),
        (r#"{}"#, "missing input `input`"),
        (r#"[[1, 2, 3]]"#, "a JSON object with `input`"),
        (r#"{"input": [[1, 2, 3]]"#, "EOF"),
        (r#"{"input": [[1, 2, 3]]} trailing"#, "trailing characters"),
        ("", "EOF"),
    ];
    for (body, expected) in cases {
        let err = error(body, &d);
        assert!(err.contains(expected), "{body}: expected {expected:?} in {err:?}");
    }
}

#[test]
fn ragged_rows_are_refused_where_dimensions_vary() {
    let specs = [spec("x", DataType::Fp32, &[-1, -1])];
    assert!(error(r#"{"input": [[1, 2], [3]]}"#, &specs).contains("ragged"));
    assert!(error(r#"{"input": [[1], [2, 3]]}"#, &specs).contains("ragged"));
    assert_eq!(decode(br#"{"input": [[1, 2], [3, 4]]}"#, &specs).expect("valid")[0].shape(), &[2, 2]);
}

#[test]
fn integers_must_fit_their_type() {
    let specs = [spec("x", DataType::Uint8, &[-1])];
    assert!(error(r#"{"input": [256]}"#, &specs).contains("not a UINT8 value"));
    assert!(error(r#"{"input": [-1]}"#, &specs).contains("not a UINT8 value"));
    assert!(error(r#"{"input": [1.5]}"#, &specs).contains("not a UINT8 value"));
    assert_eq!(
        decode(br#"{"input": [255, 3.0]}"#, &specs).expect("valid")[0].to_vec::<u8>().expect("u8"),
        vec![255, 3]
    );
}

#[test]
fn several_inputs_must_be_named() {
    let specs = vec![spec("a", DataType::Fp32, &[-1]), spec("b", DataType::Fp32, &[-1])];
    assert!(error(r#"{"input": [1]}"#, &specs).contains("send them by name in `inputs`"));
}

#[test]
fn tensors_serialize_as_nested_arrays() {
    let t = Tensor::from_slice(vec![2, 2], &[0.5f32, 1.0, -2.0, 3.25]).expect("valid");
    assert_eq!(serde_json::to_string(&NestedJson(&t)).expect("json"), "[[0.5,1.0],[-2.0,3.25]]");
    let t = Tensor::from_slice(vec![1, 2], &[f16::from_f32(0.5), f16::from_f32(-1.0)]).expect("valid");
    assert_eq!(serde_json::to_string(&NestedJson(&t)).expect("json"), "[[0.5,-1.0]]");
    let t = Tensor::from_slice(vec![3], &[1i64, -2, 3]).expect("valid");
    assert_eq!(serde_json::to_string(&NestedJson(&t)).expect("json"), "[1,-2,3]");
    let t = Tensor::from_byte_strings(vec![1], vec![b"hi".to_vec()]).expect("valid");
    assert_eq!(serde_json::to_string(&NestedJson(&t)).expect("json"), r#"["hi"]"#);
}

#[test]
fn rows_and_elements_stop_the_decoding_where_the_limits_are_met() {
    let specs = digits();
    let limits = Limits { max_rows: 4, max_elements: 10, max_json_depth: 32 };
    let body = |rows: usize| format!(r#"{{"input": [{}]}}"#, vec!["[1, 2, 3]"; rows].join(", "));
    assert_eq!(
        decode_predict(body(3).as_bytes(), &specs, &limits).expect("9 elements")[0].as_ref().expect("given").shape(),
        &[3, 3]
    );
    // Over both limits: the rows are what the client hears of.
    let err = decode_predict(body(5).as_bytes(), &specs, &limits).expect_err("over");
    assert!(matches!(&err, CodecError::OverLimit(m) if m.contains("--max-rows")), "{err}");
    let err = decode_predict(body(4).as_bytes(), &specs, &limits).expect_err("over");
    assert_eq!(err, limits.elements_error(12));
    // Elements summed over the inputs.
    let two = vec![spec("a", DataType::Fp32, &[-1, 3]), spec("b", DataType::Fp32, &[-1, 3])];
    let body = r#"{"inputs": {"a": [[1, 2, 3], [4, 5, 6]], "b": [[1, 2, 3], [4, 5, 6]]}}"#;
    assert!(
        matches!(decode_predict(body.as_bytes(), &two, &limits), Err(CodecError::OverLimit(m)) if m.contains("12 tensor elements"))
    );
}

#[test]
fn a_huge_body_is_decoded_no_further_than_the_limits() {
    let specs = vec![spec("input", DataType::Fp32, &[-1, 64])];
    let row = format!("[{}]", vec!["0"; 64].join(","));
    let body = format!(r#"{{"input": [{}]}}"#, vec![row.as_str(); 250_000].join(","));
    let limits = Limits { max_rows: 4096, max_elements: 16 << 20, max_json_depth: 32 };
    let err = decode_predict(body.as_bytes(), &specs, &limits).expect_err("over the rows");
    assert!(matches!(&err, CodecError::OverLimit(m) if m.contains("more than 4096 rows")), "{err}");
    // The decoder stops at the end of row 4097: it never builds the 64 MB tensor the body describes. Where it
    // stopped shows in the error of a decoder run over the same text with serde_json's own position.
    let mut de = serde_json::Deserializer::from_str(&body[10..]);
    let mut tally = json::Tally::new(limits);
    let stopped =
        serde::de::DeserializeSeed::deserialize(json::TensorSeed { spec: &specs[0], tally: &mut tally }, &mut de)
            .expect_err("over the rows");
    assert!(stopped.column() <= 4097 * (row.len() + 1) + 1, "stopped at column {} of {}", stopped.column(), body.len());
}

/// A reader of `body`'s bytes, a few at a time, that counts how many were read.
struct Trickle {
    body: Vec<u8>,
    read: std::rc::Rc<std::cell::Cell<usize>>,
}

impl std::io::Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(1000).min(self.body.len() - self.read.get());
        let at = self.read.get();
        buf[..n].copy_from_slice(&self.body[at..at + n]);
        self.read.set(at + n);
        Ok(n)
    }
}

#[test]
fn a_body_read_as_it_arrives_decodes_as_a_whole_one_and_stops_at_the_limits() {
    let trickle = |body: &str| {
        let read = std::rc::Rc::new(std::cell::Cell::new(0));
        (Trickle { body: body.as_bytes().to_vec(), read: read.clone() }, read)
    };
    let specs = digits();
    let limits = Limits { max_rows: 4096, max_elements: 16 << 20, max_json_depth: 4 };
    let body = r#"{"input": [[1, 2.5, 3], [4, 5, 6e-1]]}"#;
    let (reader, read) = trickle(body);
    let streamed = super::predict::decode_predict_from(reader, &specs, &limits).expect("decodes");
    assert_eq!(streamed, decode_predict(body.as_bytes(), &specs, &limits).expect("decodes"));
    assert_eq!(read.get(), body.len());
    // Rows past the limit: the reading stops within a buffer of row 4097.
    let row = format!("[{}]", ["0"; 3].join(","));
    let huge = format!(r#"{{"input": [{}]}}"#, vec![row.as_str(); 100_000].join(","));
    let (reader, read) = trickle(&huge);
    let err = super::predict::decode_predict_from(reader, &specs, &limits).expect_err("over the rows");
    assert!(matches!(&err, CodecError::OverLimit(m) if m.contains("more than 4096 rows")), "{err}");
    assert!(read.get() < 4097 * (row.len() + 1) + 16 * 1024, "read {} of {}", read.get(), huge.len());
    // Nesting past the limit, and bytes after the JSON, as a whole body hears them.
    for bad in [r#"{"input": [[[[[1]]]]]}"#, r#"{"input": [[1, 2, 3]]} x"#, r#"{"input": [[1, 2, 3]"#] {
        let (reader, _) = trickle(bad);
        let streamed = super::predict::decode_predict_from(reader, &specs, &limits).expect_err("refused");
        let whole = decode_predict(bad.as_bytes(), &specs, &limits).expect_err("refused");
        assert_eq!(std::mem::discriminant(&streamed), std::mem::discriminant(&whole), "{streamed} / {whole}");
    }
    let (reader, _) = trickle(r#"{"input": [[[[[1]]]]]}"#);
    let err = super::predict::decode_predict_from(reader, &specs, &limits).expect_err("too deep");
    assert!(err.to_string().contains("--max-json-depth"), "{err}");
}

#[test]
fn long_names_are_cut_in_messages() {
    let name = "n".repeat(5000);
    let err = error(&format!(r#"{{"inputs": {{"{name}": [[1, 2, 3]]}}}}"#), &digits());
    assert!(err.contains(&format!("no input `{}…`", "n".repeat(64))) && err.len() < 300, "{err:.300}");
    let err = error(&format!(r#"{{"{name}": 1}}"#), &digits());
    assert!(err.len() < 300, "{err:.300}");
}
