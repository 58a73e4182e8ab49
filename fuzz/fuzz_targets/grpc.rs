//! gRPC inference requests: the bytes of a `ModelInferRequest` message, as tonic hands them to inferd, decoded into
//! each model's input tensors.
#![no_main]

use inferd_codec::grpc::proto::ModelInferRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = ModelInferRequest::decode(data) else { return };
    for meta in common::models() {
        if let Ok(call) = inferd_codec::grpc::decode_infer(request.clone(), &meta, &common::LIMITS, &inferd_codec::shm::NoRegions) {
            common::check(&call.inputs, &meta);
            assert!(call.outputs.iter().all(|w| w.index < meta.outputs.len()), "an output the model has not");
        }
    }
});
