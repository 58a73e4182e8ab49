//! `model.toml` texts: parsed and validated, never a panic; what parses keeps the invariants the server relies on.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(config) = inferd_core::ModelConfig::parse("m", std::path::Path::new("/models/m"), text) {
        assert!((1..=inferd_core::MAX_INSTANCES).contains(&config.instances));
        assert!(config.batching.max_batch_size <= inferd_core::MAX_BATCH_SIZE_LIMIT);
        assert!(config.batching.max_queue_size > 0);
        assert!(config.file.starts_with("/models/m") || config.file.is_absolute());
    }
});
