//! `/predict` bodies: `{"input": …}` or `{"inputs": {name: …}}`, nested arrays decoded as they stream by. A body
//! read as it arrives (a compressed one) decodes as the same body whole does.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    use inferd_codec::predict::{decode_predict, decode_predict_from};
    for meta in common::models() {
        let whole = decode_predict(data, &meta.inputs, &common::LIMITS);
        let streamed = decode_predict_from(data, &meta.inputs, &common::LIMITS);
        match (whole, streamed) {
            (Ok(whole), Ok(streamed)) => {
                assert_eq!(whole, streamed);
                common::check(&whole, &meta);
            }
            (Err(_), Err(_)) => {}
            (whole, streamed) => panic!("whole: {whole:?}, streamed: {streamed:?}"),
        }
    }
});
