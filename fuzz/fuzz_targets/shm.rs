//! The shared-memory parameters, over both codecs: the input's first bytes are a region's contents (registered as
//! `a`; `b` is 16 zero bytes), the rest a KServe v2 JSON body and, read again, a gRPC message. A decode that succeeds
//! must hold tensors that fit the model; its outputs are then encoded into whatever spans it named, which must never
//! write outside them.
#![no_main]

use inferd_codec::shm::{MemoryRegion, MemoryRegions};
use inferd_codec::grpc::proto::ModelInferRequest;
use inferd_core::{DataType, Tensor};
use libfuzzer_sys::fuzz_target;
use prost::Message;

#[path = "common.rs"]
mod common;

/// The answer a model of `meta` might give: one row of zeros per output, scalars for a shape without dimensions.
fn answer(meta: &inferd_core::ModelMetadata) -> Vec<Tensor> {
    meta.outputs
        .iter()
        .map(|spec| {
            let shape: Vec<usize> = spec.shape.iter().map(|&d| if d < 0 { 1 } else { d as usize }).collect();
            let count = shape.iter().product::<usize>();
            Tensor::new(DataType::Fp32, shape, vec![0; count * 4]).expect("a valid answer")
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&len, rest)) = data.split_first() else { return };
    let (contents, body) = rest.split_at((len as usize).min(rest.len()));
    let a = MemoryRegion::new(contents.to_vec());
    let b = MemoryRegion::new(vec![0; 16]);
    let regions = MemoryRegions(vec![("a".into(), a.clone()), ("b".into(), b.clone())]);
    for meta in common::models() {
        // Outputs scanned as they are written, or not, as the first byte's low bit says.
        let finite = len % 2 == 1;
        if let Ok(mut call) = inferd_codec::v2::decode_infer(&bytes::Bytes::copy_from_slice(body), None, &meta, &common::LIMITS, &regions) {
            common::check(&call.inputs, &meta);
            call.outputs.iter_mut().for_each(|w| w.finite = finite);
            let (outputs, read) = (&call.outputs, &call.input_memory);
            let _ = inferd_codec::v2::encode_infer("m", 1, None, &meta, &answer(&meta), outputs, read);
        }
        if let Ok(request) = ModelInferRequest::decode(body) {
            if let Ok(mut call) = inferd_codec::grpc::decode_infer(request, &meta, &common::LIMITS, &regions) {
                common::check(&call.inputs, &meta);
                call.outputs.iter_mut().for_each(|w| w.finite = finite);
                let (outputs, read) = (&call.outputs, &call.input_memory);
                let _ = inferd_codec::grpc::encode_infer("m", 1, String::new(), &meta, &answer(&meta), outputs, read);
            }
        }
    }
    // The regions keep their sizes whatever was written to them.
    assert_eq!((a.bytes().len(), b.bytes().len()), (contents.len(), 16));
});
