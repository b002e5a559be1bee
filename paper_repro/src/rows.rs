//! The typed rows of every table: what `OUT/tables.json` holds (the smoke test reads that
//! file back into these types, so a missing key fails it). Plain data at the bottom of the
//! crate's layering: the code that fills the rows (`fill_tables`, `fill_curves`), the
//! [`crate::tables::Tables`] that gathers them and the writers that print them all import this
//! file, and it imports none of them. `None` marks a cell that does not exist by definition (the
//! dense model's Δ, a ratio over a zero dense score) and is written `n/a`.

use elm::eval::stats::{Estimate, Spread};
use elm::model::bench::BenchReport;
use serde::{Deserialize, Serialize};

/// `value [lo, hi]` (95% bootstrap over problems).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Interval {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

impl From<&Estimate> for Interval {
    fn from(e: &Estimate) -> Self {
        Interval {
            value: e.value,
            lo: e.lo,
            hi: e.hi,
        }
    }
}

/// Table 1's row of the ELM itself (the one every other row is paired with).
pub const MAIN_ELM_ROW: &str = "ELM (Anderson, δ = 0.5, one-step KV)";

/// `kind` of the main table's reference row (the LoRA-tuned dense model).
pub const REFERENCE_KIND: &str = "dense";

/// Method against method at one window: the ELM trained (same budget) at the layers the best
/// healed baseline removes, and that baseline, paired over the same problems.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SameWindow {
    /// The baseline's row name.
    pub baseline: String,
    /// The ELM's row name.
    pub elm: String,
    /// Replaced (and removed) layers `[first, last]`.
    pub layers: (usize, usize),
    /// The baseline's answer NLL minus the ELM's (negative: the baseline is better).
    pub delta_baseline_minus_elm: Interval,
}

/// The controls at the headline window (the best healed baseline's on validation, else the
/// study's) and budget: each a row of table 1, paired against the ELM trained there.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Controls {
    /// The headline ELM's row name, layers `[first, last]` and parameters.
    pub elm: String,
    pub layers: (usize, usize),
    pub elm_params: usize,
    /// How the headline window was chosen (always on the validation split).
    pub window_choice: String,
    pub rows: Vec<Control>,
}

/// Which question a control answers (the verdict reads each kind in its own sentence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlKind {
    /// The best healed baseline removing one layer fewer: at least the ELM's parameters.
    EqualParameters,
    /// The module looped K times with injection, trained and tested at K: is it the solve?
    FixedDepth,
    /// The closest prior method (Relaxed Recursive Transformers): why not loop with per-loop LoRA?
    PriorMethod,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Control {
    pub kind: ControlKind,
    /// What the control is, in words (`equal parameters: …`, `fixed depth: K = …`, …).
    pub control: String,
    /// Its row name in table 1.
    pub model: String,
    pub params: usize,
    /// The control's answer NLL minus the headline ELM's (negative: the control is better).
    pub minus_elm: Interval,
}

/// Table 1b (`long`; `smoke` for its code path): the headline rows and the controls scored again on the whole
/// GSM8K test set, each paired with the headline ELM there: what the verdict's gaps are at the
/// largest sample there is.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FullTest {
    /// Test problems scored (all of them).
    pub problems: usize,
    /// The headline ELM's row name and its answer NLL on them.
    pub elm: String,
    pub elm_answer_nll: Interval,
    pub rows: Vec<FullTestRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FullTestRow {
    /// Its row name in table 1.
    pub model: String,
    /// Why it is here (`reference`, `best healed baseline`, a control's words).
    pub role: String,
    pub answer_nll: Interval,
    /// Its answer NLL minus the headline ELM's, paired over every test problem.
    pub minus_elm: Interval,
}

/// Table 10: one ELM trained at the main budget from one start under one distillation recipe,
/// with what tells a collapse apart: the teacher's scale at the window, the losses at the first
/// steps and the last, the held-out distillation error, the map's contraction and the quality.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollapseRow {
    pub start: usize,
    pub m: usize,
    /// `absolute` (the paper's MSE) or `teacher_mean_square` (MSE / mean(h_{l+M}²)).
    pub recipe: String,
    pub rms_entering: f64,
    pub rms_leaving: f64,
    /// The distillation MSE (before the recipe scales it) at the first step, CE at the first step
    /// with a CE term, and both at the last step.
    pub first_distill: f64,
    #[serde(deserialize_with = "Option::deserialize")]
    pub first_ce: Option<f64>,
    pub final_distill: f64,
    #[serde(deserialize_with = "Option::deserialize")]
    pub final_ce: Option<f64>,
    /// Held-out (validation) distillation MSE of the solved module after training.
    pub held_out_distill: f64,
    /// ρ(∂φ/∂z) at the fixed point: mean and max over the sequences.
    pub mean_radius: f64,
    pub max_radius: f64,
    pub answer_nll: Interval,
    pub delta_nll: Interval,
}

