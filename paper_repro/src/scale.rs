//! Run sizes: `smoke` (CI, about 2 minutes), `small` (SmolLM2-135M on a 2-core CPU; the compute
//! time of its last run is in the README's headline block), `long` (`small` plus learning curves
//! and seeds, tables 8 and 9; it reuses `small`'s stages when run in the same results directory),
//! `paper` (Qwen2.5-1.5B from local HF weights, for a machine with time or a GPU).

use clap::ValueEnum;
use elm::compress::PruneMethod;
use elm::gemm::Precision;
use serde::Serialize;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    Smoke,
    Small,
    Long,
    Paper,
}

/// Steps and batch shape of one training budget (tokens = steps × batch × seq_len at most).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Budget {
    pub steps: usize,
    pub batch_size: usize,
    pub seq_len: usize,
    /// Seeds the data order and the training's own randomness (LoRA init, dropout); 0 at every
    /// table but the seeds table, so that the stage keys of earlier runs hold.
    pub seed: u64,
}

impl Budget {
    pub fn max_tokens(&self) -> usize {
        self.steps * self.batch_size * self.seq_len
    }
    /// The same schedule shape with `steps` steps (a point of a learning curve).
    pub fn with_steps(self, steps: usize) -> Self {
        Budget { steps, ..self }
    }
    pub fn with_seed(self, seed: u64) -> Self {
        Budget { seed, ..self }
    }
}

/// Tables 8 and 9: every curve's method trained from scratch at each of `steps` (the main
/// budget's batch shape and schedule; the main budget is one of them), the headline series (the
/// reference ELM, the best healed baseline, the tuned dense model) also at each of
/// `headline_steps`, and the headline rows trained again with each of `seeds` (0 is the main
/// table's) at the main budget.
#[derive(Clone, Debug, Serialize)]
pub struct CurveStudy {
    pub steps: Vec<usize>,
    /// Larger budgets for the headline series only: the span that settles the trend where the
    /// verdict reads it, without training every other series that long.
    pub headline_steps: Vec<usize>,
    pub seeds: Vec<u64>,
}

