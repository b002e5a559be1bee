//! The ELM method: replace layers `[l, l+M)` of a dense decoder by one weight-tied
//! fixed-point module `z* = f(z*, h)`, train it by distillation + CE, and run inference with
//! any fixed-point solver and a one-step (or multi-step) KV cache.
//!
//! - [`config`]: typed configs ([`ElmConfig`], [`TrainConfig`], [`LambdaSchedule`]).
//! - [`accounting`]: dense vs ELM parameter and KV-byte reports.
//! - [`checkpoint`]: named-tensor maps and JSON over the atomic safetensors I/O of
//!   [`crate::io::tensor_file`].
//! - [`module`]: the module's parameters — typed handles [`ElmParams`] (names, order and
//!   checkpoint keys in one place) and arrays [`ElmModule`] — its paper initialisation and
//!   checkpoint directory format (`elm.json` + `module.safetensors`).
//! - [`map`]: the map `φ(z, h) = f*(W_z·z + W_h·h + b)`, written once, on the tape, without
//!   tape, and against a KV cache; [`map::ElmLayer`] is its [`crate::grad::ImplicitLayer`].
//! - Inference, one file per job (gathered under [`infer`]): [`inference_config`] (solver,
//!   stopping, KV mode), [`model`] ([`model::ElmModel`] and its loading), [`quant_module`] (the
//!   quantized forms), [`session`] ([`session::ElmSession`] — prefill/decode with any fixed-point
//!   solver, adaptive per-token stopping, one-step or multi-step KV cache, batched decode),
//!   [`fixed_point`] (the module as the solver's map, and the solve buffers kept across tokens),
//!   [`sequences`] (whole sequences, nothing cached) and [`decode`] (greedy and sampled
//!   generation). Built on the model's inference blocks and KV caches.
//! - [`relaxed`]: Relaxed Recursive Transformers' per-loop adapters (a comparison method built
//!   on the module: the shared block looped M times, loop k with its own SVD-initialised LoRA),
//!   their checkpoint file and the dense model they merge into for inference.
//! - [`interchange`]: the official ELM code's integrated checkpoint format, read and written.
//! - [`bench`]: the comparative bench of dense and ELM configurations (typed runs).
//! - [`quant_gguf`]: the quantized GGUF file format (below the model code: it reads and writes
//!   [`quant_module::QuantElm`], never an [`model::ElmModel`]).
//! - [`train`]: [`train::Trainer`] — distillation + CE, any [`crate::grad::DeqConfig`], AdamW,
//!   resumable checkpoints, and the whole run ([`train::Trainer::run`]) with progress callbacks.

pub mod accounting;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod decode;
pub mod fixed_point;
pub mod infer;
pub mod inference_config;
pub mod interchange;
pub mod map;
pub mod model;
pub mod module;
pub mod quant_gguf;
pub mod quant_module;
pub mod relaxed;
pub mod sequences;
pub mod session;
pub mod spectral;
pub mod teacher_cache;
pub mod train;

pub use accounting::{kv_report, param_report, KvReport, ParamReport};
pub use config::{BlockKind, DistillScale, ElmConfig, LambdaSchedule, RelaxedLoops, TrainConfig};
pub use map::ElmLayer;
pub use module::{load_module, save_module, ElmModule, ElmParams, ModuleBlock, ModuleMeta};
