//! The plain data of a decoder, shared by every path that reads, writes or runs one: the
//! hyper-parameters ([`ModelConfig`]), the dense f32 weights ([`ModelWeights`]), and the
//! quantized ones ([`QuantWeights`] of [`QMatrix`] blocks, with the one GGUF block codec and
//! the integer products on them).
//!
//! It sits below both the file formats (`formats`, which fill it from GGUF / safetensors) and
//! the model (`model`, which runs it), so neither has to import the other to share it. It
//! imports only the layers under it (error, limits, gemm).

pub mod block_codec;
pub mod config;
pub mod family;
pub mod kernel;
pub mod qmatmul;
pub mod quant;
pub mod tiles;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use quant::{
    Linear, LinearRef, QFfn, QFormat, QLayer, QMatrix, QuantWeights, WeightStorage, WriteFormat,
};
pub use weights::{FfnWeights, LayerWeights, ModelWeights};
