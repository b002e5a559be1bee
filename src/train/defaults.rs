//! The serde defaults the trainers' configs share (ELM training, LoRA SFT, the search's
//! candidates), one value each so that they cannot drift apart. Batch sizes differ by design
//! and stay with each config.

/// Optimiser steps of a run.
pub fn steps() -> usize {
    100
}

/// Tokens per training sequence (longer ones are truncated).
pub fn seq_len() -> usize {
    256
}

/// Steps between resumable checkpoints.
pub fn checkpoint_every() -> usize {
    50
}
