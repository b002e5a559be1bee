//! Quantization, in one place: the block formats (one type per format in [`blocks`], their
//! list and dispatch in [`format`]), a matrix of blocks ([`QMatrix`], [`Linear`]), the tiled
//! layout the VNNI kernel reads ([`tiles`]), and the integer products on them ([`matmul`], its
//! kernels per instruction set in their own files, chosen once by [`kernel`]).
//!
//! It sits at the GEMM's level: it knows blocks and matrices, never a model. The model's
//! blocks of such matrices are `model_data`'s, above it. It imports only error, registry and
//! heap.

pub mod blocks;
pub mod format;
pub mod kernel;
pub mod matmul;
pub mod matrix;
pub mod tiles;

pub use blocks::{QK, QK_K};
pub use format::{QFormat, WriteFormat};
pub use kernel::{detected_kernel, Kernel};
pub use matmul::{qmatmul_rows, ActQuant, QActs};
pub use matrix::{AsLinearRef, Linear, LinearRef, QMatrix, WeightStorage};
pub use tiles::Layout;
