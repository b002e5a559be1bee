//! Checkpoint loading and tokenizers.
//!
//! - [`gguf`]: GGUF v2/v3 reader (memory-mapped) + dequantization (F32, F16, BF16,
//!   Q8_0, Q4_0, Q4_1) + a small writer.
//! - [`load_gguf_model`]: a llama.cpp Llama/Qwen2 GGUF → dense f32 [`ModelWeights`]
//!   in HF layout (Q/K rows un-permuted back to half-split RoPE order).
//! - [`load_hf_model`] / [`save_hf_model`]: HF `config.json` + (sharded) safetensors.
//! - [`tokenizer::Tokenizer`]: byte-level BPE from a GGUF or an HF `tokenizer.json`,
//!   ChatML prompts.
//!
//! Every loader is strict: missing, unexpected or mis-shaped tensors and unknown
//! config keys that would change the math are typed [`ElmError`]s naming the culprit.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::error::{ElmError, Result};
use crate::model::ModelWeights;

pub mod gguf;
pub mod gguf_model;
pub mod hf;
pub mod tokenizer;

pub use gguf::GgufFile;
pub use gguf_model::{
    config_from_gguf, load_gguf_weights, permute_rope_rows, save_gguf_model, unpermute_rope_rows,
};
pub use hf::{config_from_hf_json, load_hf_model, read_hf_config, save_hf_model};
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

/// Writes `bytes` to `path` atomically: a temp file in the same directory, fsync, rename.
/// A crash leaves either the old file or the new one, never a torn one.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| ElmError::InvalidArgument(format!("{}: not a file path", path.display())))?;
    // Unique per process and call, so concurrent writers never share a temp file.
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{}.tmp{}-{n}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        ElmError::io(path, e)
    })
}
