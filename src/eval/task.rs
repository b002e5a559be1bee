//! One evaluation entry point for every model variant: a [`Task`] on an [`ElmModel`] (dense,
//! LoRA-merged dense, ELM, any baseline that loads as one) gives named metrics, each with
//! its per-item scores and bootstrap interval; [`TaskRun::pair_with`] adds the paired
//! comparison against a reference run on the same items.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::data::{gsm8k_sample, ProblemSample, Split};
use crate::equilibrium::infer::{ElmModel, InferenceConfig};
use crate::error::{ElmError, Result};
use crate::formats::tokenizer::Tokenizer;
use crate::registry::Registry;

use super::gsm8k::{answer_nll, eval_gsm8k, Gsm8kOptions, Sample};
use super::humaneval::{self, HumanEvalOptions, HumanEvalSample, Problem};
use super::nll::NllRun;
use super::solver_summary::SolverSummary;
use super::stats::{estimate, paired, BootstrapConfig, Estimate, ItemScore, PairedComparison};

crate::registry::variant_list! {
    /// What `elm eval --task` runs.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum Task("task") {
        /// Teacher-forced NLL per token of the GSM8K reference solutions.
        Gsm8kNll,
        /// GSM8K exact match (greedy), strict and flexible extraction.
        Gsm8k,
        /// HumanEval pass@1 (greedy), run in a sandboxed `python3`.
        HumanEval,
        /// Teacher-forced NLL per token of the HumanEval canonical solutions.
        HumanEvalNll,
    }
}

impl Task {
    /// The CLI / JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Task::Gsm8kNll => "gsm8k-nll",
            Task::Gsm8k => "gsm8k",
            Task::HumanEval => "humaneval",
            Task::HumanEvalNll => "humaneval-nll",
        }
    }
    /// Whether the task generates (so it needs new tokens), else it scores reference answers.
    pub fn generates(self) -> bool {
        match self {
            Task::Gsm8k | Task::HumanEval => true,
            Task::Gsm8kNll | Task::HumanEvalNll => false,
        }
    }
}

impl std::str::FromStr for Task {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        <Task as Registry>::from_name(s).ok_or_else(|| {
            ElmError::config(
                "task",
                format!("`{s}`: expected {}", crate::registry::names_or::<Task>()),
            )
        })
    }
}

/// Settings of a task run.
#[derive(Clone, Debug)]
pub struct TaskOptions {
    /// First `limit` items of the split (`None` = all).
    pub limit: Option<usize>,
    /// Sequences per forward batch.
    pub batch: usize,
    /// Generation tasks: new tokens per item.
    pub max_new_tokens: usize,
    pub inference: InferenceConfig,
    pub bootstrap: BootstrapConfig,
    /// HumanEval: the sandbox's wall-clock limit per program, seconds.
    pub timeout_s: f64,
    /// HumanEval: run generated code without the bubblewrap boundary where it cannot be set
    /// up ([`super::sandbox::SandboxConfig::run_without_boundary`]).
    pub run_without_sandbox: bool,
}

impl TaskOptions {
    pub fn validate(&self) -> Result<()> {
        if self.limit == Some(0) {
            return Err(ElmError::config(
                "limit",
                "must be >= 1 (omit it for all items)",
            ));
        }
        if self.batch == 0 {
            return Err(ElmError::config("batch", "must be >= 1"));
        }
        // Checked before any data is read or any model run, so a bad option costs nothing.
        self.bootstrap.validate()?;
        // Checked before any data is read, for every task (a wall-clock limit must be one).
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err(ElmError::config(
                "timeout",
                format!("must be finite and > 0 seconds, got {}", self.timeout_s),
            ));
        }
        self.inference.validate()
    }
}

/// One metric of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MetricReport {
    pub estimate: Estimate,
    pub higher_is_better: bool,
    /// Against the reference run, when one was paired.
    pub paired: Option<PairedComparison>,
    pub items: Vec<ItemScore>,
}

