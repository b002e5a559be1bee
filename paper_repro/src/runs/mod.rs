//! The study's steps as cached stages (see [`crate::stage`]), each one `elm ... --json` call
//! (or two) whose output is decoded into the library's report type (`TaskRun`, `TrainOutcome`,
//! `PruneReport`, ...), with the keys the command adds beside it, so that a field the library
//! renames breaks this crate's build or its unit tests, not a study run. A stage's config
//! holds everything its result depends on: the model's identity (path, size, modification
//! time), the data directory, the settings, and the keys of the stages it reads.

use std::path::{Path, PathBuf};

use elm::equilibrium::accounting::{KvReport, ParamReport};
use elm::equilibrium::train::TrainOutcome;
use elm::equilibrium::TrainConfig;
use elm::eval::task::MetricReport;
use elm::eval::{Task, TaskRun};
use elm::lora::LoraReport;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::elm_cli::{args, path_arg, ElmCli, Unread};
use crate::error::ReproError;
use crate::scale::{Budget, Limits};
use crate::stage::{Done, Stages};

mod measure;
mod search;

pub use measure::*;
pub use search::*;

/// What every stage shares.
pub struct Ctx<'a> {
    pub elm: &'a ElmCli,
    pub stages: Stages,
    /// The model compressed models are cut from: the given dense model until the LoRA stage,
    /// then its tuned version.
    pub model: PathBuf,
    /// Path, size and modification time of the model file(s): part of every stage key.
    pub model_id: String,
    pub data_dir: PathBuf,
    pub limits: &'a Limits,
    /// Shared teacher-state cache of the trainings (`elm train --teacher-cache`).
    pub teacher_cache: PathBuf,
    /// The dense model's name in table rows ([`model_name`]).
    pub model_name: String,
    /// Whether the model's family has feed-forward-only module blocks (Gemma 3 does not:
    /// `ElmConfig::validate`); without them the FFN-only rows are left out (the README says so).
    pub ffn_blocks: bool,
    /// The dense model's layer count.
    pub num_layers: usize,
    /// What the ELM trainings divide their distillation MSE by (`LambdaSchedule::distill_scale`).
    pub distill_scale: elm::equilibrium::DistillScale,
}

/// The name a model file goes by in the tables: the two fetched checkpoints by name, any other
/// by its file (or directory) name.
pub fn model_name(path: &Path) -> String {
    let file = path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    match file.as_str() {
        elm::formats::SMOLLM2_GGUF => "SmolLM2-135M-Instruct".into(),
        elm::formats::GEMMA3_GGUF => "Gemma 3 270M (base)".into(),
        _ => file,
    }
}

/// `path|size|mtime` of a file, or of every file of a directory.
pub fn file_identity(path: &Path) -> String {
    let one = |p: &Path| {
        std::fs::metadata(p).map_or_else(
            |_| format!("{}|missing", p.display()),
            |m| {
                let t = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs());
                format!("{}|{}|{t}", p.display(), m.len())
            },
        )
    };
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        entries.iter().map(|p| one(p)).collect::<Vec<_>>().join(";")
    } else {
        one(path)
    }
}

// ---------------------------------------------------------------------------------------------
// Training

/// Which module replaces layers `[start, start + m)` and how it is run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub start: usize,
    pub m: usize,
    /// ELM input injection (false: looped / Streamline layer iterated from h).
    pub injection: bool,
    /// Exactly K block applications (looped, Streamline), else solved (ELM).
    pub fixed_iterations: Option<usize>,
    /// `elm compress --block-init` (absent: a copy of the first replaced layer; kept out of
    /// the stage key then, so the keys of earlier runs hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_init: Option<String>,
    /// `elm compress --block` (absent: a decoder block; kept out of the stage key then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<String>,
    /// ELM + heal: LoRA (r = [`HEAL_RANK`], α = 16) on the layers after the window, trained
    /// with the module (`TrainConfig::heal`; false: kept out of the stage key).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub heal: bool,
    /// Relaxed Recursive Transformers: the per-loop LoRA rank (`elm compress --relaxed-rank`;
    /// absent: kept out of the stage key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relaxed_rank: Option<usize>,
}

