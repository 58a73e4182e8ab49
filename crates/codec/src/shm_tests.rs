//! Tensors in shared memory, over both codecs: read from and written to the span named, every span checked
//! against its region, and the parameters' own mistakes named.

use std::collections::HashMap;

use bytes::Bytes;
use inferd_core::half::f16;
use inferd_core::Tensor;
use serde_json::json;

use super::*;
use crate::grpc::proto::infer_parameter::ParameterChoice;
use crate::grpc::proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::grpc::proto::{InferParameter, ModelInferRequest};
use crate::v2::tests::meta;
use crate::{grpc, v2, Limits};

/// Regions `in` (x's 8 bytes at offset 4, after 4 bytes of padding) and `out` (16 bytes of zeros).
fn regions() -> (MemoryRegions, Arc<MemoryRegion>) {
    let mut input = vec![0xEE; 4];
    input.extend([1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()));
    let out = MemoryRegion::new(vec![0; 16]);
    (MemoryRegions(vec![("in".into(), MemoryRegion::new(input)), ("out".into(), out.clone())]), out)
}

fn v2_request(x_parameters: serde_json::Value, y_parameters: serde_json::Value) -> Bytes {
    json!({
        "inputs": [
            { "name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": x_parameters },
            { "name": "s", "datatype": "BYTES", "shape": [1, 1], "data": ["a"] },
        ],
        "outputs": [{ "name": "y", "parameters": y_parameters }, { "name": "n" }],
    })
    .to_string()
    .into()
}

fn v2_error(x_parameters: serde_json::Value, y_parameters: serde_json::Value) -> String {
    let (regions, _) = regions();
    let body = v2_request(x_parameters, y_parameters);
    v2::decode_infer(&body, None, &meta(), &Limits::NONE, &regions).expect_err("refused").to_string()
}

fn answer() -> [Tensor; 2] {
    [
        Tensor::from_slice(vec![1, 2], &[f16::from_f32(0.5), f16::from_f32(-2.0)]).expect("valid"),
        Tensor::from_slice(vec![1], &[7i64]).expect("valid"),
    ]
}

