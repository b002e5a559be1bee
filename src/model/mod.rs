//! Llama / Qwen2 decoder: shared config and weights, a training path on the
//! autograd tape, and a fast cached inference path.
//!
//! Inference path: [`Transformer`] (prefill / decode / hidden states) built from
//! [`block_forward_cached`] and a preallocated [`KvCache`]; sampling and the batch
//! decode loop live in [`generate`], written once for any [`generate::Decoder`].

pub mod bench;
pub mod block;
pub mod config;
pub mod generate;
pub mod kv_cache;
pub mod load;
pub mod ops;
pub mod tape;
pub mod transformer;
pub mod weights;

pub use block::{block_forward_cached, block_forward_inplace};
pub use config::{Arch, ModelConfig};
pub use kv_cache::{KvCache, LayerKv, Scratch};
pub use load::{default_model_path, load_pretrained, models_dir};
pub use transformer::Transformer;
pub use weights::{LayerWeights, ModelWeights};