impl Variant {
    pub fn elm(start: usize, m: usize) -> Self {
        Variant {
            start,
            m,
            injection: true,
            fixed_iterations: None,
            block_init: None,
            block: None,
            heal: false,
            relaxed_rank: None,
        }
    }
    /// LLM-Streamline (layer replacement): one block, one application, no injection.
    pub fn streamline(start: usize, m: usize) -> Self {
        Variant {
            start,
            m,
            injection: false,
            fixed_iterations: Some(1),
            block_init: None,
            block: None,
            heal: false,
            relaxed_rank: None,
        }
    }
    /// LLM-Streamline's FFN replacement: the first replaced layer's MLP half (no attention, no
    /// KV cache), one application, no injection.
    pub fn streamline_ffn(start: usize, m: usize) -> Self {
        Variant {
            block: Some("ffn".into()),
            ..Variant::streamline(start, m)
        }
    }
    /// A looped block applied K times, no injection.
    pub fn looped(start: usize, m: usize, k: usize) -> Self {
        Variant {
            start,
            m,
            injection: false,
            fixed_iterations: Some(k),
            block_init: None,
            block: None,
            heal: false,
            relaxed_rank: None,
        }
    }
    /// The ELM's ablation: its module (with injection) applied exactly K times at train and
    /// test time instead of solved (K = 1: one iteration).
    pub fn elm_fixed(start: usize, m: usize, k: usize) -> Self {
        Variant {
            fixed_iterations: Some(k),
            ..Variant::elm(start, m)
        }
    }
    /// The ELM trained together with a LoRA heal of the layers after its window.
    pub fn elm_healed(start: usize, m: usize) -> Self {
        Variant {
            heal: true,
            ..Variant::elm(start, m)
        }
    }
    /// This variant with its block initialised by LaCo's RDSC merge of the window.
    pub fn la_co_init(self) -> Self {
        Variant {
            block_init: Some("la-co".into()),
            ..self
        }
    }
    /// Relaxed Recursive Transformers in window form (the closest prior method): one shared
    /// block, the window's mean, looped `m` times without injection, loop `k` with its own LoRA
    /// of rank [`RELAXED_RANK`] initialised by the truncated SVD of layer `start + k`'s
    /// difference to the block.
    pub fn relaxed(start: usize, m: usize) -> Self {
        Variant {
            start,
            m,
            injection: false,
            fixed_iterations: Some(m),
            block_init: Some("average".into()),
            block: None,
            heal: false,
            relaxed_rank: Some(RELAXED_RANK),
        }
    }
    /// The ELM's ablation: solved to its fixed point, without input injection.
    pub fn elm_no_injection(start: usize, m: usize) -> Self {
        Variant {
            injection: false,
            ..Variant::elm(start, m)
        }
    }
}

/// `elm compress --json`: the library's accounting of the initial module (the command adds
/// its output path and init settings, which the stage key already holds).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Compressed {
    pub params: ParamReport,
    /// KV bytes at the command's default context (the measured bytes come from [`kv_measure`]).
    pub kv: KvReport,
}

/// The teacher-state cache's counts and seconds that `elm train --json` adds
/// (`--teacher-cache`; the library's [`elm::equilibrium::train::TeacherCacheStats`]). Records
/// written before the seconds were measured hold only the counts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TeacherCacheStats {
    pub hits: usize,
    pub misses: usize,
    #[serde(default)]
    pub compute_seconds: Option<f64>,
    #[serde(default)]
    pub read_seconds: Option<f64>,
    #[serde(default)]
    pub recorded_seconds: Option<f64>,
    #[serde(default)]
    pub priced_hits: Option<usize>,
}

impl TeacherCacheStats {
    /// The library's record, when this one holds the seconds.
    fn timed(&self) -> Option<elm::equilibrium::train::TeacherCacheStats> {
        Some(elm::equilibrium::train::TeacherCacheStats {
            hits: self.hits,
            misses: self.misses,
            compute_seconds: self.compute_seconds?,
            read_seconds: self.read_seconds?,
            recorded_seconds: self.recorded_seconds?,
            priced_hits: self.priced_hits?,
        })
    }

    /// Seconds this training spent computing teacher states it missed, `None` for a record
    /// older than the measurement.
    pub fn computed_seconds(&self) -> Option<f64> {
        self.timed().map(|t| t.compute_seconds)
    }

    /// Seconds the cache saved this training (see the library's `saved_seconds`), `None` when
    /// the record or a hit's file predates the measurement.
    pub fn saved_seconds(&self) -> Option<f64> {
        self.timed().and_then(|t| t.saved_seconds())
    }
}

/// `elm train --json`: the library's [`TrainOutcome`] and what the command measures around it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainReport {
    #[serde(flatten)]
    pub outcome: TrainOutcome,
    /// RSS high-water mark of the training process (measured by the process itself).
    pub peak_rss_bytes: u64,
    /// Always present: every training of the study shares one teacher cache.
    pub teacher_cache: TeacherCacheStats,
}

/// A training stage's record: the trained checkpoint, `elm compress --json` of its initial
/// module and `elm train --json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trained {
    pub checkpoint: PathBuf,
    pub compress: Compressed,
    pub train: TrainReport,
}

impl Done<Trained> {
    /// A copy of the training's record for a second owner (the throughput table lists the
    /// trainings other tables also read).
    pub fn clone_done(&self) -> Self {
        Done {
            key: self.key.clone(),
            value: self.value.clone(),
            raw: self.raw.clone(),
            cached: self.cached,
            dir: self.dir.clone(),
        }
    }
}

/// A run's own compute: the steps of every run it took (a killed and resumed stage counts its
/// earlier runs' steps too), or this process's seconds when no step's time was kept (states
/// written before the steps' times were).
fn compute_seconds(this_run: f64, all_runs: f64) -> f64 {
    if all_runs > 0.0 {
        all_runs
    } else {
        this_run
    }
}

/// The compute of a training or a LoRA run (see [`compute_seconds`]).
pub trait OwnCompute {
    fn compute_seconds(&self) -> f64;
}