#[test]
fn v2_reads_an_input_from_its_span_and_writes_an_output_to_its_own() {
    let (regions, out) = regions();
    let x = json!({ "shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": 4 });
    let y = json!({ "shared_memory_region": "out", "shared_memory_byte_size": 6, "shared_memory_offset": 2 });
    let call = v2::decode_infer(&v2_request(x, y), None, &meta(), &Limits::NONE, &regions).expect("decodes");
    let x = call.inputs[0].as_ref().expect("x");
    assert_eq!(x.raw_bytes().expect("FP32"), [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    let (body, json_len) = v2::encode_infer("m", 1, None, &meta(), &answer(), &call.outputs, &call.input_memory)
        .expect("the answer fits its span");
    assert_eq!(json_len, None, "nothing follows the JSON");
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(json["outputs"][0], json!({ "name": "y", "datatype": "FP16", "shape": [1, 2] }));
    assert_eq!(json["outputs"][1]["data"], json!([7]));
    assert_eq!(out.bytes(), [0, 0, 0x00, 0x38, 0x00, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn v2_names_each_mistake_in_the_parameters() {
    let none = json!({});
    let cases = [
        (json!({ "shared_memory_region": "nope", "shared_memory_byte_size": 8 }), "region `nope` is not registered"),
        (json!({ "shared_memory_region": "in" }), "shared_memory_region needs shared_memory_byte_size"),
        (json!({ "shared_memory_byte_size": 8 }), "need shared_memory_region"),
        (json!({ "shared_memory_offset": 4 }), "need shared_memory_region"),
        (
            json!({ "shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": 8 }),
            "bytes 8 to 16 run past the end of shared memory region `in`, which holds 12 bytes",
        ),
        (
            json!({ "shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": u64::MAX }),
            "run past the end",
        ),
        (json!({ "shared_memory_region": "in", "shared_memory_byte_size": 4 }), "is 4 bytes, but FP32 [1, 2] needs 8"),
        (
            json!({ "shared_memory_region": "in", "shared_memory_byte_size": 8, "binary_data_size": 8 }),
            "in shared memory, and has `data` or binary_data_size too",
        ),
    ];
    for (x, expected) in cases {
        let e = v2_error(x.clone(), none.clone());
        assert!(e.contains(expected), "{x}: {e}");
        assert!(e.starts_with("input `x`: "), "{x}: {e}");
    }
    let x = json!({ "shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": 4 });
    let e = v2_error(x, json!({ "shared_memory_region": "gone", "shared_memory_byte_size": 4 }));
    assert!(e.contains("output `y`: shared memory region `gone` is not registered"), "{e}");
}

#[test]
fn an_output_larger_than_its_span_is_the_clients_error() {
    let (regions, out) = regions();
    let y = json!({ "shared_memory_region": "out", "shared_memory_byte_size": 3 });
    let body =
        v2_request(json!({ "shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": 4 }), y);
    let call = v2::decode_infer(&body, None, &meta(), &Limits::NONE, &regions).expect("decodes");
    let e = v2::encode_infer("m", 1, None, &meta(), &answer(), &call.outputs, &call.input_memory)
        .expect_err("4 bytes in 3");
    assert!(matches!(&e, crate::CodecError::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("output `y`: it needs 4 bytes, but its span of shared memory region `out`"), "{e}");
    assert_eq!(out.bytes(), vec![0; 16], "nothing written");
}

fn parameter(choice: ParameterChoice) -> InferParameter {
    InferParameter { parameter_choice: Some(choice) }
}

fn span(region: &str, size: i64, offset: i64) -> HashMap<String, InferParameter> {
    HashMap::from([
        (REGION_PARAMETER.to_owned(), parameter(ParameterChoice::StringParam(region.into()))),
        (BYTE_SIZE_PARAMETER.to_owned(), parameter(ParameterChoice::Int64Param(size))),
        (OFFSET_PARAMETER.to_owned(), parameter(ParameterChoice::Int64Param(offset))),
    ])
}

/// A gRPC request with `x` in region `in` and `s` raw, as tritonclient sends them: raw contents for the inputs
/// outside shared memory only.
fn grpc_request(x_span: HashMap<String, InferParameter>) -> ModelInferRequest {
    let input = |name: &str, datatype: &str, parameters| InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: vec![1, if name == "x" { 2 } else { 1 }],
        parameters,
        contents: None,
    };
    ModelInferRequest {
        model_name: "m".into(),
        inputs: vec![input("x", "FP32", x_span), input("s", "BYTES", HashMap::new())],
        outputs: vec![InferRequestedOutputTensor { name: "y".into(), parameters: span("out", 16, 0) }],
        raw_input_contents: vec![[1u32.to_le_bytes().as_slice(), b"a"].concat().into()],
        ..Default::default()
    }
}

#[test]
fn grpc_takes_raw_contents_for_the_inputs_outside_shared_memory_only() {
    let (regions, out) = regions();
    let call = grpc::decode_infer(grpc_request(span("in", 8, 4)), &meta(), &Limits::NONE, &regions).expect("decodes");
    assert_eq!(call.inputs[0].as_ref().and_then(Tensor::raw_bytes).map(<[u8]>::len), Some(8));
    assert_eq!(call.inputs[1].as_ref().and_then(Tensor::byte_strings).map(|s| s[0].clone()), Some(b"a".to_vec()));
    let response = grpc::encode_infer("m", 1, String::new(), &meta(), &answer(), &call.outputs, &call.input_memory)
        .expect("encodes");
    assert!(response.outputs[0].parameters.is_empty(), "{:?}", response.outputs[0]);
    assert_eq!(response.raw_output_contents, vec![bytes::Bytes::new()], "an empty entry keeps the places");
    assert_eq!(&out.bytes()[..4], [0x00, 0x38, 0x00, 0xc0]);

    let mut two_raw = grpc_request(span("in", 8, 4));
    two_raw.raw_input_contents.push(vec![0; 8].into());
    let e = grpc::decode_infer(two_raw, &meta(), &Limits::NONE, &regions).expect_err("2 raw for 1").to_string();
    assert!(e.contains("1 inputs outside shared memory but 2 raw_input_contents"), "{e}");
    let e = grpc::decode_infer(grpc_request(span("in", 8, -1)), &meta(), &Limits::NONE, &regions)
        .expect_err("a negative offset")
        .to_string();
    assert!(e.contains("input `x`: parameter `shared_memory_offset` must be a non-negative integer"), "{e}");
    let e = grpc::decode_infer(grpc_request(span("in", 12, 4)), &meta(), &Limits::NONE, &regions)
        .expect_err("past the end")
        .to_string();
    assert!(e.contains("bytes 4 to 16 run past the end of shared memory region `in`"), "{e}");
}

/// A region that can be made to lose its memory, as a mapped object that shrank does.
struct Lossy(Arc<MemoryRegion>, std::sync::atomic::AtomicBool);

impl Region for Lossy {
    fn byte_size(&self) -> usize {
        self.0.byte_size()
    }

    fn read(self: Arc<Self>, offset: usize, len: usize) -> std::io::Result<bytes::Bytes> {
        self.0.clone().read(offset, len)
    }

    fn write(&self, offset: usize, bytes: &[u8]) -> std::io::Result<()> {
        self.0.write(offset, bytes)
    }

    fn intact(&self) -> bool {
        !self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Regions `in` and `out` as [`regions`] makes them, each able to lose its memory.
struct LossyRegions(Vec<(&'static str, Arc<Lossy>)>);

impl Regions for LossyRegions {
    fn region(&self, name: &str) -> Option<Arc<dyn Region>> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, r)| r.clone() as Arc<dyn Region>)
    }
}

#[test]
fn a_region_that_lost_its_memory_fails_the_requests_that_use_it() {
    let (MemoryRegions(made), _) = regions();
    let lossy = |i: usize| Arc::new(Lossy(made[i].1.clone(), false.into()));
    let regions = LossyRegions(vec![("in", lossy(0)), ("out", lossy(1))]);
    let lose = |i: usize| regions.0[i].1 .1.store(true, std::sync::atomic::Ordering::Relaxed);
    let x = json!({ "shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": 4 });
    let y = json!({ "shared_memory_region": "out", "shared_memory_byte_size": 4 });
    let body = v2_request(x, y);
    let call = v2::decode_infer(&body, None, &meta(), &Limits::NONE, &regions).expect("decodes");
    let encode =
        |call: &v2::V2Call| v2::encode_infer("m", 1, None, &meta(), &answer(), &call.outputs, &call.input_memory);
    encode(&call).expect("both regions whole");
    // The input's region loses its memory while the request runs: what the engine read may not have been the
    // client's, so the answer is refused; and so is the next request that reads from it.
    lose(0);
    let e = encode(&call).expect_err("refused").to_string();
    assert!(e.contains("an input's shared memory region `in` lost its memory"), "{e}");
    let e = v2::decode_infer(&body, None, &meta(), &Limits::NONE, &regions).expect_err("refused").to_string();
    assert!(e.contains("input `x`: shared memory region `in` lost its memory"), "{e}");
    // An output's region that lost its memory fails the write, scanned or not.
    regions.0[0].1 .1.store(false, std::sync::atomic::Ordering::Relaxed);
    lose(1);
    let mut call = v2::decode_infer(&body, None, &meta(), &Limits::NONE, &regions).expect("decodes");
    for finite in [false, true] {
        call.outputs[0].finite = finite;
        let e = encode(&call).expect_err("refused").to_string();
        assert!(e.contains("output `y`: shared memory region `out` lost its memory"), "{e}");
    }
}

#[test]
fn an_output_scanned_as_it_is_written_is_refused_before_a_non_finite_block() {
    let (regions, out) = regions();
    let x = json!({ "shared_memory_region": "in", "shared_memory_byte_size": 8, "shared_memory_offset": 4 });
    let y = json!({ "shared_memory_region": "out", "shared_memory_byte_size": 4 });
    let mut call = v2::decode_infer(&v2_request(x, y), None, &meta(), &Limits::NONE, &regions).expect("decodes");
    call.outputs[0].finite = true;
    let mut answer = answer();
    let written = v2::encode_infer("m", 1, None, &meta(), &answer, &call.outputs, &[]);
    assert_eq!(written.map(|(_, len)| len).expect("finite"), None);
    assert_eq!(out.bytes()[..4], [0x00, 0x38, 0x00, 0xc0], "written as when not scanned");
    answer[0] = Tensor::from_slice(vec![1, 2], &[f16::from_f32(0.25), f16::NAN]).expect("valid");
    let e = v2::encode_infer("m", 1, None, &meta(), &answer, &call.outputs, &[]).expect_err("NaN");
    assert!(matches!(&e, CodecError::Answer(m) if m.starts_with("output `y` holds NaN at element 1")), "{e}");
    assert_eq!(out.bytes()[..4], [0x00, 0x38, 0x00, 0xc0], "the span keeps what it held");
    let e = grpc::encode_infer("m", 1, String::new(), &meta(), &answer, &call.outputs, &[]).expect_err("NaN");
    assert!(matches!(&e, CodecError::Answer(m) if m.contains("finite numbers only")), "{e}");
}
