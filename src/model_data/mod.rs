//! The plain data of a decoder, shared by every path that reads, writes or runs one: the
//! hyper-parameters ([`ModelConfig`]), the families' facts ([`family`]), the dense f32 weights
//! ([`ModelWeights`]), and the weights of the inference path in any storage ([`QuantWeights`]
//! of `crate::quant`'s matrices).
//!
//! It sits below both the file formats (`formats`, which fill it from GGUF / safetensors) and
//! the model (`model`, which runs it), so neither has to import the other to share it. It
//! imports only the layers under it (quant, error, limits, gemm).

pub mod config;
pub mod family;
pub mod quant_weights;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use quant_weights::{QFfn, QLayer, QuantWeights};
pub use weights::{Block, Ffn, FfnWeights, GemmaParts, LayerWeights, ModelWeights};