impl OwnCompute for Trained {
    fn compute_seconds(&self) -> f64 {
        let o = &self.train.outcome;
        compute_seconds(o.seconds, o.seconds_all_runs)
    }
}

impl OwnCompute for LoraReport {
    fn compute_seconds(&self) -> f64 {
        compute_seconds(self.seconds, self.seconds_all_runs)
    }
}

/// The held-out distillation MSE after training (`elm train` reports it when given held-out
/// problems, which every scale does).
fn distill_after(o: &TrainOutcome, what: &str) -> Result<f64, ReproError> {
    o.distill_after.ok_or_else(|| ReproError::Schema {
        command: what.to_string(),
        source: serde::de::Error::custom("`distill_after` is null (no held-out problems)"),
    })
}

impl Trained {
    /// Replaced layers M.
    pub fn m(&self) -> usize {
        self.compress.params.num_replaced
    }
    pub fn seconds_per_step(&self) -> f64 {
        let o = &self.train.outcome;
        o.seconds / o.steps_this_run.max(1) as f64
    }
    /// Training tokens per second of this process's steps.
    pub fn tokens_per_s(&self) -> f64 {
        let o = &self.train.outcome;
        let per_step = o.tokens as f64 / o.steps.max(1) as f64;
        per_step * o.steps_this_run as f64 / o.seconds.max(1e-9)
    }
    /// K/V bytes of one 1,024-token sequence with the one-step cache (the compress accounting).
    pub fn kv_bytes_1k(&self) -> usize {
        let kv = &self.compress.kv;
        kv.one_step * 1024 / kv.context.max(1)
    }
    pub fn distill_after(&self) -> Result<f64, ReproError> {
        distill_after(&self.train.outcome, &self.checkpoint.display().to_string())
    }
}

/// Trains `variant` with `budget` (and gradient rule `deq`, default SJFB) from its initial
/// module; a killed training resumes from its last checkpoint.
pub fn train(
    ctx: &mut Ctx<'_>,
    variant: &Variant,
    budget: &Budget,
    deq: Option<elm::grad::DeqConfig>,
) -> Result<Done<Trained>, ReproError> {
    let cfg = TrainConfig {
        steps: budget.steps,
        batch_size: budget.batch_size,
        seq_len: budget.seq_len,
        seed: budget.seed,
        deq,
        checkpoint_every: (budget.steps / 4).max(1),
        heal: variant.heal.then(|| elm::lora::LoraSpec {
            rank: HEAL_RANK,
            ..elm::lora::LoraSpec::default()
        }),
        lambda: elm::equilibrium::LambdaSchedule {
            distill_scale: ctx.distill_scale,
            ..Default::default()
        },
        ..TrainConfig::default()
    };
    let held_out = ctx.limits.held_out;
    let train_examples = ctx.limits.train_examples;
    let config = json!({
        "model": ctx.model_id,
        "data": ctx.data_dir,
        "train_examples": train_examples,
        "variant": variant,
        "train": cfg,
        "held_out": held_out,
    });
    let units = (budget.steps * budget.batch_size * budget.seq_len) as f64 / 100.0;
    let (elm, model, data_dir, tc) = (
        ctx.elm,
        ctx.model.clone(),
        ctx.data_dir.clone(),
        ctx.teacher_cache.clone(),
    );
    ctx.stages.run("train", &config, units, |dir| {
        let init = dir.join("init");
        let mut c = args(&[
            "compress",
            "--model",
            &path_arg(&model),
            "--start",
            &variant.start.to_string(),
            "--num-replaced",
            &variant.m.to_string(),
            "--out",
            &path_arg(&init),
            // This stage owns the directory: a resumed stage rebuilds it (elm refuses that
            // without --force).
            "--force",
        ]);
        if !variant.injection {
            c.push("--no-injection".into());
        }
        if let Some(k) = variant.fixed_iterations {
            c.extend(args(&["--fixed-iterations", &k.to_string()]));
        }
        if let Some(init) = &variant.block_init {
            c.extend(args(&["--block-init", init]));
        }
        if let Some(block) = &variant.block {
            c.extend(args(&["--block", block]));
        }
        if let Some(rank) = variant.relaxed_rank {
            c.extend(args(&["--relaxed-rank", &rank.to_string()]));
        }
        let compress = elm.run::<Compressed>(&c)?.typed;
        let trained = dir.join("trained");
        let mut t = resume_or_start(
            "train",
            &model,
            &trained,
            elm::equilibrium::train::STATE_FILE,
            "the training",
            args(&["--elm", &path_arg(&init)]),
            (&dir.join("train_config.json"), &cfg),
        )?;
        t.extend(args(&[
            "--out",
            &path_arg(&trained),
            "--data-dir",
            &path_arg(&data_dir),
            "--eval-examples",
            &held_out.to_string(),
            "--teacher-cache",
            &path_arg(&tc),
        ]));
        if let Some(n) = train_examples {
            let subset = train_subset(&data_dir, n, dir)?;
            t.extend(args(&["--data", &path_arg(&subset)]));
        }
        let train = elm.run::<TrainReport>(&t)?.typed;
        // A record without the figure the tables read is not kept.
        distill_after(&train.outcome, "elm train --json")?;
        to_value(&Trained {
            checkpoint: trained,
            compress,
            train,
        })
    })
}

