//! Depth-compression baselines: the methods the equilibrium module is compared with, on the same
//! dense model, window size and calibration text (see ARCHITECTURE.md).
//!
//! - [`calibration`]: equal-length calibration chunks and the dense residual stream at every
//!   layer boundary on them, computed once and shared by every metric and method.
//! - [`metrics`]: layer- and window-selection scores — Block Influence (ShortGPT), window cosine
//!   (LLM-Streamline), last-token angular distance (ReplaceMe/UIDL), and the NLL of the model with
//!   a window removed (Shortened-LLaMA's one-shot PPL; a window of one is its per-block form), and
//!   Shortened-LLaMA's Taylor+ block importance `Σ_W |Σ W ⊙ ∂CE/∂W|` from one backward pass on
//!   the autograd tape per calibration batch.
//! - [`methods`]: the training-free methods, one file each, each producing an ordinary dense
//!   model with fewer layers that every command loads like any other (`--model DIR`): deletion
//!   (ShortGPT, Shortened-LLaMA PPL and Taylor+, a deleted window), ReplaceMe's least-squares map
//!   folded into the last kept layer's down projection, and LaCo's merges.
//! - [`module_init`]: how `elm compress` initialises the equilibrium module's block.
//!
//! Trained variants (LLM-Streamline, looped layers, ELM ablations) and LoRA healing build on
//! [`crate::equilibrium`]'s trainer and are not here yet.

pub mod calibration;
pub mod methods;
pub mod metrics;
pub mod module_init;

pub use calibration::{BoundaryStates, Calibration};
pub use methods::{prune, PruneMethod, PruneOptions, PruneReport, PrunedModel, Selection};
pub use module_init::{init_module, BlockInit};
