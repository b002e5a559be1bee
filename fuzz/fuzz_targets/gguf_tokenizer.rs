//! GGUF bytes → `GgufFile::open` → `Tokenizer::from_gguf` (gpt2 byte-level BPE, llama
//! SentencePiece-style, or the HF JSON that `elm quantize` embeds) → encode and decode a few
//! short texts, look tokens up and format a chat prompt. Property: typed errors only.
#![no_main]

use elm::formats::gguf::GgufFile;
use elm::formats::Tokenizer;
use elm_fuzz::{exercise_tokenizer, input_file};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    elm_fuzz::guarded(|| {
        let path = input_file("input.gguf", data);
        let Ok(gguf) = GgufFile::open(&path) else {
            return;
        };
        if let Ok(tok) = Tokenizer::from_gguf(&gguf) {
            exercise_tokenizer(&tok);
        }
    });
});