/// The first `n` GSM8K training problems as a .jsonl file in `dir` (`elm train --data`).
fn train_subset(data_dir: &Path, n: usize, dir: &Path) -> Result<PathBuf, ReproError> {
    let src = elm::data::gsm8k_path(data_dir, elm::data::Split::Train);
    let text = std::fs::read_to_string(&src).map_err(|e| ReproError::io(&src, e))?;
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .collect();
    let path = dir.join("train_subset.jsonl");
    elm::io::write_atomic(&path, (lines.join("\n") + "\n").as_bytes())
        .map_err(|e| ReproError::writing(&path, e))?;
    Ok(path)
}

pub fn to_value<T: Serialize>(v: &T) -> Result<Value, ReproError> {
    serde_json::to_value(v)
        .map_err(|e| ReproError::Setup(format!("result does not serialize: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Evaluation

/// A named metric of an `elm eval --json` run.
pub trait Metrics {
    fn metric(&self, name: &str, what: &str) -> Result<&MetricReport, ReproError>;
}

impl Metrics for TaskRun {
    fn metric(&self, name: &str, what: &str) -> Result<&MetricReport, ReproError> {
        self.metrics.get(name).ok_or_else(|| ReproError::Schema {
            command: what.to_string(),
            source: serde::de::Error::custom(format!("missing metric `{name}`")),
        })
    }
}

/// A model to evaluate: the dense model, a pruned model directory, or a trained module.
#[derive(Clone, Debug, Serialize)]
pub enum Subject {
    Dense,
    /// An HF model directory (a pruned or LoRA-tuned model) and the key of the stage that wrote it.
    Model {
        dir: PathBuf,
        key: String,
    },
    /// An ELM checkpoint, the key of its training stage, and how it is solved.
    Elm {
        checkpoint: PathBuf,
        key: String,
        solver: String,
        tol: f64,
        kv: String,
        max_iter: usize,
        /// `elm eval --depth`: `None` as trained; `Some("solved")` or `Some(K')` (the
        /// train-K × test-K grid).
        depth: Option<String>,
    },
}

impl Subject {
    /// The merged model a LoRA stage wrote (the tuned dense model, a healed baseline).
    pub fn tuned(run: &Done<LoraReport>) -> Self {
        Subject::Model {
            dir: run.value.out.clone().into(),
            key: run.key.clone(),
        }
    }
    /// The model a training-free baseline cut (`elm prune`).
    pub fn pruned(p: &Done<Pruned>) -> Self {
        Subject::Model {
            dir: p.value.out.clone(),
            key: p.key.clone(),
        }
    }
    /// The trained module of `t` solved by `solver` to absolute per-token tolerance `tol`.
    pub fn elm(t: &Done<Trained>, solver: &str, tol: f64) -> Self {
        Subject::Elm {
            checkpoint: t.value.checkpoint.clone(),
            key: t.key.clone(),
            solver: solver.into(),
            tol,
            kv: "one-step".into(),
            max_iter: 16,
            depth: None,
        }
    }
    /// The same module solved with at most `cap` evaluations per token.
    pub fn with_max_iter(mut self, cap: usize) -> Self {
        if let Subject::Elm { max_iter, .. } = &mut self {
            *max_iter = cap;
        }
        self
    }
    /// The same module run at `depth` (`elm eval --depth`: `solved` or a number of
    /// applications) instead of as trained.
    pub fn at_depth(mut self, at: &str) -> Self {
        if let Subject::Elm { depth, .. } = &mut self {
            *depth = Some(at.into());
        }
        self
    }
    pub fn with_kv(mut self, mode: &str) -> Self {
        if let Subject::Elm { kv, .. } = &mut self {
            *kv = mode.into();
        }
        self
    }
}

/// Keys of a subject in a stage config (paths are not part of the identity; keys are).
fn subject_config(s: &Subject) -> Value {
    match s {
        Subject::Dense => json!("dense"),
        Subject::Model { key, .. } => json!({"model_dir": key}),
        Subject::Elm {
            key,
            solver,
            tol,
            kv,
            max_iter,
            depth,
            ..
        } => {
            let mut v =
                json!({"elm": key, "solver": solver, "tol": tol, "kv": kv, "max_iter": max_iter});
            // Absent when as trained, so the keys of every other evaluation stay as they were.
            if let Some(d) = depth {
                v["depth"] = json!(d);
            }
            v
        }
    }
}

/// Which problems an evaluation scores. Only the final tables read GSM8K's test file, through a
/// seeded random sample; what the study selects by (its best baselines and windows) is scored
/// on the validation split, which no training reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problems {
    /// The main table's test sample (`Limits::nll_eval`; exact match `Limits::gsm8k_eval`).
    Test,
    /// The ablation tables' test sample: the first `Limits::ablation_nll_eval` problems of the
    /// same seeded permutation, so it lies inside the main table's.
    AblationTest,
    /// The validation split's first `Limits::validation_eval` problems (selection only).
    Validation,
    /// Table 1b's test sample: `Limits::full_test` problems of the same permutation (all of
    /// them at `long`), so it holds the main table's.
    FullTest,
}

/// The seed of the test and validation samples' permutation (one fixed draw, documented in
/// the README; changing it changes every evaluation's key).
pub const SAMPLE_SEED: u64 = 20_260_401;

/// `elm eval` of `subject` on `task` (`gsm8k-nll` or `gsm8k`) over the main table's test
/// sample.
pub fn eval(ctx: &mut Ctx<'_>, subject: &Subject, task: &str) -> Result<Done<TaskRun>, ReproError> {
    eval_on(ctx, subject, task, Problems::Test)
}

/// An answer NLL on the validation split: the one score the study ranks models and windows
/// by. Only [`validation_nll`] makes one, so a selection written against this type cannot
/// read a test figure.
#[derive(Clone, Debug)]
pub struct ValidationNll {
    pub mean: f64,
    pub n: usize,
    /// Mean fixed-point block evaluations per token on the same problems (0 without a
    /// module): what a control's K and a matched-compute choice read.
    pub block_evals: f64,
    /// The key of the evaluation stage it comes from.
    pub key: String,
}

/// The answer NLL of `subject` on the validation sample.
pub fn validation_nll(ctx: &mut Ctx<'_>, subject: &Subject) -> Result<ValidationNll, ReproError> {
    let run = eval_on(ctx, subject, "gsm8k-nll", Problems::Validation)?;
    let m = run.value.metric("answer_nll", "validation answer NLL")?;
    Ok(ValidationNll {
        mean: m.estimate.value,
        n: m.estimate.n,
        block_evals: run.value.solver.mean_iterations,
        key: run.key.clone(),
    })
}

/// `elm eval` of `subject` on `task` over `problems`.
pub fn eval_on(
    ctx: &mut Ctx<'_>,
    subject: &Subject,
    task: &str,
    problems: Problems,
) -> Result<Done<TaskRun>, ReproError> {
    eval_in(ctx, subject, task, problems, false)
}

/// [`eval_on`] with f32 products whatever the scale's precision: what the precision check
/// pairs the run's own score against.
pub fn eval_on_in_f32(
    ctx: &mut Ctx<'_>,
    subject: &Subject,
    task: &str,
    problems: Problems,
) -> Result<Done<TaskRun>, ReproError> {
    eval_in(ctx, subject, task, problems, true)
}

fn eval_in(
    ctx: &mut Ctx<'_>,
    subject: &Subject,
    task: &str,
    problems: Problems,
    in_f32: bool,
) -> Result<Done<TaskRun>, ReproError> {
    let l = ctx.limits;
    let parsed: Task = task.parse().map_err(|source| ReproError::Elm {
        what: format!("eval task `{task}`"),
        source,
    })?;
    let nll = match problems {
        Problems::Test => l.nll_eval,
        Problems::AblationTest => l.ablation_nll_eval.min(l.nll_eval),
        Problems::Validation => l.validation_eval,
        Problems::FullTest => l.full_test.unwrap_or(l.nll_eval),
    };
    let split = match problems {
        Problems::Test | Problems::AblationTest | Problems::FullTest => elm::data::Split::Test,
        Problems::Validation => elm::data::Split::Validation,
    };
    let (limit, units) = match parsed {
        Task::Gsm8kNll => (nll, nll as f64 * 2.0),
        Task::Gsm8k | Task::HumanEval | Task::HumanEvalNll => {
            (l.gsm8k_eval, (l.gsm8k_eval * l.max_new_tokens) as f64 / 5.0)
        }
    };
    // Exact match generates to the scale's budget; the other tasks keep the key they always
    // had (their `max_new_tokens` is not read).
    let max_new_tokens = match parsed {
        Task::Gsm8k => l.em_budget.to_string(),
        Task::Gsm8kNll | Task::HumanEval | Task::HumanEvalNll => l.max_new_tokens.to_string(),
    };
    let mut config = json!({
        "model": ctx.model_id,
        "data": ctx.data_dir,
        "subject": subject_config(subject),
        "task": task,
        "split": split.name(),
        "sample_seed": SAMPLE_SEED,
        "limit": limit,
        "max_new_tokens": match parsed {
            Task::Gsm8k => json!(l.em_budget),
            _ => json!(l.max_new_tokens),
        },
    });
    if in_f32 {
        config["products"] = json!("f32");
    }
    let mut a = args(&[
        "eval",
        "--task",
        task,
        "--split",
        split.name(),
        "--sample-seed",
        &SAMPLE_SEED.to_string(),
        "--limit",
        &limit.to_string(),
        "--max-new-tokens",
        &max_new_tokens,
        "--batch",
        "8",
        "--data-dir",
        &path_arg(&ctx.data_dir),
    ]);
    match subject {
        Subject::Dense => a.extend(args(&["--model", &path_arg(&ctx.model)])),
        Subject::Model { dir, .. } => a.extend(args(&["--model", &path_arg(dir)])),
        Subject::Elm {
            checkpoint,
            solver,
            tol,
            kv,
            max_iter,
            depth,
            ..
        } => {
            a.extend(args(&[
                "--model",
                &path_arg(&ctx.model),
                "--elm",
                &path_arg(checkpoint),
                "--solver",
                solver,
                "--abs-tol",
                &tol.to_string(),
                "--kv",
                kv,
                "--max-iter",
                &max_iter.to_string(),
            ]));
            if let Some(d) = depth {
                a.extend(args(&["--depth", d]));
            }
        }
    }
    let elm = ctx.elm;
    ctx.stages.run("eval", &config, units, |_| {
        Ok(if in_f32 {
            elm.run_f32::<Unread>(&a)?.raw
        } else {
            elm.run::<Unread>(&a)?.raw
        })
    })
}

// ---------------------------------------------------------------------------------------------
// LoRA-tuned dense model (the reference of every retention figure)

/// `elm lora` of the dense model `model` (identity `model_id`, see [`file_identity`]) with
/// the trainings' token budget (steps × batch × sequence length), so that the reference saw as
/// much task data as each trained compressed model.
pub fn lora(
    ctx: &mut Ctx<'_>,
    model: &Path,
    model_id: &str,
    budget: &Budget,
) -> Result<Done<LoraReport>, ReproError> {
    lora_stage(
        ctx,
        model,
        json!(model_id),
        elm::lora::LoraSpec::default(),
        budget,
    )
}

/// Per-loop LoRA rank of the Relaxed Recursive Transformer control: r = 8 on the seven linear
/// maps of each of M = 8 loops is 651,264 parameters at SmolLM2's width, within 2% of the
/// 664,128 the ELM's injection adds (`W_z`, `W_h`, `b`), so the two carry the same parameters.
pub const RELAXED_RANK: usize = 8;

/// LoRA rank of the healing fine-tune (Shortened-LLaMA's recovery: r = 8, α = 16, dropout
/// 0.05 on every linear layer).
pub const HEAL_RANK: usize = 8;

/// The healing fine-tune of a training-free baseline: LoRA (r = [`HEAL_RANK`], α = 16) on the
/// pruned model with `budget`, merged afterwards.
pub fn heal(
    ctx: &mut Ctx<'_>,
    pruned: &Done<Pruned>,
    budget: &Budget,
) -> Result<Done<LoraReport>, ReproError> {
    let spec = elm::lora::LoraSpec {
        rank: HEAL_RANK,
        ..elm::lora::LoraSpec::default()
    };
    lora_stage(
        ctx,
        &pruned.value.out,
        json!({ "pruned": pruned.key }),
        spec,
        budget,
    )
}

/// The head of a resumable `elm train` / `elm lora` command on `model`: `--resume` when the
/// run directory `out` kept its state (`state_file`), else the stage's `inputs` and its
/// config, written to the given path, with `--force` (no saved state: whatever a killed run
/// left in the directory is replaced). `what` names the run in the resume message.
fn resume_or_start(
    command: &str,
    model: &Path,
    out: &Path,
    state_file: &str,
    what: &str,
    inputs: Vec<String>,
    (cfg_path, cfg): (&Path, &impl Serialize),
) -> Result<Vec<String>, ReproError> {
    let mut a = args(&[command, "--model", &path_arg(model)]);
    if out.join(state_file).exists() {
        eprintln!("  resuming {what} in {}", out.display());
        a.push("--resume".into());
    } else {
        elm::io::write_json_atomic(cfg_path, cfg).map_err(|e| ReproError::writing(cfg_path, e))?;
        a.extend(inputs);
        a.extend(args(&["--config", &path_arg(cfg_path), "--force"]));
    }
    Ok(a)
}

/// `elm lora` of `model` (whose identity in the stage key is `identity`), resumable.
fn lora_stage(
    ctx: &mut Ctx<'_>,
    model: &Path,
    identity: Value,
    spec: elm::lora::LoraSpec,
    budget: &Budget,
) -> Result<Done<LoraReport>, ReproError> {
    let cfg = elm::lora::LoraConfig {
        steps: budget.steps,
        batch_size: budget.batch_size,
        seq_len: budget.seq_len,
        seed: budget.seed,
        checkpoint_every: (budget.steps / 4).max(1),
        lora: spec,
        ..elm::lora::LoraConfig::default()
    };
    let train_examples = ctx.limits.train_examples;
    let config = json!({
        "model": identity,
        "data": ctx.data_dir,
        "train_examples": train_examples,
        "lora": cfg,
    });
    let units = (budget.steps * budget.batch_size * budget.seq_len) as f64 / 100.0;
    let (elm, model, data_dir) = (ctx.elm, model.to_path_buf(), ctx.data_dir.clone());
    ctx.stages.run("lora", &config, units, |dir| {
        let run = dir.join("run");
        let mut a = resume_or_start(
            "lora",
            &model,
            &run,
            elm::lora::sft::LORA_STATE_FILE,
            "the LoRA run",
            vec![],
            (&dir.join("lora_config.json"), &cfg),
        )?;
        a.extend(args(&[
            "--out",
            &path_arg(&run),
            "--data-dir",
            &path_arg(&data_dir),
            // The tables evaluate the merged model through `elm eval` like every other row.
            "--eval-examples",
            "0",
        ]));
        if let Some(n) = train_examples {
            let subset = train_subset(&data_dir, n, dir)?;
            a.extend(args(&["--data", &path_arg(&subset)]));
        }
        Ok(elm.run::<Unread>(&a)?.raw)
    })
}

/// Every library report paper_repro decodes, serialised from a library value as its `elm ...
/// --json` command prints it (plus the keys the command adds), must decode into the type the
/// stages read: a field the library renames or retypes fails here, not in the smoke run.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::elm_cli::decode;
    use elm::compress::PruneReport;
    use elm::equilibrium::train::StepLog;
    use elm::equilibrium::{kv_report, param_report, ElmConfig};
    use elm::eval::stats::{estimate, BootstrapConfig, ItemScore};
    use elm::eval::{SolverSummary, Task};
    use elm::model::config::{Arch, ModelConfig};

    /// `value` with `extra` keys added, as a command adds its own to a library report.
    fn with(value: impl Serialize, extra: Value) -> Vec<u8> {
        let mut v = serde_json::to_value(value).unwrap();
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::to_vec(&v).unwrap()
    }

    /// Decodes `stdout` as `T` and reads the result back as a stage does from its record.
    fn decode_and_reread<T: Serialize + serde::de::DeserializeOwned>(
        command: &str,
        stdout: &[u8],
    ) -> T {
        let typed = decode::<T>(command, stdout)
            .unwrap_or_else(|e| panic!("{e}"))
            .typed;
        serde_json::from_value(to_value(&typed).unwrap()).unwrap()
    }

    fn trained() -> Trained {
        let cfg = ModelConfig::tiny(Arch::Llama);
        let ec = ElmConfig::new(1, 2);
        let compress = serde_json::to_vec(&json!({
            "out": "init",
            "block_init": "first-layer",
            "block": "decoder",
            "params": param_report(&cfg, &ec),
            "kv": kv_report(&cfg, &ec, 1, 1024, 2),
        }))
        .unwrap();
        let last = StepLog {
            step: 3,
            lr: 1e-4,
            lambda_ce: 0.0,
            lambda_distill: 1.0,
            distill: 0.5,
            ce: None,
            loss: 0.5,
            grad_norm: 1.0,
            sampled: Some((1, 1)),
            tokens: 60,
            seconds: 0.5,
            jacobian: None,
            spectral_radius: Some(0.3),
        };
        let outcome = TrainOutcome {
            steps: 4,
            steps_this_run: 2,
            seconds: 1.0,
            seconds_all_runs: 2.0,
            tokens: 240,
            sequences: 8,
            distill_before: Some(0.9),
            distill_after: Some(0.5),
            held_out_examples: 1,
            last: Some(last),
            first: None,
            first_with_ce: None,
            window_rms: None,
        };
        let train = with(
            &outcome,
            json!({
                "out": "trained",
                "params": param_report(&cfg, &ec),
                "peak_rss_bytes": 1u64 << 33,
                "teacher_cache": elm::equilibrium::train::TeacherCacheStats {
                    hits: 3,
                    misses: 1,
                    compute_seconds: 0.5,
                    read_seconds: 0.25,
                    recorded_seconds: 1.75,
                    priced_hits: 3,
                },
            }),
        );
        Trained {
            checkpoint: "trained".into(),
            compress: decode_and_reread("elm compress --json", &compress),
            train: decode_and_reread("elm train --json", &train),
        }
    }

    #[test]
    fn compress_and_train_reports_decode() {
        let t = trained();
        // The stage's record reads back (the training figures are flattened into it).
        let back: Trained = serde_json::from_value(to_value(&t).unwrap()).unwrap();
        assert_eq!(back.m(), 2);
        assert_eq!(back.compress.params.num_layers, 4);
        assert_eq!(back.kv_bytes_1k(), t.compress.kv.one_step);
        assert_eq!(back.train.outcome.tokens, 240);
        assert_eq!(back.train.outcome.last.as_ref().unwrap().tokens, 60);
        assert_eq!(back.train.teacher_cache.misses, 1);
        // What the hits cost their writers minus what reading them cost.
        assert_eq!(back.train.teacher_cache.saved_seconds(), Some(1.5));
        assert_eq!(back.train.teacher_cache.computed_seconds(), Some(0.5));
        assert_eq!(back.compute_seconds(), 2.0);
        assert_eq!(back.distill_after().unwrap(), 0.5);
        // 60 tokens a step, 2 steps in 1 s.
        assert_eq!(back.tokens_per_s(), 120.0);
    }

    /// Records written before the cache's seconds were measured still read, and say nothing
    /// about what the cache saved rather than 0; so does a run that read a file written
    /// before files recorded their cost.
    #[test]
    fn teacher_cache_savings_are_unknown_where_a_record_or_file_predates_them() {
        let old: TeacherCacheStats =
            serde_json::from_value(json!({"hits": 3, "misses": 1})).unwrap();
        assert_eq!(old.saved_seconds(), None);
        assert_eq!(old.computed_seconds(), None);
        let mut unpriced = trained().train.teacher_cache;
        unpriced.priced_hits = Some(2);
        assert_eq!(unpriced.saved_seconds(), None);
        assert_eq!(unpriced.computed_seconds(), Some(0.5));
    }

    #[test]
    fn a_training_without_held_out_figures_is_refused() {
        let mut t = trained();
        t.train.outcome.distill_after = None;
        let err = t.distill_after().unwrap_err().to_string();
        assert!(err.contains("distill_after"), "{err}");
    }

    #[test]
    fn eval_report_decodes() {
        let items: Vec<ItemScore> = (0..3)
            .map(|i| ItemScore {
                id: i.to_string(),
                value: 1.0 + i as f64,
                weight: 2.0,
            })
            .collect();
        let boot = BootstrapConfig {
            resamples: 50,
            ..BootstrapConfig::default()
        };
        let metric = MetricReport {
            estimate: estimate(&items, &boot).unwrap(),
            higher_is_better: false,
            paired: None,
            items,
        };
        let run = TaskRun {
            task: Task::Gsm8kNll,
            n: 3,
            metrics: [("answer_nll".to_string(), metric)].into(),
            perplexity: Some(7.0),
            seconds: 1.0,
            tok_s: 100.0,
            tokens: 100,
            solver: SolverSummary {
                tokens: 3,
                mean_iterations: 4.0,
                max_iterations: 6,
                layer_evals_per_token: 26.0,
                mean_residual: 0.1,
                converged_frac: 1.0,
            },
            gsm8k_samples: vec![elm::eval::gsm8k::Sample {
                id: "0".into(),
                question: "1 + 2?".into(),
                reference: "#### 3".into(),
                prediction: "3".into(),
                score: elm::eval::score_response("#### 3", "#### 3"),
                truncated: false,
            }],
            humaneval_samples: vec![elm::eval::humaneval::HumanEvalSample {
                task_id: "HumanEval/0".into(),
                completion: "pass".into(),
                verdict: elm::eval::sandbox::Verdict::Passed,
                seconds: 0.1,
                stderr_tail: String::new(),
            }],
        };
        let stdout = with(
            &run,
            json!({"model": "m.gguf", "elm": null, "data_dir": "data", "reference": null}),
        );
        let back: TaskRun = decode_and_reread("elm eval --json", &stdout);
        assert_eq!(back.solver.max_iterations, 6);
        let m = back.metric("answer_nll", "eval").unwrap();
        assert_eq!(m.estimate, run.metrics["answer_nll"].estimate);
        assert!(back.metric("strict_match", "eval").is_err());
    }

    #[test]
    fn lora_and_prune_reports_decode() {
        let lora = LoraReport {
            steps: 4,
            seconds: 1.0,
            seconds_all_runs: 0.0,
            train_sequences: 8,
            train_ce_first: 2.0,
            train_ce_last: 1.0,
            held_out_examples: 0,
            answer_nll_before: None,
            answer_nll_after: None,
            out: "run/merged".into(),
        };
        let back: LoraReport =
            decode_and_reread("elm lora --json", &serde_json::to_vec(&lora).unwrap());
        // No step time kept: this process's seconds.
        assert_eq!(back.compute_seconds(), 1.0);
        let report = PruneReport {
            method: elm::compress::PruneMethod::ShortGpt,
            num_replaced: 2,
            removed_layers: vec![1, 2],
            start: None,
            metric: "bi".into(),
            scores: vec![0.1, 0.2, 0.3, 0.4],
            calibration_tokens: 64,
            dense_params: 100,
            dense_non_embedding_params: 80,
            params: 60,
            non_embedding_params: 40,
            added_params: 0,
            dense_kv_bytes_1k: 4096,
            kv_bytes_1k: 2048,
            seconds: 0.5,
        };
        let stdout = with(
            &report,
            json!({"out": "model", "calibration": "train.jsonl"}),
        );
        let back: Pruned = decode_and_reread("elm prune --json", &stdout);
        assert_eq!(back.out, PathBuf::from("model"));
        assert_eq!(back.report.removed_layers, [1, 2]);
    }

    #[test]
    fn bench_report_decodes() {
        let report = elm::model::bench::BenchReport {
            read_bandwidth_gb_s: 20.0,
            sgemm_n: 512,
            sgemm_gflop_s: 100.0,
            prefill_tokens: 128,
            prefill_tok_s: 300.0,
            prefill_gflop_s: 50.0,
            prefill_vs_sgemm_peak: 0.5,
            decode_steps: 16,
            decode_b1_tok_s: 40.0,
            decode_b1_mean_tok_s: 35.0,
            decode_b8_tok_s: 200.0,
            decode_b8_mean_tok_s: 180.0,
            decode_weight_bytes_per_step: 100_000_000,
            decode_roofline_tok_s: 200.0,
            decode_b1_vs_roofline: 0.2,
            rayon_threads: 2,
            load_average_1m: None,
            openblas_threads: 1,
        };
        let back: elm::model::bench::BenchReport =
            decode_and_reread("elm bench --json", &serde_json::to_vec(&report).unwrap());
        assert_eq!(crate::rows::BenchFigures::from(&back).prefill_tok_s, 300.0);
    }
}
