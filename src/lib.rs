//! # elm — Equilibrium Language Models
//!
//! Layers, lowest first; a module imports only modules before it in this list:
//! `error`, `registry` (the one list of each enumerated extension point), `heap` (allocator setting for the binaries), `limits` → `data` (GSM8K, jsonl and text loaders, chat formatting, batch order) → `io::{atomic, tensor_file}` (the files the library writes) → `solver`, `autograd` →
//! `nn`, `grad`, `train` → `model::{config, weights}` (plain
//! data shared by every path) → `io` (fills those types from files) → the rest of `model`
//! (training and inference paths, cache-free dense passes in `model::dense_pass`) → `cuda` → `equilibrium` (the ELM) → `eval` → `compress` (baselines) → `lora`
//! (stage-1 LoRA SFT + merge) → `search` (GPPO, enumeration, metric selectors). The command line is the `elm`
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
