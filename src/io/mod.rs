//! File formats: checkpoints, tokenizers, and the files the library writes itself.
//!
//! - [`atomic`] and [`tensor_file`]: the one atomic writer and named-f32-tensor safetensors
//!   files (optimiser state, parameter stores, ELM checkpoints). They use nothing but
//!   [`crate::error`], so lower layers (`train`) may use them; the model formats below build on
//!   `model::{config, weights}`.
//! - [`gguf`]: GGUF v2/v3 reader (memory-mapped) + dequantization (F32, F16, BF16,
//!   Q8_0, Q4_0, Q4_1) + a small writer.
//! - [`load_gguf_model`]: a llama.cpp Llama/Qwen2 GGUF → dense f32 [`ModelWeights`]
//!   in HF layout (Q/K rows un-permuted back to half-split RoPE order).
//! - [`load_hf_model`] / [`save_hf_model`]: HF `config.json` + (sharded) safetensors.
//! - [`tokenizer::Tokenizer`]: byte-level BPE from a GGUF or an HF `tokenizer.json`,
//!   ChatML prompts.
//!
//! Every loader is strict: missing, unexpected or mis-shaped tensors and unknown
//! config keys that would change the math are typed [`ElmError`](crate::ElmError)s naming the culprit.

use std::path::Path;

use crate::error::Result;
use crate::model::ModelWeights;

pub mod atomic;
pub mod dir_lock;
pub mod gguf;
pub mod gguf_model;
pub mod hf;
pub mod process;
pub mod tensor_file;
pub mod tokenizer;

pub use atomic::{write_atomic, write_json_atomic};
pub use dir_lock::{DirLock, LockHolder};
pub use gguf::GgufFile;
pub use gguf_model::{
    config_from_gguf, load_gguf_quant, load_gguf_weights, permute_rope_rows, qformat_of,
    save_gguf_model, unpermute_rope_rows,
};
pub use hf::{config_from_hf_json, load_hf_model, read_hf_config, save_hf_model};
pub use process::peak_rss_bytes;
pub use tokenizer::Tokenizer;

/// File name of the default real model (fetched by `scripts/fetch-smollm2.sh`).
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Directory holding model files: env `ELM_MODELS_DIR`, else `<crate root>/models`.
pub fn models_dir() -> std::path::PathBuf {
    std::env::var_os("ELM_MODELS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("models"))
}

/// Opens a GGUF file and loads it as dense f32 HF-layout weights.
pub fn load_gguf_model(path: impl AsRef<Path>) -> Result<ModelWeights> {
    let gguf = GgufFile::open(path)?;
    load_gguf_weights(&gguf)
}
