//! Llama / Qwen2 decoder: shared config and weights, a training path on the
//! autograd tape, and a fast cached inference path.

pub mod config;
pub mod tape;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use weights::{LayerWeights, ModelWeights};
