//! KServe v2 JSON bodies.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    for meta in common::models() {
        if let Ok(call) = inferd_codec::v2::decode_infer(&bytes::Bytes::copy_from_slice(data), None, &meta, &common::LIMITS, &inferd_codec::shm::NoRegions) {
            common::check(&call.inputs, &meta);
        }
    }
});
