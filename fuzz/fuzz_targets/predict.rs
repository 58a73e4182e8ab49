//! `/predict` bodies: `{"input": …}` or `{"inputs": {name: …}}`, nested arrays decoded as they stream by.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    for meta in common::models() {
        if let Ok(tensors) = inferd_codec::predict::decode_predict(data, &meta.inputs, &common::LIMITS) {
            common::check(&tensors, &meta);
        }
    }
});