impl CurveStudy {
    /// The budgets of a headline series: `steps` and `headline_steps`, ascending.
    pub fn headline_budgets(&self) -> Vec<usize> {
        let mut all: Vec<usize> = self
            .steps
            .iter()
            .chain(&self.headline_steps)
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// The train-K × test-K grid's sizes (table 11).
#[derive(Clone, Debug, Serialize)]
pub struct GridSizes {
    /// The fixed loops trained beside the ELM (K applications).
    pub train_ks: Vec<usize>,
    /// The fixed depths K' every trained module is tested at.
    pub test_ks: Vec<usize>,
    /// The tolerances δ every trained module is also solved to (the study's δ = 0.5 first).
    pub test_tols: Vec<f64>,
}

impl GridSizes {
    /// The issue's grid: K ∈ {1, 2, 4, 8} trained, K' ∈ {1, …, 32} and δ ∈ {0.5, 0.1} tested.
    pub fn full() -> Self {
        GridSizes {
            train_ks: vec![1, 2, 4, 8],
            test_ks: vec![1, 2, 4, 8, 16, 32],
            test_tols: vec![0.5, 0.1],
        }
    }
}

/// Sizes of one scale.
#[derive(Clone, Debug, Serialize)]
pub struct Limits {
    /// GSM8K test problems of the main table's answer-NLL figure (the primary signal at
    /// 135M): a seeded random sample ([`crate::runs::SAMPLE_SEED`]).
    pub nll_eval: usize,
    /// The ablation tables' answer NLL (solver, gradient rules, sweep): the first problems of
    /// the same permutation, so a subset of the main table's.
    pub ablation_nll_eval: usize,
    /// GSM8K validation problems (the end of train.jsonl, which no training reads) that every
    /// selection scores on: the best baselines, the windows, the held-out figures.
    pub validation_eval: usize,
    /// Table 1b: the headline rows and the controls scored again on this many test problems
    /// (`long`: all 1,319; `None` at `small`, which scores every row on `nll_eval`).
    pub full_test: Option<usize>,
    /// GSM8K test problems of the exact-match figures (greedy generation; the same seeded
    /// permutation).
    pub gsm8k_eval: usize,
    /// New tokens of table 2's KV generation, and the exact-match budget's size for the ETA.
    pub max_new_tokens: usize,
    /// The exact-match runs' generation budget (`elm eval --max-new-tokens`): `auto` sizes it
    /// from the validation split's reference solutions (their 99th percentile), so that no
    /// answer is cut off by a budget shorter than the answers the model was tuned on.
    pub em_budget: elm::eval::gsm8k::MaxNewTokens,
    /// The main-results models (ELM and the trained baselines, one budget for all).
    pub main: Budget,
    /// The ablations (gradient rules, compression sweep, KV ablation), one budget for all.
    pub study: Budget,
    /// LoRA tuning of the dense reference: `main` at every scale but `smoke`, whose 32-token
    /// sequences hold no answer token to tune on.
    pub lora: Budget,
    pub held_out: usize,
    pub bench: bool,
    /// First replaced layer of every window (the study's l).
    pub start: usize,
    /// M of the main results, solver and gradient-rule ablations.
    pub m: usize,
    /// M values of the compression sweep (table 5).
    pub sweep: Vec<usize>,
    /// M values of the one-step KV ablation (table 2).
    pub kv_ms: Vec<usize>,
    /// Per-token absolute residual tolerances δ of the solver ablation (table 3).
    pub tolerances: Vec<f64>,
    /// Training-free baselines (`elm prune --method`).
    pub baselines: Vec<&'static str>,
    /// Baselines of `baselines` that also get a LoRA healing fine-tune (r = 8, α = 16, all
    /// linear layers) with the `lora` budget (= `main` but at smoke), merged afterwards (Shortened-LLaMA's recovery;
    /// "ReplaceMe + the same fine-tune").
    pub healed: Vec<&'static str>,
    pub calibration_tokens: usize,
    /// Looped baseline: block applications K.
    pub looped_k: usize,
    /// GSM8K test sequences of the spectral-radius estimate.
    pub spectral_sequences: usize,
    /// Train on the first N GSM8K training problems only (`None`: all 7,473).
    pub train_examples: Option<usize>,
    /// Table 6: GPPO and the enumeration it is checked against.
    pub search: SearchBudget,
    /// Table 1's rows of the ELM and LLM-Streamline started from LaCo's merge of the window
    /// (two more trainings; left to `paper` by `small`).
    pub la_co_init_rows: bool,
    /// Table 1's rows that answer neither the paper's table nor the study's question, left out
    /// by `small` to fit 90 minutes: LLM-Streamline's FFN variant and ELM + heal (a row no
    /// paper has), about 6 minutes on 2 cores.
    pub extra_rows: bool,
    /// Tables 8 and 9 (`long` and `smoke`; absent at `small`, which must fit 90 minutes).
    pub curves: Option<CurveStudy>,
    /// Table 10, the collapse diagnosis: ELMs trained at the main budget from these starts under
    /// both distillation recipes (empty at `small`: about 15 more minutes).
    pub collapse_starts: Vec<usize>,
    /// Table 11, the train-K × test-K grid: its sizes where the scale runs it (`long`: five
    /// trainings and 80 evaluations, not part of `small`'s 90 minutes; `smoke`: a corner of it).
    /// `--only grid` runs it at any scale, at `long`'s sizes where the scale has none.
    pub grid: Option<GridSizes>,
    /// Number format of the large products of every model command (training, LoRA, pruning
    /// calibration, evaluation; `elm --precision`). `small` and `long` use bf16 (AVX-512 BF16
    /// dot products, f32 accumulation, weights and optimiser state): about 1.6× the f32 speed
    /// on a 2-core Zen 4, where f32 alone would not fit 90 minutes; docs/performance.md's bf16-quality
    /// block measures what it changes in a trained model. `smoke` and `paper` keep f32.
    pub precision: Precision,
    /// Table 6b: the ELM trained at the main budget from every `n`-th start (and the last),
    /// ranked on validation problems, the ranking GPPO and the selectors are placed on (`long`:
    /// every start; `None` at `small`, which trains only table 1's windows and GPPO's).
    pub trained_starts_every: Option<usize>,
}

/// Table 6's budget: GPPO steps, and the enumeration (every `enum_every`-th start trained
/// `enum_steps` steps, scored on `enum_eval` held-out problems), all at `seq_len` tokens.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SearchBudget {
    pub gppo_steps: usize,
    pub enum_steps: usize,
    pub enum_every: usize,
    pub enum_eval: usize,
    pub seq_len: usize,
}

/// `elm prune --method` names of `methods`.
fn names(methods: &[PruneMethod]) -> Vec<&'static str> {
    methods.iter().map(|m| m.name()).collect()
}

