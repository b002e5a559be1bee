//! Bytes → `tokenizer.json` text, and after a NUL byte (which JSON text cannot hold) an
//! optional `tokenizer_config.json` → `Tokenizer::from_json_parts` → encode and decode a few
//! short texts, look tokens up, format a chat prompt, and write the tokenizer back out.
//! Property: typed errors only.
#![no_main]

use std::path::Path;

use elm::formats::Tokenizer;
use elm_fuzz::exercise_tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    elm_fuzz::guarded(|| {
        let (json, config) = match data.iter().position(|&b| b == 0) {
            Some(i) => (&data[..i], Some(&data[i + 1..])),
            None => (data, None),
        };
        let Ok(json) = std::str::from_utf8(json) else {
            return;
        };
        let config = match config.map(std::str::from_utf8) {
            Some(Err(_)) => return,
            Some(Ok(c)) => Some(c),
            None => None,
        };
        if let Ok(tok) = Tokenizer::from_json_parts(json, config, Path::new("fuzz")) {
            exercise_tokenizer(&tok);
            let _ = tok.to_json_parts(false);
        }
    });
});
