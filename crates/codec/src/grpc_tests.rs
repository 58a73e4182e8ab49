//! The gRPC codec: raw and typed inputs decode alike, the request's own mistakes are named, limits hold before
//! anything is decoded, and answers carry one raw entry per output.

use std::collections::HashMap;

use super::proto::model_infer_request::InferRequestedOutputTensor;
use super::*;
use crate::shm::NoRegions;
use crate::v2::tests::{chosen, meta, wanted};

fn input(name: &str, datatype: &str, shape: &[i64], contents: Option<InferTensorContents>) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        parameters: HashMap::new(),
        contents,
    }
}

/// A request for `meta()` with two rows, its inputs raw (as Triton's clients send them) or typed.
fn request(raw: bool) -> ModelInferRequest {
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let s: [&[u8]; 2] = [b"hello", b""];
    let mut request = ModelInferRequest { model_name: "m".into(), id: "r1".into(), ..Default::default() };
    if raw {
        request.inputs = vec![input("s", "BYTES", &[2, 1], None), input("x", "FP32", &[2, 2], None)];
        let mut strings = Vec::new();
        for e in s {
            strings.extend_from_slice(&(e.len() as u32).to_le_bytes());
            strings.extend_from_slice(e);
        }
        let floats: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        request.raw_input_contents = vec![strings.into(), floats.into()];
    } else {
        let strings =
            InferTensorContents { bytes_contents: s.iter().map(|e| e.to_vec()).collect(), ..Default::default() };
        let floats = InferTensorContents { fp32_contents: x.to_vec(), ..Default::default() };
        request.inputs = vec![input("s", "BYTES", &[2, 1], Some(strings)), input("x", "FP32", &[2, 2], Some(floats))];
    }
    request
}

fn error(request: ModelInferRequest) -> String {
    decode_infer(request, &meta(), &Limits::NONE, &NoRegions).expect_err("refused").to_string()
}