/// Every training-free baseline: the library's one list of methods.
fn baselines() -> Vec<&'static str> {
    names(&PruneMethod::ALL)
}

/// Every deletion criterion of the issue gets the shared heal: Shortened-LLaMA's two criteria
/// (its recipe), and ShortGPT and ReplaceMe "with the same fine-tune" for fairness.
const HEALED: [PruneMethod; 4] = [
    PruneMethod::ShortenedPpl,
    PruneMethod::ShortenedTaylor,
    PruneMethod::ShortGpt,
    PruneMethod::ReplaceMeLs,
];

/// `small` heals the two strongest healed baselines of earlier runs (ReplaceMe and
/// Shortened-LLaMA's PPL criterion); ShortGPT and the Taylor criterion are healed at `paper`,
/// so that the main job fits 90 minutes on 2 cores.
const SMALL_HEALED: [PruneMethod; 2] = [PruneMethod::ShortenedPpl, PruneMethod::ReplaceMeLs];

impl Limits {
    /// The limits for a model of `num_layers` layers. The windows (`start`, `m`, the sweep's and
    /// the KV table's M) are the paper's, written for 28–30-layer models (Qwen2.5-1.5B,
    /// SmolLM2-135M); a shallower model (Gemma 3 270M: 18) gets them scaled by
    /// `num_layers / 30`, so the window keeps its place and share of the stack
    /// (Gemma 3: layers 7–11 of 18 for SmolLM2's 12–19 of 30).
    pub fn for_layers(mut self, num_layers: usize) -> Self {
        const WRITTEN_FOR: usize = 30;
        if num_layers >= 28 {
            return self;
        }
        let scale = |x: usize| {
            ((x * num_layers) as f64 / WRITTEN_FOR as f64)
                .round()
                .max(1.0) as usize
        };
        self.start = scale(self.start).min(num_layers.saturating_sub(2));
        self.m = scale(self.m).clamp(1, num_layers - self.start - 1);
        let fits = |ms: &[usize]| {
            let mut v: Vec<usize> = ms
                .iter()
                .map(|&m| scale(m))
                .filter(|&m| m + 2 <= num_layers)
                .collect();
            v.dedup();
            v
        };
        self.sweep = fits(&self.sweep);
        self.collapse_starts = {
            let mut v: Vec<usize> = self
                .collapse_starts
                .iter()
                .map(|&s| scale(s).min(num_layers - self.m - 1))
                .collect();
            v.dedup();
            v
        };
        self.kv_ms = fits(&self.kv_ms);
        self
    }
}