/// The precision check: one model scored with the run's bf16 products and again with f32
/// products on the same problems (the ablation tables' sample), paired.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrecisionRow {
    pub model: String,
    pub bf16: Interval,
    pub f32: Interval,
    pub bf16_minus_f32: Interval,
    /// Mean solver iterations per token in each format (0 for a dense model).
    pub bf16_iterations: f64,
    pub f32_iterations: f64,
}

/// ELM + heal (a row no paper has): the ELM trained together with a LoRA heal of the layers
/// after its window, same budget, against the plain ELM at that window and (when the window is
/// the best healed baseline's) against that baseline, paired over the same problems.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealedElm {
    /// Row names in table 1.
    pub healed: String,
    pub plain: String,
    /// Replaced layers `[first, last]`.
    pub layers: (usize, usize),
    /// The healed ELM's answer NLL minus the plain ELM's (negative: the heal helps).
    pub healed_minus_plain: Interval,
    /// The best healed baseline's row and its answer NLL minus the healed ELM's, when that
    /// baseline removes the same window.
    #[serde(deserialize_with = "Option::deserialize")]
    pub baseline: Option<String>,
    #[serde(deserialize_with = "Option::deserialize")]
    pub baseline_minus_healed: Option<Interval>,
}

/// Table 6's check of the enumeration: an ELM fully trained (main budget) at a window the
/// pipeline considers, with the rank the enumeration's short candidates gave that start.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainedWindow {
    pub start: usize,
    /// Why this window (the study's default, the best healed baseline's, GPPO's argmax).
    pub why: String,
    pub answer_nll: Interval,
    /// Rank of `start` among the enumerated starts (1 = best), when it was enumerated.
    #[serde(deserialize_with = "Option::deserialize")]
    pub enum_rank: Option<usize>,
}

/// Table 6b (scales that train every start): the ELM trained at the main budget from each start,
/// scored on validation problems, and its rank among them (1 = best).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainedStart {
    pub start: usize,
    pub validation_nll: Interval,
    pub rank: usize,
}

/// Where one selector's choice lands among the fully trained starts.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainedPlacement {
    pub method: String,
    pub choice: usize,
    /// The trained start nearest to `choice` (itself when every start is trained).
    pub trained_start: usize,
    pub rank: usize,
    /// Its validation NLL minus the best trained start's.
    pub nll_gap: f64,
}

/// Table 6b: "where to prune" judged against fully trained windows.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FullyTrained {
    pub starts: Vec<TrainedStart>,
    pub placements: Vec<TrainedPlacement>,
}

impl FullyTrained {
    /// `(start, validation NLL)` of every fully trained start: the ground truth a window
    /// selector is read against (`elm::search::report::against_truth`).
    pub fn validation_truth(&self) -> Vec<(usize, f64)> {
        self.starts
            .iter()
            .map(|s| (s.start, s.validation_nll.value))
            .collect()
    }
}

/// Table 1: main results.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MainRow {
    pub model: String,
    /// How the row was obtained (dense, training-free, trained at the ELM's budget, ELM).
    pub kind: String,
    pub params: usize,
    pub non_embedding_params: usize,
    /// KV-cache bytes for one 1,024-token sequence (f32; the library's accounting).
    pub kv_bytes_1k: usize,
    /// Token budget (steps × batch × sequence length) of the row's own training after the
    /// shared LoRA tuning every compressed model is cut from: the module's training, the
    /// healing fine-tune, or the reference's LoRA run; 0 for the training-free rows.
    pub train_tokens: usize,
    /// Wall seconds of the row's own compute on this machine: training, healing, and a
    /// baseline's selection and surgery (calibration forwards); evaluation excluded.
    pub train_seconds: f64,
    pub answer_nll: Interval,
    #[serde(deserialize_with = "Option::deserialize")]
    pub delta_nll: Option<Interval>,
    /// Exact match (Wilson intervals): scored for the dense rows, the ELMs, the healed
    /// baselines and the controls; `None` for the rows the verdict does not read (at 135M every
    /// compressed model's EM is 0 or 1 of 16, which no interval separates).
    #[serde(default)]
    pub flexible_em: Option<Interval>,
    #[serde(default)]
    pub strict_em: Option<Interval>,
    /// Share of the exact-match answers the generation budget cut off (Wilson interval;
    /// `None` without exact match, or from a run before it was recorded).
    #[serde(default)]
    pub truncated: Option<Interval>,
    /// Retention RP = model / dense flexible exact match, paired over problems.
    #[serde(deserialize_with = "Option::deserialize")]
    pub rp_flexible: Option<Interval>,
    /// This compressed model's answer NLL minus the ELM's, paired over problems (the study's
    /// question: is the equilibrium module better than deleting or replacing the same layers?).
    /// `None` on the dense rows and the ELM's own.
    #[serde(deserialize_with = "Option::deserialize")]
    pub delta_nll_vs_elm: Option<Interval>,
}