#[test]
fn raw_and_typed_inputs_decode_alike_in_the_models_order() {
    let raw = decode_infer(request(true), &meta(), &Limits::NONE, &NoRegions).expect("raw decodes");
    let typed = decode_infer(request(false), &meta(), &Limits::NONE, &NoRegions).expect("typed decodes");
    assert_eq!(raw.inputs, typed.inputs);
    assert_eq!(raw.inputs[0].as_ref().expect("given").to_vec::<f32>().expect("fp32"), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(raw.inputs[1].as_ref().expect("given").byte_strings().expect("bytes"), [b"hello".to_vec(), Vec::new()]);
    assert_eq!((raw.id.as_str(), chosen(&raw.outputs), raw.timeout), ("r1", vec![(0, true), (1, true)], None));
}

#[test]
fn the_requests_mistakes_are_named() {
    let mut r = request(true);
    r.raw_input_contents.pop();
    assert!(error(r).contains("2 inputs outside shared memory but 1 raw_input_contents"));
    let mut r = request(true);
    r.raw_input_contents[1].truncate(15);
    assert!(
        error(r).contains("input `x`: its raw contents are 15 bytes, but FP32 [2, 2] needs 16"),
        "{}",
        error(request(true))
    );
    let mut r = request(false);
    r.inputs[1].datatype = "FP64".into();
    assert!(error(r).contains("input `x`: the model takes FP32, got FP64"));
    let mut r = request(false);
    r.inputs[1].shape = vec![2, 3];
    assert!(error(r).contains("does not fit the model's"));
    let mut r = request(false);
    r.inputs[1].contents.as_mut().expect("typed").fp32_contents.pop();
    assert!(error(r).contains("fp32_contents holds 3 elements, but its shape needs 4"));
    let mut r = request(false);
    r.inputs.pop();
    assert!(error(r).contains("missing input `x`"));
    let mut r = request(false);
    r.inputs[0].name = "z".into();
    assert!(error(r).contains("unexpected input `z`: the model takes"));
    let mut r = request(true);
    r.inputs[0].contents = Some(InferTensorContents::default());
    assert!(error(r).contains("typed contents, and the request raw_input_contents too"));
    let mut r = request(false);
    r.inputs[0].contents = None;
    assert!(error(r).contains("no contents"));
    let mut r = request(false);
    r.outputs = vec![InferRequestedOutputTensor { name: "y".into(), parameters: HashMap::new() }; 2];
    assert!(error(r).contains("output `y` is asked for twice"));
    let mut r = request(false);
    r.parameters.insert(
        TIMEOUT_PARAMETER.into(),
        InferParameter { parameter_choice: Some(ParameterChoice::StringParam("soon".into())) },
    );
    assert!(error(r).contains("must be a non-negative integer"));
}

#[test]
fn typed_integers_must_fit_their_type_and_fp16_comes_raw() {
    let mut m = meta();
    m.inputs = vec![TensorSpec { name: "i".into(), datatype: DataType::Int8, shape: vec![-1], optional: false }];
    let ints = |v: Vec<i32>| InferTensorContents { int_contents: v, ..Default::default() };
    let r =
        ModelInferRequest { inputs: vec![input("i", "INT8", &[2], Some(ints(vec![1, 300])))], ..Default::default() };
    let e = decode_infer(r, &m, &Limits::NONE, &NoRegions).expect_err("300 is no INT8").to_string();
    assert!(e.contains("int_contents element 1 is out of its data type's range"), "{e}");
    m.inputs[0].datatype = DataType::Fp16;
    let r = ModelInferRequest { inputs: vec![input("i", "FP16", &[1], Some(ints(vec![1])))], ..Default::default() };
    let e = decode_infer(r, &m, &Limits::NONE, &NoRegions).expect_err("no typed FP16").to_string();
    assert!(e.contains("send it in raw_input_contents"), "{e}");
}

#[test]
fn limits_refuse_before_decoding_and_parameters_are_read() {
    let limits = Limits { max_elements: 5, ..Limits::NONE };
    let e = decode_infer(request(true), &meta(), &limits, &NoRegions).expect_err("6 elements of 5");
    assert!(matches!(e, CodecError::OverLimit(_)), "{e}");
    // A shape far larger than the bytes sent is refused by the limit, before anything is allocated for it.
    let mut r = request(true);
    r.inputs[1].shape = vec![1 << 40, 2];
    let e = decode_infer(r, &meta(), &Limits { max_rows: 64, ..Limits::NONE }, &NoRegions).expect_err("rows over");
    assert!(matches!(e, CodecError::OverLimit(_)), "{e}");
    let mut r = request(true);
    for (key, value) in [
        (TIMEOUT_PARAMETER, ParameterChoice::Uint64Param(1500)),
        ("priority", ParameterChoice::Uint64Param(1)),
        ("triton_enable_empty_final_response", ParameterChoice::BoolParam(true)),
    ] {
        r.parameters.insert(key.into(), InferParameter { parameter_choice: Some(value) });
    }
    r.outputs = vec![InferRequestedOutputTensor { name: "n".into(), parameters: HashMap::new() }];
    let call = decode_infer(r, &meta(), &Limits::NONE, &NoRegions).expect("decodes");
    assert_eq!((call.timeout, chosen(&call.outputs)), (Some(Duration::from_micros(1500)), vec![(1, true)]));
}

#[test]
fn answers_carry_one_raw_entry_per_selected_output() {
    let y = Tensor::from_slice(vec![1, 2], &[inferd_core::half::f16::from_f32(0.5); 2]).expect("y");
    let n = Tensor::from_slice(vec![1], &[7i64]).expect("n");
    let response =
        encode_infer("m", 3, "r1".into(), &meta(), &[y, n], &wanted(&[(1, true), (0, true)]), &[]).expect("encodes");
    assert_eq!((response.model_name.as_str(), response.model_version.as_str(), response.id.as_str()), ("m", "3", "r1"));
    let names: Vec<_> =
        response.outputs.iter().map(|o| (o.name.as_str(), o.datatype.as_str(), o.shape.clone())).collect();
    assert_eq!(names, [("n", "INT64", vec![1]), ("y", "FP16", vec![1, 2])]);
    assert_eq!(response.raw_output_contents[0][..], 7i64.to_le_bytes());
    assert_eq!(response.raw_output_contents[1].len(), 4);
    let e = encode_infer("m", 1, String::new(), &meta(), &[], &wanted(&[(0, true)]), &[]).expect_err("no outputs");
    assert!(matches!(e, CodecError::Encode(_)), "{e}");
}

#[test]
fn raw_contents_are_shared_not_copied() {
    // A request's raw contents become its tensors as they are: the tensor's bytes are the message's.
    let request = request(true);
    let sent = request.raw_input_contents[1].as_ptr();
    let call = decode_infer(request, &meta(), &Limits::NONE, &NoRegions).expect("decodes");
    let x = call.inputs[0].as_ref().and_then(Tensor::raw_bytes).expect("fp32");
    assert_eq!(x.as_ptr(), sent, "the input was copied out of the message");
    // An answer's entry for a fixed-size output is the tensor's own memory; a BYTES output's is its binary form.
    let y = Tensor::from_slice(vec![1, 2], &[inferd_core::half::f16::from_f32(0.5); 2]).expect("y");
    let n = Tensor::from_slice(vec![1], &[7i64]).expect("n");
    let (y_at, n_at) = (y.raw_bytes().expect("fixed").as_ptr(), n.raw_bytes().expect("fixed").as_ptr());
    let response =
        encode_infer("m", 1, String::new(), &meta(), &[y, n], &wanted(&[(0, true), (1, true)]), &[]).expect("encodes");
    let entries: Vec<_> = response.raw_output_contents.iter().map(|b| b.as_ptr()).collect();
    assert_eq!(entries, [y_at, n_at], "an output was copied into the answer");
}

#[test]
fn a_bytes_output_is_answered_in_its_binary_form() {
    let strings = Tensor::from_byte_strings(vec![2], vec![b"ab".to_vec(), Vec::new()]).expect("strings");
    let response =
        encode_infer("m", 1, String::new(), &meta(), &[strings], &wanted(&[(0, true)]), &[]).expect("encodes");
    assert_eq!(response.raw_output_contents[0][..], [2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
}
