//! [`Tables`]: every table of one run, as `OUT/tables.json` stores it (the smoke test reads
//! that file back into it). Between the rows and everything that reads them: the study fills
//! one, the plot and README writers print one; this file imports only the records it holds
//! (the rows, the canonical problems' and the ρ sweep's records, the stage log), never the
//! code that fills or prints them.

use elm::search::report::WhereToPrune;
use serde::{Deserialize, Serialize};

use crate::rows::{
    BenchFigures, CollapseRow, Controls, Curves, FullTest, FullyTrained, GradRow, Grid, HealedElm,
    KvRow, MainRow, PrecisionRow, SameWindow, Seeds, SolverRow, SpectralRow, SpeedRow, SweepRow,
    TrainedWindow, REFERENCE_KIND,
};
use crate::runs::RhoSweep;
use crate::solvers::CanonicalRow;
use crate::stage::StageLog;

/// Which plots of a run were drawn (their tables exist): what the plot writer reports and the
/// README writer links.
#[derive(Clone, Copy, Debug, Default)]
pub struct Written {
    pub solvers: bool,
    pub sweep: bool,
    pub curves: bool,
    pub fully_trained: bool,
    pub grid: bool,
}

/// Every table of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tables {
    pub scale: String,
    pub model: String,
    pub main: Vec<MainRow>,
    pub kv: Vec<KvRow>,
    pub solver: Vec<SolverRow>,
    pub grad: Vec<GradRow>,
    pub sweep: Vec<SweepRow>,
    /// Table 6 (absent when `--only` never selected it).
    #[serde(deserialize_with = "Option::deserialize")]
    pub where_to_prune: Option<WhereToPrune>,
    pub canonical: Vec<CanonicalRow>,
    pub spectral: Vec<SpectralRow>,
    pub speed: Vec<SpeedRow>,
    /// Absent at `smoke` (no benchmark).
    #[serde(deserialize_with = "Option::deserialize")]
    pub bench: Option<BenchFigures>,
    /// Stages of the last invocation, in order (cached or computed, with their seconds).
    pub stages: Vec<StageLog>,
    /// Wall seconds of the last invocation.
    pub seconds: f64,
    /// Settings of the scale (budgets, limits).
    pub limits: serde_json::Value,
    /// Table 1's method-against-method comparison at the best healed baseline's window.
    #[serde(default)]
    pub same_window: Option<SameWindow>,
    /// Table 6: fully trained ELMs at the windows the pipeline considers.
    #[serde(default)]
    pub trained_windows: Vec<TrainedWindow>,
    /// Table 1's ELM + heal row against the plain ELM (and the baseline) at its window.
    #[serde(default)]
    pub healed_elm: Option<HealedElm>,
    /// Table 1's controls at the headline window (equal parameters, fixed depth).
    #[serde(default)]
    pub controls: Option<Controls>,
    /// Table 1b: the headline rows and the controls on the whole test set (`long`).
    #[serde(default)]
    pub full_test: Option<FullTest>,
    /// Table 7c: the ρ sweep with table 7b's trained ELMs marked.
    #[serde(default)]
    pub rho_sweep: Option<RhoSweep>,
    /// Table 10: the collapse diagnosis (scales with collapse starts).
    #[serde(default)]
    pub collapse: Vec<CollapseRow>,
    /// SHA-256 of the model file (an HF directory's `model.safetensors`).
    #[serde(default)]
    pub model_sha256: Option<String>,
    /// Table 8 (scales with a curve study).
    #[serde(default)]
    pub curves: Option<Curves>,
    /// Table 9 (same scales).
    #[serde(default)]
    pub seeds: Option<Seeds>,
    /// What the run's bf16 products change in a score (empty for an f32 run).
    #[serde(default)]
    pub precision_check: Vec<PrecisionRow>,
    /// Table 6b: every start trained at the main budget (scales that have it).
    #[serde(default)]
    pub fully_trained: Option<FullyTrained>,
    /// Table 11: the train-K × test-K grid at the headline window.
    #[serde(default)]
    pub grid: Option<Grid>,
}

impl Tables {
    /// A run with no table computed yet (the first run into a results directory).
    pub fn empty(scale: String, model: String) -> Self {
        Tables {
            scale,
            model,
            main: vec![],
            kv: vec![],
            solver: vec![],
            grad: vec![],
            sweep: vec![],
            where_to_prune: None,
            canonical: vec![],
            spectral: vec![],
            speed: vec![],
            bench: None,
            stages: vec![],
            seconds: 0.0,
            limits: serde_json::Value::Null,
            same_window: None,
            healed_elm: None,
            controls: None,
            full_test: None,
            model_sha256: None,
            collapse: vec![],
            rho_sweep: None,
            trained_windows: vec![],
            curves: None,
            seeds: None,
            precision_check: vec![],
            fully_trained: None,
            grid: None,
        }
    }

    /// Table 1's reference row (the LoRA-tuned dense model), the baseline of the headline and
    /// the plots' dense line.
    pub fn reference_row(&self) -> Option<&MainRow> {
        self.main.iter().find(|r| r.kind == REFERENCE_KIND)
    }
}
