//! # elm — Equilibrium Language Models
//!
//! Layers, lowest first; a module imports only modules before it in this list (ARCHITECTURE.md's
//! "Layer order", which `tests/architecture.rs` checks on the source):
//! `error`, `registry` (the one list of each enumerated extension point) → `limits` → `heap`,
//! `simd`, `team` → `gemm` → `io` (the files the library writes: atomic writer, tensor files,
//! JSON reader, the run-directory protocol) → `autograd` → `nn` → `train`, `grad` →
//! `model_data` (plain data shared by every path) → `formats` (GGUF, HF, tokenizers: fill those
//! types from files) → `model`, `data` (training and inference paths, cache-free dense passes in
//! `model::dense_pass`; GSM8K and text loaders) → `cuda`, `memory` → `equilibrium` (the ELM) →
//! `eval` → `compress` (baselines) → `lora` (stage-1 LoRA SFT + merge) → `search` (GPPO,
//! enumeration, metric selectors). The command line is the `elm`
//! binary (`src/main.rs`, feature `cli`), a thin shell over these modules; see ARCHITECTURE.md
//! for the picture and for where a new solver, gradient rule, implicit layer or compression
//! method goes.

// Link the system OpenBLAS that ndarray's `blas` feature calls into.
extern crate blas_src;

pub mod error;
pub mod gemm;
pub mod heap;
pub mod limits;
pub mod memory;
pub mod registry;
pub mod simd;
pub mod team;
pub use error::{ElmError, Result};

pub mod autograd;
pub mod data;
pub mod formats;
pub mod grad;
pub mod io;
pub mod model;
pub mod model_data;
pub mod nn;
pub mod quant;
/// The fixed-point solvers: the `elm-solver` crate (no system libraries), re-exported so that
/// `elm::solver::...` paths keep working.
pub use elm_solver as solver;
pub mod train;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub/mod.rs"]
pub mod cuda;

pub mod equilibrium;
pub mod eval;

pub mod compress;

pub mod lora;
pub mod search;

/// The Rust snippets of the README and of `docs/`, compiled and run as doc-tests (`cargo test
/// --workspace --doc`, a part of `scripts/test.sh`), so that an example cannot rot.
#[cfg(doctest)]
pub mod doc_snippets {
    #[doc = include_str!("../README.md")]
    pub struct Readme;
    #[doc = include_str!("../docs/solvers.md")]
    pub struct Solvers;
}