/// Table 2: one-step vs multi-step KV.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvRow {
    pub m: usize,
    pub mode: String,
    /// Bytes of K/V the decoding session allocated (prompt + new tokens + 1 positions).
    pub kv_bytes: usize,
    /// Dense model's bytes for the same positions: N × (measured one-step bytes / (N − M + 1)).
    pub dense_kv_bytes: usize,
    pub ratio_vs_dense: f64,
    pub flexible_em: Interval,
    pub strict_em: Interval,
    pub mean_iterations: f64,
    pub layer_evals_per_token: f64,
}

/// Table 3: solver × δ.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SolverRow {
    /// Replaced layers of the ELM and its training steps (table 3 runs at the main ELM's M
    /// with the main budget, and at M = 14 with the sweep's ELM and its budget).
    #[serde(default)]
    pub m: usize,
    #[serde(default)]
    pub steps: usize,
    pub solver: String,
    pub tol: f64,
    pub mean_iterations: f64,
    pub max_iterations: usize,
    /// Fixed-point block evaluations per token.
    pub block_evals_per_token: f64,
    pub layer_evals_per_token: f64,
    /// 1 − block evaluations / Picard's at the same δ.
    pub compute_saved_vs_picard: f64,
    pub answer_nll: Interval,
    pub delta_nll: Interval,
}

/// Table 4: gradient rules.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GradRow {
    pub rule: String,
    pub steps: usize,
    pub seconds_per_step: f64,
    pub tokens_per_s: f64,
    pub peak_rss_bytes: u64,
    pub teacher_cache_hits: usize,
    pub teacher_cache_misses: usize,
    pub distill_after: f64,
    pub answer_nll: Interval,
    pub delta_nll: Interval,
}

/// Table 5: compression sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepRow {
    pub m: usize,
    pub method: String,
    pub params: usize,
    pub non_embedding_params: usize,
    pub kv_bytes_1k: usize,
    pub answer_nll: Interval,
    pub delta_nll: Interval,
}

/// Table 7b: spectral radius of trained ELM maps.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpectralRow {
    pub model: String,
    pub m: usize,
    pub sequences: usize,
    pub mean_radius: f64,
    pub min_radius: f64,
    pub max_radius: f64,
    pub max_rel_residual: f64,
}

/// Training throughput of every training of the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedRow {
    pub training: String,
    pub steps: usize,
    pub tokens: usize,
    pub seconds: f64,
    pub tokens_per_s: f64,
    pub teacher_cache_hits: usize,
    pub teacher_cache_misses: usize,
    /// Seconds spent computing the teacher states the cache missed, `None` for a training
    /// recorded before they were measured.
    #[serde(default)]
    pub teacher_computed_seconds: Option<f64>,
    /// Seconds the teacher cache saved (the hits' recorded cost minus reading them), `None`
    /// when the training or a file it read predates the measurement.
    #[serde(default)]
    pub teacher_saved_seconds: Option<f64>,
    pub peak_rss_bytes: u64,
}

/// `elm bench` figures the speed section reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchFigures {
    pub sgemm_gflop_s: f64,
    pub prefill_tok_s: f64,
    pub prefill_gflop_s: f64,
    pub decode_b1_tok_s: f64,
}

/// The figures the training-throughput section compares against.
impl From<&BenchReport> for BenchFigures {
    fn from(b: &BenchReport) -> Self {
        BenchFigures {
            sgemm_gflop_s: b.sgemm_gflop_s,
            prefill_tok_s: b.prefill_tok_s,
            prefill_gflop_s: b.prefill_gflop_s,
            decode_b1_tok_s: b.decode_b1_tok_s,
        }
    }
}

/// Two epochs of MetaMathQA's 395k problems: the paper's training, in problems seen (how far
/// beyond the curves' largest budget it lies is counted in problems, since the paper's token
/// count is not given).
pub const PAPER_PROBLEMS: f64 = 2.0 * 395_000.0;

/// Table 8: one point of a learning curve.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurvePoint {
    pub series: String,
    pub steps: usize,
    /// The point's own training tokens (steps × batch × sequence length).
    pub tokens: usize,
    /// Wall seconds of its training (and a baseline's selection and surgery) on this machine.
    pub compute_seconds: f64,
    pub answer_nll: Interval,
    /// This answer NLL minus the reference ELM's at the same number of steps, paired over
    /// problems (`None` on the reference's own points).
    #[serde(deserialize_with = "Option::deserialize")]
    pub minus_elm: Option<Interval>,
}

