//! KServe v2 bodies with binary tensors: a JSON header whose length the first two bytes choose, then binary data.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some((length, body)) = data.split_first_chunk::<2>() else { return };
    let json_length = usize::from(u16::from_le_bytes(*length)) % (body.len() + 1);
    for meta in common::models() {
        if let Ok(call) = inferd_codec::v2::decode_infer(&bytes::Bytes::copy_from_slice(body), Some(json_length), &meta, &common::LIMITS, &inferd_codec::shm::NoRegions) {
            common::check(&call.inputs, &meta);
        }
    }
});