/// The items a task runs on, loaded and checked.
pub enum TaskData {
    Gsm8k {
        ids: Vec<String>,
        examples: Vec<crate::data::QaExample>,
    },
    HumanEval(Vec<Problem>),
}

impl TaskData {
    /// Loads the task's items from `data_dir`: GSM8K's `split` (test or validation, see
    /// [`Split`]) sampled by `sample`; HumanEval (test only), its first `sample.size()`
    /// problems. A GSM8K item's id is its index in the split (prefixed `validation/` there, so
    /// that a validation run never pairs with a test run).
    pub fn load(task: Task, data_dir: &Path, split: Split, sample: ProblemSample) -> Result<Self> {
        let take = sample.size();
        Ok(match task {
            Task::Gsm8k | Task::Gsm8kNll => {
                if split == Split::Train {
                    return Err(ElmError::config(
                        "split",
                        "evaluation reads the validation or the test split, never the problems trained on",
                    ));
                }
                let (ids, examples) = gsm8k_sample(data_dir, split, sample)?
                    .into_iter()
                    .map(|(i, q)| match split {
                        Split::Test => (i.to_string(), q),
                        _ => (format!("{}/{i}", split.name()), q),
                    })
                    .unzip();
                TaskData::Gsm8k { ids, examples }
            }
            Task::HumanEval | Task::HumanEvalNll if split != Split::Test => {
                return Err(ElmError::config(
                    "split",
                    "HumanEval has only its test problems",
                ))
            }
            Task::HumanEval | Task::HumanEvalNll => TaskData::HumanEval(
                humaneval::load_problems(&humaneval::problems_path(data_dir))?
                    .into_iter()
                    .take(take)
                    .collect(),
            ),
        })
    }
    pub fn len(&self) -> usize {
        match self {
            TaskData::Gsm8k { ids, .. } => ids.len(),
            TaskData::HumanEval(p) => p.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one model did on a task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskRun {
    pub task: Task,
    pub n: usize,
    /// Metric name → report (e.g. `answer_nll`; `strict_match` and `flexible_extract`).
    pub metrics: BTreeMap<String, MetricReport>,
    /// exp(mean NLL) for NLL tasks.
    pub perplexity: Option<f64>,
    pub seconds: f64,
    /// Tokens per second: processed tokens (prompts included) for NLL tasks, generated
    /// tokens for generation tasks.
    pub tok_s: f64,
    pub tokens: usize,
    /// Fixed-point statistics (per sequence solve for NLL, per decoded token otherwise).
    pub solver: SolverSummary,
    pub gsm8k_samples: Vec<Sample>,
    pub humaneval_samples: Vec<HumanEvalSample>,
}

impl TaskRun {
    /// Adds to every metric its paired comparison against `reference` (same task, items).
    pub fn pair_with(&mut self, reference: &TaskRun, cfg: &BootstrapConfig) -> Result<()> {
        if reference.task != self.task {
            return Err(ElmError::InvalidArgument(format!(
                "pairing {:?} with a {:?} run",
                self.task, reference.task
            )));
        }
        for (name, m) in self.metrics.iter_mut() {
            let r = reference.metrics.get(name).ok_or_else(|| {
                ElmError::InvalidArgument(format!("reference run has no metric {name}"))
            })?;
            m.paired = Some(paired(&m.items, &r.items, cfg)?);
        }
        Ok(())
    }
}

fn metric(
    items: Vec<ItemScore>,
    higher_is_better: bool,
    cfg: &BootstrapConfig,
) -> Result<MetricReport> {
    Ok(MetricReport {
        estimate: estimate(&items, cfg)?,
        higher_is_better,
        paired: None,
        items,
    })
}

/// A 0/1 metric (exact match, pass@1): the proportion with Wilson's interval, which stays
/// honest at 0 or n successes where a bootstrap's collapses to a point.
fn proportion_metric(
    items: Vec<ItemScore>,
    higher_is_better: bool,
    cfg: &BootstrapConfig,
) -> Result<MetricReport> {
    let successes = items.iter().filter(|it| it.value == 1.0).count();
    Ok(MetricReport {
        estimate: crate::eval::stats::wilson(successes, items.len(), cfg.level)?,
        higher_is_better,
        paired: None,
        items,
    })
}

fn nll_run(task: Task, run: NllRun, name: &str, cfg: &BootstrapConfig) -> Result<TaskRun> {
    let m = metric(run.items, false, cfg)?;
    Ok(TaskRun {
        task,
        n: m.items.len(),
        perplexity: Some(m.estimate.value.exp()),
        metrics: BTreeMap::from([(name.to_string(), m)]),
        seconds: run.seconds,
        tok_s: run.tok_s,
        tokens: run.tokens_processed,
        solver: run.solver,
        gsm8k_samples: vec![],
        humaneval_samples: vec![],
    })
}

/// Runs `task` on `data` with `model`; `on_progress(done, total)` after each batch.
pub fn run_task(
    model: &ElmModel,
    tok: &Tokenizer,
    task: Task,
    data: &TaskData,
    opts: &TaskOptions,
    mut on_progress: impl FnMut(usize, usize) + Send,
) -> Result<TaskRun> {
    opts.validate()?;
    if data.is_empty() {
        return Err(ElmError::InvalidArgument(format!("{task:?}: no items")));
    }
    let total = data.len();
    let cfg = &opts.bootstrap;
    match (task, data) {
        (Task::Gsm8kNll, TaskData::Gsm8k { ids, examples }) => {
            let run = answer_nll(
                model,
                tok,
                ids,
                examples,
                &opts.inference,
                opts.batch,
                |d| on_progress(d, total),
            )?;
            nll_run(task, run, "answer_nll", cfg)
        }
        (Task::Gsm8k, TaskData::Gsm8k { ids, examples }) => {
            let g = Gsm8kOptions {
                batch: opts.batch,
                max_new_tokens: opts.max_new_tokens,
                inference: opts.inference.clone(),
            };
            let r = eval_gsm8k(model, tok, ids, examples, &g, |d| on_progress(d, total))?;
            Ok(TaskRun {
                task,
                n: r.n,
                metrics: BTreeMap::from([
                    (
                        "strict_match".to_string(),
                        proportion_metric(r.strict_items, true, cfg)?,
                    ),
                    (
                        "flexible_extract".to_string(),
                        proportion_metric(r.flexible_items, true, cfg)?,
                    ),
                    // What share of the answers the generation budget cut off (lower is
                    // better): an exact match of 0 means little where this is high.
                    (
                        "truncated".to_string(),
                        proportion_metric(r.truncated_items, false, cfg)?,
                    ),
                ]),
                perplexity: None,
                seconds: r.run.seconds,
                tok_s: r.run.tok_s,
                tokens: r.run.generated_tokens,
                solver: r.run.solver,
                gsm8k_samples: r.samples,
                humaneval_samples: vec![],
            })
        }
        (Task::HumanEvalNll, TaskData::HumanEval(problems)) => {
            let run =
                humaneval::solution_nll(model, tok, problems, &opts.inference, opts.batch, |d| {
                    on_progress(d, total)
                })?;
            nll_run(task, run, "solution_nll", cfg)
        }
        (Task::HumanEval, TaskData::HumanEval(problems)) => {
            let h = HumanEvalOptions {
                batch: opts.batch,
                max_new_tokens: opts.max_new_tokens,
                inference: opts.inference.clone(),
                timeout_s: opts.timeout_s,
                run_without_sandbox: opts.run_without_sandbox,
            };
            let r = humaneval::eval_humaneval(model, tok, problems, &h, |d| on_progress(d, total))?;
            Ok(TaskRun {
                task,
                n: r.samples.len(),
                metrics: BTreeMap::from([(
                    "pass_at_1".to_string(),
                    proportion_metric(r.items, true, cfg)?,
                )]),
                perplexity: None,
                seconds: r.run.seconds,
                tok_s: r.run.tok_s,
                tokens: r.run.generated_tokens,
                solver: r.run.solver,
                gsm8k_samples: vec![],
                humaneval_samples: r.samples,
            })
        }
        (Task::Gsm8kNll | Task::Gsm8k, TaskData::HumanEval(_))
        | (Task::HumanEval | Task::HumanEvalNll, TaskData::Gsm8k { .. }) => Err(
            ElmError::InvalidArgument(format!("{task:?}: data loaded for another task")),
        ),
    }
}

/// Tokens of the task's longest sequence and the most tokens one sequence has scored: prompt
/// and answer for the NLL tasks (the answer scored), prompt and `max_new_tokens` for the
/// generation tasks (chat template included for GSM8K).
pub fn longest_sequence(
    tok: &Tokenizer,
    task: Task,
    data: &TaskData,
    max_new_tokens: usize,
) -> Result<(usize, usize)> {
    let count = |text: &str| tok.encode(text, false).map(|ids| ids.len());
    let (mut longest, mut scored) = (0, 0);
    let mut take = |prompt: usize, answer: usize| {
        longest = longest.max(prompt + answer);
        scored = scored.max(answer);
    };
    match data {
        TaskData::Gsm8k { examples, .. } => {
            for e in examples {
                let prompt = count(&crate::data::qa_prompt(tok, &e.question))?;
                match task {
                    Task::Gsm8kNll => take(
                        prompt,
                        count(&crate::data::QaLayout::of(tok).answer(&e.answer))?,
                    ),
                    Task::Gsm8k | Task::HumanEval | Task::HumanEvalNll => {
                        take(prompt, max_new_tokens)
                    }
                }
            }
        }
        TaskData::HumanEval(problems) => {
            for p in problems {
                let prompt = count(&p.prompt)? + 1;
                match task {
                    Task::HumanEvalNll => take(prompt, count(&p.canonical_solution)? + 1),
                    Task::Gsm8kNll | Task::Gsm8k | Task::HumanEval => take(prompt, max_new_tokens),
                }
            }
        }
    }
    Ok((longest, scored))
}

/// `elm eval`'s memory: `loaded` (the models, measured or predicted by the caller), the model
/// file while it was read, and the batches in flight — with a single-threaded BLAS one per
/// core (`teacher_forced_nll`) — each with its KV cache and one layer's activations over the
/// longest sequence, and the logits of one sequence's scored tokens (NLL) or of each row's
/// next token (generation).
pub fn memory_estimate(
    model: &ElmModel,
    tok: &Tokenizer,
    task: Task,
    data: &TaskData,
    opts: &TaskOptions,
    loaded: u64,
    model_file: u64,
) -> Result<crate::memory::MemoryEstimate> {
    use crate::memory::{forward_bytes, kv_cache_bytes, MemoryEstimate};
    let cfg = model.config();
    let (tokens, scored) = longest_sequence(tok, task, data, opts.max_new_tokens)?;
    let batch = opts.batch.min(data.len()).max(1);
    let in_flight = if crate::model::ops::blas_threads() == 1 {
        rayon::current_num_threads().clamp(1, data.len().div_ceil(batch).max(1))
    } else {
        1
    } as u64;
    let logit_rows = match task {
        Task::Gsm8kNll | Task::HumanEvalNll => scored,
        Task::Gsm8k | Task::HumanEval => batch,
    };
    let kv = kv_cache_bytes(cfg, batch, tokens);
    let activations = forward_bytes(cfg, batch, tokens, logit_rows);
    let estimate = MemoryEstimate::loaded_model("eval", loaded, model_file);
    // Teacher-forced scoring packs its frozen weights once (`teacher_forced_nll`).
    let estimate = match task {
        Task::Gsm8kNll | Task::HumanEvalNll => estimate.with_held(
            "packed frozen weights",
            model.frozen_for_scoring().expected_packed_bytes(1),
        ),
        Task::Gsm8k | Task::HumanEval => estimate,
    };
    Ok(estimate.with_phase(
        "scoring",
        &[
            ("KV caches", kv.saturating_mul(in_flight)),
            ("activations", activations.saturating_mul(in_flight)),
        ],
    ))
}