/// Table 8's reading of one curve against the reference ELM's.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurveTrend {
    pub series: String,
    /// Least-squares slope of answer NLL against log2(tokens): change per doubling.
    pub slope_per_doubling: f64,
    /// `minus_elm` at the smallest and at the largest budget (`None` for the reference).
    #[serde(deserialize_with = "Option::deserialize")]
    pub gap_smallest: Option<Interval>,
    #[serde(deserialize_with = "Option::deserialize")]
    pub gap_largest: Option<Interval>,
    /// Slope of the gap against log2(tokens) (`None` for the reference). Kept in tables.json
    /// for a reader's own fit, never printed: a line through a gap that rises and falls (a
    /// hump) reads as a trend that is not there.
    #[serde(deserialize_with = "Option::deserialize")]
    pub gap_slope_per_doubling: Option<f64>,
    /// The gap's change per doubling between the two largest budgets: only its sign is
    /// printed, as the direction the gap last moved in (nothing is extrapolated beyond the
    /// measured budgets).
    #[serde(deserialize_with = "Option::deserialize")]
    pub gap_last_segment_slope: Option<f64>,
    /// `grows`, `shrinks` or `crosses` (point estimates, smallest to largest budget; see the
    /// intervals for whether the change is sure), `n/a` for the reference.
    pub verdict: String,
}

/// Table 8.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Curves {
    /// The series every gap is paired with.
    pub reference: String,
    pub points: Vec<CurvePoint>,
    pub trends: Vec<CurveTrend>,
    /// log2 of [`PAPER_PROBLEMS`] over the largest budget's problems.
    pub doublings_to_paper: f64,
}

/// Table 9: one headline row trained with one seed at the main budget.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedRow {
    pub series: String,
    pub seed: u64,
    pub answer_nll: Interval,
    /// This answer NLL minus the reference ELM's trained with the same seed, paired over
    /// problems (`None` on the ELM's own rows).
    #[serde(deserialize_with = "Option::deserialize")]
    pub minus_elm: Option<Interval>,
}

/// Table 9's summary of one series over the seeds.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedSummary {
    pub series: String,
    /// Answer NLL over the seeds (beside the bootstrap interval over problems of each seed).
    pub answer_nll: Spread,
    /// `minus_elm` over the seeds (`None` for the ELM).
    #[serde(deserialize_with = "Option::deserialize")]
    pub minus_elm: Option<Spread>,
    /// `worse than the ELM at every seed` / `better than the ELM at every seed` when every
    /// seed's paired interval excludes 0 on the same side, else `not sure`; `n/a` for the ELM.
    pub verdict: String,
}

/// Table 9.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seeds {
    pub reference: String,
    pub rows: Vec<SeedRow>,
    pub summaries: Vec<SeedSummary>,
}

/// Table 11: is the equilibrium worth solving? Modules trained at the headline window and
/// budget as fixed loops (K applications) and as the solved ELM, each tested at fixed depths
/// K' and solved at two tolerances: validation NLL to choose, test NLL to report.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grid {
    /// Layers `[first, last]` of the window (the headline's).
    pub layers: (usize, usize),
    pub validation_problems: usize,
    pub test_problems: usize,
    /// The cells, trained model by trained model; the first trained model's solved cell at
    /// the ELM's default tolerance (δ = 0.5) is the reference of `minus_elm`.
    pub rows: Vec<GridRow>,
    /// Keys of its stages (trainings and evaluations; some are table 1's too), so that a page
    /// can state what the grid cost apart from the scale's own tables.
    #[serde(default)]
    pub stage_keys: Vec<String>,
}

/// How a module was trained or tested: `Fixed(K)` applications, or solved.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GridDepth {
    Fixed(usize),
    /// Solved by Anderson to the per-token tolerance δ (at most `max_iter` evaluations).
    Solved {
        tol: f64,
        max_iter: usize,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridRow {
    pub trained: GridDepth,
    pub tested: GridDepth,
    /// Mean answer NLL on the validation problems (what a choice reads).
    pub validation_nll: f64,
    /// Block evaluations per token on the validation problems (what a matched-compute
    /// choice reads).
    pub validation_evals: f64,
    /// Test answer NLL and block evaluations per token.
    pub answer_nll: Interval,
    pub block_evals_per_token: f64,
    /// This cell minus the solved ELM (trained and tested solved at δ = 0.5), paired (test).
    pub minus_elm: Interval,
    /// This cell minus the same module tested as trained, paired (test): what testing deeper
    /// or shallower than training changes (absent for the as-trained cell itself).
    pub minus_as_trained: Option<Interval>,
}