impl Scale {
    pub fn limits(self) -> Limits {
        match self {
            Scale::Smoke => Limits {
                nll_eval: 2,
                ablation_nll_eval: 2,
                validation_eval: 2,
                // Table 1b's code path, on a sample a little larger than table 1's.
                full_test: Some(3),
                gsm8k_eval: 1,
                max_new_tokens: 8,

                em_budget: elm::eval::gsm8k::MaxNewTokens::Fixed(8),
                main: Budget {
                    steps: 2,
                    batch_size: 1,
                    seq_len: 32,
                    seed: 0,
                },
                study: Budget {
                    steps: 2,
                    batch_size: 1,
                    seq_len: 32,
                    seed: 0,
                },
                lora: Budget {
                    steps: 2,
                    batch_size: 1,
                    seq_len: 128,
                    seed: 0,
                },
                held_out: 1,
                bench: false,
                start: 12,
                m: 8,
                sweep: vec![8, 14],
                kv_ms: vec![8, 14],
                tolerances: vec![1.0, 0.5],
                // Three of the five keep smoke within its CI budget; `small` and `paper` run all.
                baselines: names(&[
                    PruneMethod::ShortGpt,
                    PruneMethod::WindowDelete,
                    PruneMethod::LaCo,
                ]),
                healed: names(&[PruneMethod::WindowDelete]),
                calibration_tokens: 64,
                looped_k: 2,
                spectral_sequences: 1,
                train_examples: Some(32),
                search: SearchBudget {
                    gppo_steps: 2,
                    enum_steps: 1,
                    enum_every: 11,
                    enum_eval: 1,
                    seq_len: 128,
                },
                la_co_init_rows: true,
                extra_rows: true,
                curves: Some(CurveStudy {
                    steps: vec![1, 2],
                    headline_steps: vec![4],
                    seeds: vec![0, 1],
                }),
                collapse_starts: vec![3, 5, 12],
                grid: Some(GridSizes {
                    train_ks: vec![1],
                    test_ks: vec![1, 2],
                    test_tols: vec![0.5],
                }),
                precision: Precision::F32,
                trained_starts_every: Some(11),
            },
            Scale::Small => Limits {
                nll_eval: 300,
                // The first 60 of table 1's 300: what fits the 90 minutes with table 1 at 300.
                ablation_nll_eval: 60,
                validation_eval: 100,
                full_test: None,
                gsm8k_eval: 16,
                max_new_tokens: 96,

                em_budget: elm::eval::gsm8k::MaxNewTokens::FromReferences,
                main: Budget {
                    steps: 300,
                    batch_size: 2,
                    seq_len: 128,
                    seed: 0,
                },
                study: Budget {
                    steps: 60,
                    batch_size: 2,
                    seq_len: 128,
                    seed: 0,
                },
                lora: Budget {
                    steps: 300,
                    batch_size: 2,
                    seq_len: 128,
                    seed: 0,
                },
                held_out: 16,
                bench: true,
                start: 12,
                m: 8,
                sweep: vec![4, 6, 8, 10, 12, 14],
                kv_ms: vec![8, 14],
                tolerances: vec![1.0, 0.5, 0.1],
                baselines: baselines(),
                healed: names(&SMALL_HEALED),
                calibration_tokens: 2048,
                looped_k: 4,
                spectral_sequences: 8,
                train_examples: None,
                search: SearchBudget {
                    gppo_steps: 100,
                    enum_steps: 8,
                    enum_every: 2,
                    enum_eval: 16,
                    seq_len: 128,
                },
                la_co_init_rows: false,
                extra_rows: false,
                curves: None,
                collapse_starts: vec![],
                grid: None,
                precision: Precision::Bf16,
                trained_starts_every: None,
            },
            // `small`'s every table with its two extra rows, plus learning curves (¼ to 8 times
            // the main budget, a 32× span, for the headline series), two more seeds of the
            // headline rows, table 1b on the whole test set, table 6b and table 10.
            Scale::Long => Limits {
                // Every series at ¼ to 2 times the main budget; the headline series on to 8
                // times it (1,200 and 2,400 steps: a 32× span).
                curves: Some(CurveStudy {
                    steps: vec![75, 150, 300, 600],
                    headline_steps: vec![1200, 2400],
                    seeds: vec![0, 1, 2],
                }),
                // The starts issue 40 names: the best healed baseline's window, the one GPPO
                // picked and which collapsed (7.8 nats), and the study's.
                collapse_starts: vec![3, 5, 12],
                grid: Some(GridSizes::full()),
                // Every start at the main budget: 23 trainings for SmolLM2 at M = 8.
                trained_starts_every: Some(1),
                extra_rows: true,
                // All of GSM8K's test split (issue 40: the headline rows and the controls).
                full_test: Some(1319),
                ..Scale::Small.limits()
            },
            Scale::Paper => Limits {
                nll_eval: 1319,
                ablation_nll_eval: 1319,
                validation_eval: 500,
                // Every row is scored on the whole test set already.
                full_test: None,
                gsm8k_eval: 1319,
                max_new_tokens: 256,

                em_budget: elm::eval::gsm8k::MaxNewTokens::FromReferences,
                main: Budget {
                    steps: 2000,
                    batch_size: 8,
                    seq_len: 256,
                    seed: 0,
                },
                study: Budget {
                    steps: 500,
                    batch_size: 8,
                    seq_len: 256,
                    seed: 0,
                },
                lora: Budget {
                    steps: 2000,
                    batch_size: 8,
                    seq_len: 256,
                    seed: 0,
                },
                held_out: 64,
                bench: true,
                start: 12,
                m: 8,
                sweep: vec![4, 6, 8, 10, 12, 14],
                kv_ms: vec![8, 14],
                tolerances: vec![2.0, 1.0, 0.5, 0.1],
                baselines: baselines(),
                healed: names(&HEALED),
                calibration_tokens: 16384,
                looped_k: 4,
                spectral_sequences: 32,
                train_examples: None,
                search: SearchBudget {
                    gppo_steps: 400,
                    enum_steps: 50,
                    enum_every: 1,
                    enum_eval: 64,
                    seq_len: 256,
                },
                la_co_init_rows: true,
                extra_rows: true,
                curves: None,
                collapse_starts: vec![3, 5, 12],
                grid: None,
                precision: Precision::F32,
                trained_starts_every: Some(1),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scale_fits_the_model_and_the_issue() {
        for s in [Scale::Smoke, Scale::Small, Scale::Long, Scale::Paper] {
            let l = s.limits();
            // SmolLM2-135M has 30 layers; Qwen2.5-1.5B 28.
            for &m in l.sweep.iter().chain(&l.kv_ms).chain([&l.m]) {
                assert!(
                    l.start + m <= 28,
                    "{s:?}: window [{}, {})",
                    l.start,
                    l.start + m
                );
            }
            assert!(l.sweep.contains(&l.m), "{s:?}: the sweep holds the main M");
            assert!(
                l.kv_ms.iter().all(|m| l.sweep.contains(m)),
                "{s:?}: KV models come from the sweep"
            );
            assert!(
                l.healed.iter().all(|h| l.baselines.contains(h)),
                "{s:?}: a healed baseline is one of the baselines"
            );
        }
        for s in [Scale::Smoke, Scale::Long] {
            let l = s.limits();
            let c = l.curves.as_ref().expect("curves at smoke and long");
            assert!(
                c.steps.len() >= 2 && c.steps.contains(&l.main.steps),
                "{s:?}"
            );
            assert!(c.seeds.contains(&0), "{s:?}: seed 0 is the main table's");
        }
        let long = Scale::Long.limits();
        let c = long.curves.as_ref().unwrap();
        assert!(c.steps.len() >= 4 && c.seeds.len() >= 3);
        // Issue 40: the curves span 32× (to 1,200 and 2,400 steps).
        let all = c.headline_budgets();
        assert!(all.iter().max().unwrap() / all.iter().min().unwrap() >= 32);
        assert!(all.contains(&1200) && all.contains(&2400));
        for s in [Scale::Small, Scale::Paper] {
            let l = s.limits();
            assert_eq!(
                l.lora.max_tokens(),
                l.main.max_tokens(),
                "{s:?}: the reference is tuned with the trainings' budget"
            );
        }
        let small = Scale::Small.limits();
        assert_eq!(small.sweep, vec![4, 6, 8, 10, 12, 14]);
        assert!(small.tolerances.len() >= 3);
        assert_eq!(small.kv_ms, vec![8, 14]);
    }

    /// The paper's windows stay on 28–30 layers and scale onto Gemma 3 270M's 18: the same
    /// place and share of the stack, every window inside the model with a layer after it.
    #[test]
    fn windows_scale_to_a_shallower_model() {
        let small = Scale::Small.limits();
        assert_eq!(small.clone().for_layers(30).start, 12);
        assert_eq!(small.clone().for_layers(28).m, 8);
        let g = small.for_layers(18);
        assert_eq!((g.start, g.m), (7, 5));
        assert_eq!(g.sweep, vec![2, 4, 5, 6, 7, 8]);
        assert_eq!(g.kv_ms, vec![5, 8]);
        assert!(g.sweep.iter().all(|&m| m + 2 <= 18) && g.start + g.m < 18);
    }
}
