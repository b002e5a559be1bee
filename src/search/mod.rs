//! Where to put the ELM: stage 2 (GPPO) and stage 3 (enumeration and metric selectors) of the
//! paper's pipeline.
//!
//! - [`policy`]: the categorical policy over start layers and its clipped PPO update.
//! - [`candidate`]: the reward model — per start `l` a projection and a LoRA on layer `l`
//!   (layer `l` is the shared fixed-point block), M unrolled iterations, CE + distillation;
//!   teacher states shared across candidates.
//! - [`gppo`]: [`gppo::Gppo`] — sample, train, reward `−CE`, PPO every p steps; resumable;
//!   the θ trace.
//! - [`enumerate`]: train every (k-th) start for the same budget, rank by held-out answer NLL.
//! - [`report`]: the metric selectors (window cosine, Block Influence, angular distance,
//!   one-shot PPL), Spearman, and [`report::WhereToPrune`] (typed, for `paper_repro`).

pub mod candidate;
pub mod policy;

pub mod enumerate;
pub mod gppo;
pub mod report;

pub use enumerate::{enumerate, EnumConfig, EnumEntry, Enumeration};
pub use gppo::{Gppo, GppoConfig, GppoOutcome};
pub use report::{metric_choice, spearman, where_to_prune, MetricChoice, Selector, WhereToPrune};

/// What `elm search --method` runs: a stage of the pipeline or one metric selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchMethod {
    /// Stage 2: GPPO over start layers.
    Gppo,
    /// Stage 3: every (k-th) start trained for the same budget.
    Enumerate,
    /// Every selector against GPPO and the enumeration ([`WhereToPrune`]).
    Report,
    /// One training-free selector.
    Metric(Selector),
}

impl SearchMethod {
    pub fn name(self) -> &'static str {
        match self {
            SearchMethod::Gppo => "gppo",
            SearchMethod::Enumerate => "enumerate",
            SearchMethod::Report => "report",
            SearchMethod::Metric(s) => s.name(),
        }
    }
}

impl std::str::FromStr for SearchMethod {
    type Err = crate::error::ElmError;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        match s {
            "gppo" => Ok(SearchMethod::Gppo),
            "enumerate" => Ok(SearchMethod::Enumerate),
            "report" => Ok(SearchMethod::Report),
            _ => s.parse().map(SearchMethod::Metric).map_err(|_| {
                crate::error::ElmError::config(
                    "method",
                    format!(
                        "unknown method `{s}` (gppo | enumerate | report | cosine | bi | angular | ppl)"
                    ),
                )
            }),
        }
    }
}
