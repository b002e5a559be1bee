//! Llama / Qwen2 decoder: shared config and weights, a training path on the
//! autograd tape, and a fast cached inference path.
//!
//! Inference path: [`Transformer`] (prefill / decode / hidden states) built from
//! [`block_forward_cached`] and a preallocated [`KvCache`]; sampling and the batch
//! decode loop live in [`generate`], written once for any [`generate::Decoder`].
//!
//! Building another decoder on top (e.g. the ELM): allocate
//! `KvCache::with_layers(cfg, n, batch, max_seq)` for just the blocks you run, call
//! [`block_forward_inplace`] per block with per-sequence `new_lens` (0 = inactive) or
//! [`block_forward_rows`] on a subset of the sequences, use
//! `commit = false` for trial iterates (their K/V stay pending and are overwritten by
//! the next call) and [`LayerKv::commit`] once the final iterate is chosen. Then
//! implement [`generate::Decoder`] to reuse sampling, batching and stop conditions.
//!
//! Performance notes: one token per sequence goes through sgemv, more through sgemm
//! (system OpenBLAS; `OPENBLAS_NUM_THREADS` picks its threads, `elm bench` measures);
//! attention for ≤ 4 new tokens per sequence is plain loops; steady-state decode
//! allocates nothing (scratch lives in the [`KvCache`]).

pub mod any_transformer;
pub mod bench;
pub mod block;
pub mod block_view;
pub mod dense_pass;
pub mod generate;
pub mod kv_cache;
pub mod load;
pub mod lora_adapter;
pub mod ops;
pub mod tape;
pub mod transformer;

// The plain model data lives below the file formats (`crate::model_data`); these keep the
// paths `model::config` and `model::weights` working.
pub use crate::model_data::{config, weights};

pub use crate::model_data::config::{Arch, ModelConfig};
pub use crate::model_data::weights::{FfnWeights, LayerWeights, ModelWeights};
pub use crate::model_data::{QFfn, QLayer, QuantWeights};
pub use crate::quant::{Linear, QFormat, QMatrix, WeightStorage, WriteFormat};
pub use any_transformer::AnyTransformer;
pub use block::{block_forward_cached, block_forward_inplace, block_forward_rows};
pub use block_view::{AttnRef, BlockRef, BlockWeights};
pub use kv_cache::{kv_slots, KvCache, LayerKv, Scratch, PREFILL_CHUNK};
pub use load::{
    check_tensors, check_tensors_before_load, config_and_layer_format, default_model_path,
    load_config, load_inference, load_inference_checked, load_inference_layers, load_pretrained,
    load_pretrained_checked, load_tokenizer, load_weights, models_dir, BeforeWeights,
};
pub use transformer::{
    back_linears_with_huge_pages, check_context, embed_tokens, DecoderWeights, Transformer,
};
