//! The ELM method: replace layers `[l, l+M)` of a dense decoder by one weight-tied
//! fixed-point module `z* = f(z*, h)`, train it by distillation + CE, and run inference with
//! any fixed-point solver and a one-step (or multi-step) KV cache.
//!
//! - [`config`]: typed configs ([`ElmConfig`], [`TrainConfig`], [`LambdaSchedule`]).
//! - [`accounting`]: dense vs ELM parameter and KV-byte reports.
//! - [`data`]: GSM8K / jsonl / text loaders, chat-formatted sequences, resumable batch order.
//! - [`checkpoint`]: named-tensor maps and JSON over the atomic safetensors I/O of
//!   [`crate::train::tensor_file`].
//! - [`module`]: the fixed-point module `f(z, h) = block(W_z·z + W_h·h + b)`, its paper
//!   initialisation and checkpoint directory format (`elm.json` + `module.safetensors`).
//! - [`infer`]: [`infer::ElmSession`] — prefill/decode with any fixed-point solver, adaptive
//!   per-token stopping, one-step or multi-step KV cache, batched decode; greedy generation.
//!   Built on the model's inference blocks and KV caches ([`crate::model::block_forward_rows`],
//!   [`crate::model::LayerKv`]).
//! - [`forward`]: cache-free forward passes (dense hidden states, module fixed point).
//! - [`train`]: [`train::Trainer`] — distillation + CE, gradient rules, AdamW, resumable
//!   checkpoints.

pub mod accounting;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod forward;
pub mod infer;
pub mod module;
pub mod train;

pub use accounting::{kv_report, param_report, KvReport, ParamReport};
pub use config::{ElmConfig, LambdaSchedule, TrainConfig};
pub use module::{load_module, save_module, ElmModule, ModuleMeta};

use std::path::Path;

/// Loads a dense model from a `.gguf` file or an HF directory (config.json + safetensors).
pub fn load_dense_model(path: &Path) -> crate::Result<crate::model::ModelWeights> {
    if path.is_dir() {
        crate::io::load_hf_model(path)
    } else if path.exists() {
        crate::io::load_gguf_model(path)
    } else {
        Err(crate::ElmError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "model not found"),
        ))
    }
}
