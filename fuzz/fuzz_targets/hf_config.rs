//! Bytes → JSON → `config_from_hf_json` (the `config.json` of an HF checkpoint). Properties:
//! typed errors only, and a config it accepts survives `config_to_hf_json` and back unchanged
//! (what `save_hf_model` writes, `load_hf_model` must read as the same model).
#![no_main]

use elm::formats::hf::{config_from_hf_json, config_to_hf_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    elm_fuzz::guarded(|| {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
            return;
        };
        let Ok(config) = config_from_hf_json(&value) else {
            return;
        };
        config
            .validate()
            .expect("config_from_hf_json returns a valid config");
        let written = config_to_hf_json(&config);
        let back = config_from_hf_json(&written)
            .unwrap_or_else(|e| panic!("config_to_hf_json output refused: {e}\n{written}"));
        assert_eq!(back, config, "config.json round trip\n{written}");
    });
});
