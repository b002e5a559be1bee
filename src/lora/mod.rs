//! Stage 1 of the paper's pipeline: LoRA SFT of the dense model on the task data, merged into
//! the weights ("tuned dense", the reference every compressed model is compared to and cut
//! from).
//!
//! - the adapters themselves (q, k, v, o, gate, up, down; their tape forward and the merge
//!   `W + (α/r)·B A`) live in [`crate::model::lora_adapter`], below the ELM, which heals the
//!   layers after its window with them.
//! - [`sft`]: [`sft::LoraTrainer`] — answer-token CE, AdamW, warm-up + cosine, resumable
//!   checkpoints.
//! - [`answer_nll_mean`]: held-out answer NLL of a dense model (the before/after figure).

pub mod sft;

pub use crate::model::lora_adapter::{merge_layer, merge_model, LoraSpec, TARGETS};
pub use sft::{LoraConfig, LoraEvent, LoraStepLog, LoraTrainer};

use serde::{Deserialize, Serialize};

use crate::data::QaExample;
use crate::equilibrium::infer::{ElmModel, InferenceConfig};
use crate::error::Result;
use crate::formats::tokenizer::Tokenizer;
use crate::model::ModelWeights;

/// Mean answer NLL (nats per answer token) of `weights` on `examples` (chat template, the
/// tokens `elm eval --task gsm8k-nll` scores).
pub fn answer_nll_mean(
    weights: &ModelWeights,
    tok: &Tokenizer,
    examples: &[QaExample],
    batch: usize,
) -> Result<f64> {
    let model = ElmModel::dense(weights.clone());
    let ids: Vec<String> = (0..examples.len()).map(|i| format!("test-{i}")).collect();
    let run = crate::eval::answer_nll(
        &model,
        tok,
        &ids,
        examples,
        &InferenceConfig::default(),
        batch,
        |_| {},
    )?;
    let (s, w) = run
        .items
        .iter()
        .fold((0.0, 0.0), |(s, w), i| (s + i.value, w + i.weight));
    Ok(s / w.max(1.0))
}

/// What `elm lora` did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoraReport {
    pub steps: usize,
    /// Wall seconds of this process's training.
    pub seconds: f64,
    /// Wall seconds of every step, across the runs this one resumed (see
    /// [`crate::equilibrium::train::TrainOutcome::seconds_all_runs`]).
    pub seconds_all_runs: f64,
    pub train_sequences: usize,
    /// Mean answer-token CE of the first and last 10 steps.
    pub train_ce_first: f64,
    pub train_ce_last: f64,
    pub held_out_examples: usize,
    /// Held-out answer NLL (nats/token) of the untuned and the merged tuned model.
    pub answer_nll_before: Option<f64>,
    pub answer_nll_after: Option<f64>,
    pub out: String,
}

/// Mean CE of the first and last `k` logged steps.
pub fn ce_ends(history: &[LoraStepLog], k: usize) -> (f64, f64) {
    let mean = |h: &[LoraStepLog]| h.iter().map(|l| l.ce).sum::<f64>() / h.len().max(1) as f64;
    let k = k.min(history.len());
    (mean(&history[..k]), mean(&history[history.len() - k..]))
}
