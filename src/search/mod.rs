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
    /// The pipeline's stages (the unit variants; the list [`Registry::all`] puts before one
    /// method per selector of [`Selector::ALL`]).
    ///
    /// [`Registry::all`]: crate::registry::Registry::all
    const STAGES: [SearchMethod; 3] = [
        SearchMethod::Gppo,
        SearchMethod::Enumerate,
        SearchMethod::Report,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SearchMethod::Gppo => "gppo",
            SearchMethod::Enumerate => "enumerate",
            SearchMethod::Report => "report",
            SearchMethod::Metric(s) => s.name(),
        }
    }
}

impl crate::registry::Registry for SearchMethod {
    const WHAT: &'static str = "method";
    /// [`SearchMethod::STAGES`], then every selector.
    fn all() -> &'static [Self] {
        static ALL: std::sync::OnceLock<Vec<SearchMethod>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            SearchMethod::STAGES
                .into_iter()
                .chain(Selector::ALL.map(SearchMethod::Metric))
                .collect()
        })
    }
    fn name(self) -> &'static str {
        SearchMethod::name(self)
    }
}

impl std::str::FromStr for SearchMethod {
    type Err = crate::error::ElmError;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        use crate::registry::Registry;
        SearchMethod::from_name(s).ok_or_else(|| {
            crate::error::ElmError::config(
                "method",
                format!(
                    "unknown method `{s}` ({})",
                    SearchMethod::names().join(" | ")
                ),
            )
        })
    }
}
