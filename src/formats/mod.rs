//! Model file formats, read into and written from the plain model data (`model::{config,
//! weights}`, the quantized matrices): GGUF (llama.cpp), HF safetensors + `config.json`, and the
//! tokenizers stored with them.
//!
//! - [`gguf`]: GGUF v2/v3 reader (memory-mapped) + dequantization + a small writer.
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
use crate::model_data::ModelWeights;

pub mod gguf;
pub mod gguf_model;
pub mod hf;
pub mod tokenizer;

pub use gguf::{qformat_of, GgufFile};
pub use gguf_model::{
    config_from_gguf, load_gguf_quant, load_gguf_quant_layers, load_gguf_weights,
    permute_rope_rows, save_gguf_model, stored_linear_format, unpermute_rope_rows,
    write_runtime_probe,
};
pub use hf::{config_from_hf_json, load_hf_model, read_hf_config, save_hf_model};
pub use tokenizer::Tokenizer;

/// File name of the default real model (fetched by `scripts/fetch-smollm2.sh`).
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// File name of the second family's real model, Gemma 3 270M base in Q4_K_M (fetched by
/// `scripts/fetch-gemma3.sh`).
pub const GEMMA3_GGUF: &str = "gemma-3-270m-q4_k_m.gguf";

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
