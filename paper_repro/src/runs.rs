//! The study's steps as cached stages (see [`crate::stage`]), each one `elm ... --json` call
//! (or two) whose output is decoded into the typed struct its tables read. A stage's config
//! holds everything its result depends on: the model's identity (path, size, modification
//! time), the data directory, the settings, and the keys of the stages it reads.

use std::path::{Path, PathBuf};

use elm::equilibrium::TrainConfig;
use elm::eval::stats::{Estimate, ItemScore};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::elm_cli::{args, path_arg, ElmCli, Unread};
use crate::error::ReproError;
use crate::scale::{Budget, Limits};
use crate::stage::{Done, Stages};

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
    /// This variant with its block initialised by LaCo's RDSC merge of the window.
    pub fn la_co_init(self) -> Self {
        Variant {
            block_init: Some("la-co".into()),
            ..self
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

/// `elm::equilibrium::accounting::ParamReport`, the fields the tables read.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    pub num_layers: usize,
    pub dense_total: usize,
    pub elm_total: usize,
    pub reduction_total: f64,
    pub dense_non_embedding: usize,
    pub elm_non_embedding: usize,
    pub reduction_non_embedding: f64,
}

/// `elm::equilibrium::accounting::KvReport`, the fields the tables read (a formula; the measured
/// bytes come from [`kv_measure`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvFormula {
    pub context: usize,
    pub dense: usize,
    pub one_step: usize,
    pub one_step_ratio: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TeacherCacheStats {
    pub hits: usize,
    pub misses: usize,
}

/// `elm train --json` plus the compress accounting and the token count of the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trained {
    pub checkpoint: PathBuf,
    /// Replaced layers M.
    pub m: usize,
    pub params: Params,
    pub kv: KvFormula,
    /// Wall seconds of this process's steps (evaluation excluded).
    pub seconds: f64,
    /// Wall seconds of every step across resumed runs (0 in records written before `elm
    /// train` reported it): see [`Trained::compute_seconds`].
    #[serde(default)]
    pub seconds_all_runs: f64,
    pub steps: usize,
    pub steps_this_run: usize,
    /// Training tokens (valid, non-padding) of the whole run.
    pub tokens: usize,
    pub distill_before: f64,
    pub distill_after: f64,
    /// RSS high-water mark of the training process (measured by the process itself).
    pub peak_rss_bytes: u64,
    pub teacher_cache: TeacherCacheStats,
}

/// A training's own compute: the steps of every run it took (a killed and resumed stage
/// counts its earlier runs' steps too), or this process's seconds for a record from before
/// the steps' times were kept.
fn compute_seconds(this_run: f64, all_runs: f64) -> f64 {
    if all_runs > 0.0 {
        all_runs
    } else {
        this_run
    }
}

impl Trained {
    /// The training's own compute (see [`compute_seconds`]).
    pub fn compute_seconds(&self) -> f64 {
        compute_seconds(self.seconds, self.seconds_all_runs)
    }
    pub fn seconds_per_step(&self) -> f64 {
        self.seconds / self.steps_this_run.max(1) as f64
    }
    /// Training tokens per second of this process's steps.
    pub fn tokens_per_s(&self) -> f64 {
        let per_step = self.tokens as f64 / self.steps.max(1) as f64;
        per_step * self.steps_this_run as f64 / self.seconds.max(1e-9)
    }
}

#[derive(Deserialize)]
struct CompressOut {
    params: Params,
    kv: KvFormula,
}

#[derive(Deserialize)]
struct TrainOut {
    seconds: f64,
    seconds_all_runs: f64,
    steps: usize,
    steps_this_run: usize,
    distill_before: f64,
    distill_after: f64,
    peak_rss_bytes: u64,
    teacher_cache: TeacherCacheStats,
}

#[derive(Deserialize)]
struct StateTokens {
    history: Vec<StepTokens>,
}
#[derive(Deserialize)]
struct StepTokens {
    tokens: usize,
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
        seed: 0,
        deq,
        checkpoint_every: (budget.steps / 4).max(1),
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
            "--m",
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
        let comp = elm.run::<CompressOut>(&c)?.typed;
        let trained = dir.join("trained");
        let mut t = if trained.join(elm::equilibrium::train::STATE_FILE).exists() {
            eprintln!("  resuming the training in {}", trained.display());
            args(&["train", "--model", &path_arg(&model), "--resume"])
        } else {
            let cfg_path = dir.join("train_config.json");
            elm::io::write_json_atomic(&cfg_path, &cfg).map_err(|source| ReproError::Elm {
                what: format!("writing {}", cfg_path.display()),
                source,
            })?;
            args(&[
                "train",
                "--model",
                &path_arg(&model),
                "--elm",
                &path_arg(&init),
                "--config",
                &path_arg(&cfg_path),
                // No saved state: whatever a killed run left in the directory is replaced.
                "--force",
            ])
        };
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
        let out = elm.run::<TrainOut>(&t)?;
        let state_path = trained.join(elm::equilibrium::train::STATE_FILE);
        let state: StateTokens = serde_json::from_str(
            &std::fs::read_to_string(&state_path).map_err(|e| ReproError::io(&state_path, e))?,
        )
        .map_err(|source| ReproError::Schema {
            command: state_path.display().to_string(),
            source,
        })?;
        let o = out.typed;
        let trained_result = Trained {
            checkpoint: trained,
            m: variant.m,
            params: comp.params,
            kv: comp.kv,
            seconds: o.seconds,
            seconds_all_runs: o.seconds_all_runs,
            steps: o.steps,
            steps_this_run: o.steps_this_run,
            tokens: state.history.iter().map(|s| s.tokens).sum(),
            distill_before: o.distill_before,
            distill_after: o.distill_after,
            peak_rss_bytes: o.peak_rss_bytes,
            teacher_cache: o.teacher_cache,
        };
        to_value(&trained_result)
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
    elm::io::write_atomic(&path, (lines.join("\n") + "\n").as_bytes()).map_err(|source| {
        ReproError::Elm {
            what: format!("writing {}", path.display()),
            source,
        }
    })?;
    Ok(path)
}

pub fn to_value<T: Serialize>(v: &T) -> Result<Value, ReproError> {
    serde_json::to_value(v)
        .map_err(|e| ReproError::Setup(format!("result does not serialize: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Evaluation

/// One metric of `elm eval --json` (`elm::eval::task::MetricReport`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metric {
    pub estimate: Estimate,
    pub items: Vec<ItemScore>,
}

/// The fixed-point statistics (`elm::eval::gsm8k::SolverSummary`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SolverStats {
    pub mean_iterations: f64,
    pub max_iterations: usize,
    pub layer_evals_per_token: f64,
}

/// The keys of `elm eval --json` (`elm::eval::task::TaskRun`) the tables read.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvalRun {
    pub metrics: std::collections::BTreeMap<String, Metric>,
    pub tok_s: f64,
    pub solver: SolverStats,
}

impl EvalRun {
    pub fn metric(&self, name: &str, what: &str) -> Result<&Metric, ReproError> {
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
    },
}

impl Subject {
    /// The trained module of `t` solved by `solver` to absolute per-token tolerance `tol`.
    pub fn elm(t: &Done<Trained>, solver: &str, tol: f64) -> Self {
        Subject::Elm {
            checkpoint: t.value.checkpoint.clone(),
            key: t.key.clone(),
            solver: solver.into(),
            tol,
            kv: "one-step".into(),
            max_iter: 16,
        }
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
            ..
        } => json!({"elm": key, "solver": solver, "tol": tol, "kv": kv, "max_iter": max_iter}),
    }
}

/// `elm eval` of `subject` on `task` (`gsm8k-nll` or `gsm8k`) over the scale's problems.
pub fn eval(ctx: &mut Ctx<'_>, subject: &Subject, task: &str) -> Result<Done<EvalRun>, ReproError> {
    let l = ctx.limits;
    let (limit, units) = match task {
        "gsm8k-nll" => (l.nll_eval, l.nll_eval as f64 * 2.0),
        _ => (l.gsm8k_eval, (l.gsm8k_eval * l.max_new_tokens) as f64 / 5.0),
    };
    let config = json!({
        "model": ctx.model_id,
        "data": ctx.data_dir,
        "subject": subject_config(subject),
        "task": task,
        "limit": limit,
        "max_new_tokens": l.max_new_tokens,
    });
    let mut a = args(&[
        "eval",
        "--task",
        task,
        "--limit",
        &limit.to_string(),
        "--max-new-tokens",
        &l.max_new_tokens.to_string(),
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
            ..
        } => a.extend(args(&[
            "--model",
            &path_arg(&ctx.model),
            "--elm",
            &path_arg(checkpoint),
            "--solver",
            solver,
            "--tol",
            &tol.to_string(),
            "--kv",
            kv,
            "--max-iter",
            &max_iter.to_string(),
        ])),
    }
    let elm = ctx.elm;
    ctx.stages
        .run("eval", &config, units, |_| Ok(elm.run::<Unread>(&a)?.raw))
}

// ---------------------------------------------------------------------------------------------
// LoRA-tuned dense model (the reference of every retention figure)

/// `elm lora --json`, the fields the tables read.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tuned {
    /// The merged model (an HF directory).
    pub out: PathBuf,
    pub steps: usize,
    pub seconds: f64,
    /// As [`Trained::seconds_all_runs`].
    #[serde(default)]
    pub seconds_all_runs: f64,
    pub train_ce_first: f64,
    pub train_ce_last: f64,
}

impl Tuned {
    /// The LoRA run's own compute (see [`compute_seconds`]).
    pub fn compute_seconds(&self) -> f64 {
        compute_seconds(self.seconds, self.seconds_all_runs)
    }
}

/// `elm lora` of the dense model with the trainings' token budget (steps × batch × sequence
/// length), so that the reference saw as much task data as each trained compressed model.
pub fn lora(ctx: &mut Ctx<'_>, budget: &Budget) -> Result<Done<Tuned>, ReproError> {
    let (model, identity) = (ctx.model.clone(), json!(ctx.model_id));
    lora_stage(
        ctx,
        &model,
        identity,
        elm::lora::LoraSpec::default(),
        budget,
    )
}

/// LoRA rank of the healing fine-tune (Shortened-LLaMA's recovery: r = 8, α = 16, dropout
/// 0.05 on every linear layer).
pub const HEAL_RANK: usize = 8;

/// The healing fine-tune of a training-free baseline: LoRA (r = [`HEAL_RANK`], α = 16) on the
/// pruned model with `budget`, merged afterwards.
pub fn heal(
    ctx: &mut Ctx<'_>,
    pruned: &Done<Pruned>,
    budget: &Budget,
) -> Result<Done<Tuned>, ReproError> {
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

/// `elm lora` of `model` (whose identity in the stage key is `identity`), resumable.
fn lora_stage(
    ctx: &mut Ctx<'_>,
    model: &Path,
    identity: Value,
    spec: elm::lora::LoraSpec,
    budget: &Budget,
) -> Result<Done<Tuned>, ReproError> {
    let cfg = elm::lora::LoraConfig {
        steps: budget.steps,
        batch_size: budget.batch_size,
        seq_len: budget.seq_len,
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
        let mut a = if run.join(elm::lora::sft::LORA_STATE_FILE).exists() {
            eprintln!("  resuming the LoRA run in {}", run.display());
            args(&["lora", "--model", &path_arg(&model), "--resume"])
        } else {
            let cfg_path = dir.join("lora_config.json");
            elm::io::write_json_atomic(&cfg_path, &cfg).map_err(|source| ReproError::Elm {
                what: format!("writing {}", cfg_path.display()),
                source,
            })?;
            args(&[
                "lora",
                "--model",
                &path_arg(&model),
                "--config",
                &path_arg(&cfg_path),
                // No saved state: whatever a killed run left in the directory is replaced.
                "--force",
            ])
        };
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

// ---------------------------------------------------------------------------------------------
// Where to prune (table 6)

/// GPPO on the tuned dense model, the enumeration of windows it is checked against, and the
/// report placing GPPO's and the metric selectors' choices in that enumeration (`elm search`).
/// Returns the report and the directory holding its plot.
pub fn where_to_prune(
    ctx: &mut Ctx<'_>,
    tuned: &Done<Tuned>,
    m: usize,
) -> Result<(Done<elm::search::report::WhereToPrune>, PathBuf), ReproError> {
    let b = ctx.limits.search;
    let (elm, data_dir) = (ctx.elm, ctx.data_dir.clone());
    let model = tuned.value.out.clone();
    let base = json!({
        "tuned": tuned.key,
        "data": ctx.data_dir,
        "train_examples": ctx.limits.train_examples,
        "m": m,
        "seq_len": b.seq_len,
    });
    let data = |a: &mut Vec<String>, dir: &Path| -> Result<(), ReproError> {
        a.extend(args(&["--data-dir", &path_arg(&data_dir)]));
        if let Some(n) = ctx.limits.train_examples {
            let subset = train_subset(&data_dir, n, dir)?;
            a.extend(args(&["--data", &path_arg(&subset)]));
        }
        Ok(())
    };
    let common = |method: &str, out: &Path| {
        args(&[
            "search",
            "--model",
            &path_arg(&model),
            "--method",
            method,
            "--m",
            &m.to_string(),
            "--out",
            &path_arg(out),
        ])
    };
    let gppo_config = json!({"base": base, "steps": b.gppo_steps});
    let gppo = ctx.stages.run::<_, Value>(
        "gppo",
        &gppo_config,
        (b.gppo_steps * b.seq_len) as f64 / 100.0,
        |dir| {
            let run = dir.join("run");
            let mut a = common("gppo", &run);
            if run.join(elm::search::gppo::GPPO_STATE_FILE).exists() {
                eprintln!("  resuming GPPO in {}", run.display());
                a.push("--resume".into());
            } else {
                a.extend(args(&[
                    "--steps",
                    &b.gppo_steps.to_string(),
                    "--seq-len",
                    &b.seq_len.to_string(),
                    "--force",
                ]));
            }
            data(&mut a, dir)?;
            Ok(elm.run::<Unread>(&a)?.raw)
        },
    )?;
    let enum_config = json!({
        "base": base,
        "steps": b.enum_steps,
        "every": b.enum_every,
        "eval": b.enum_eval,
    });
    // Only for the ETA: the windows of a 30-layer model (SmolLM2); Qwen2.5-1.5B has two fewer.
    let starts = 30usize.saturating_sub(m) + 1;
    let enumeration = ctx.stages.run::<_, Value>(
        "enumerate",
        &enum_config,
        (starts * b.enum_steps * b.seq_len) as f64 / 100.0 / b.enum_every as f64,
        |dir| {
            let run = dir.join("run");
            let mut a = common("enumerate", &run);
            if run.join(elm::search::enumerate::ENUM_FILE).exists() {
                eprintln!("  resuming the enumeration in {}", run.display());
                a.push("--resume".into());
            } else {
                a.extend(args(&[
                    "--steps",
                    &b.enum_steps.to_string(),
                    "--every",
                    &b.enum_every.to_string(),
                    "--seq-len",
                    &b.seq_len.to_string(),
                ]));
            }
            a.extend(args(&["--eval-examples", &b.enum_eval.to_string()]));
            data(&mut a, dir)?;
            Ok(elm.run::<Unread>(&a)?.raw)
        },
    )?;
    let tokens = ctx.limits.calibration_tokens;
    let report_config = json!({
        "gppo": gppo.key,
        "enumeration": enumeration.key,
        "calibration_tokens": tokens,
    });
    let (gppo_dir, enum_dir) = (gppo.dir.join("run"), enumeration.dir.join("run"));
    let report = ctx
        .stages
        .run("where", &report_config, tokens as f64 / 50.0, |dir| {
            let mut a = common("report", dir);
            a.extend(args(&[
                "--gppo",
                &path_arg(&gppo_dir),
                "--enumeration",
                &path_arg(&enum_dir),
                "--calibration-tokens",
                &tokens.to_string(),
                "--calibration-seq-len",
                &tokens.min(128).to_string(),
            ]));
            data(&mut a, dir)?;
            Ok(elm.run::<Unread>(&a)?.raw)
        })?;
    let dir = report.dir.clone();
    Ok((report, dir))
}

// ---------------------------------------------------------------------------------------------
// Training-free baselines

/// `elm::compress::PruneReport`, the fields the tables read.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Pruned {
    pub out: PathBuf,
    pub removed_layers: Vec<usize>,
    pub params: usize,
    pub non_embedding_params: usize,
    pub dense_params: usize,
    pub kv_bytes_1k: usize,
    pub dense_kv_bytes_1k: usize,
    /// Wall seconds of the selection (calibration forwards) and the surgery.
    pub seconds: f64,
}

/// `elm prune --method METHOD --m M` into the stage's directory.
pub fn prune(ctx: &mut Ctx<'_>, method: &str, m: usize) -> Result<Done<Pruned>, ReproError> {
    let tokens = ctx.limits.calibration_tokens;
    let config = json!({
        "model": ctx.model_id,
        "data": ctx.data_dir,
        "method": method,
        "m": m,
        "calibration_tokens": tokens,
    });
    let (elm, model, data_dir) = (ctx.elm, ctx.model.clone(), ctx.data_dir.clone());
    ctx.stages
        .run("prune", &config, tokens as f64 / 50.0, |dir| {
            let out = dir.join("model");
            Ok(elm
                .run::<Unread>(&args(&[
                    "prune",
                    "--model",
                    &path_arg(&model),
                    "--method",
                    method,
                    "--m",
                    &m.to_string(),
                    "--calibration-tokens",
                    &tokens.to_string(),
                    "--seq-len",
                    &tokens.min(128).to_string(),
                    "--data-dir",
                    &path_arg(&data_dir),
                    "--out",
                    &path_arg(&out),
                    "--force",
                ]))?
                .raw)
        })
}

// ---------------------------------------------------------------------------------------------
// Measured KV bytes and the spectral radius

/// `elm generate --json`, the figures the KV table reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvMeasured {
    /// Bytes of K/V the decoding session allocated (dense layers + fixed-point caches).
    pub kv_bytes: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
}

/// Decodes one GSM8K test question with the ELM in KV mode `kv` and reports the bytes of K/V
/// the session allocated for it (prompt + `max_new_tokens` + 1 positions).
pub fn kv_measure(
    ctx: &mut Ctx<'_>,
    t: &Done<Trained>,
    kv: &str,
    prompt: &str,
) -> Result<Done<KvMeasured>, ReproError> {
    let max_new = ctx.limits.max_new_tokens;
    let config = json!({"model": ctx.model_id, "elm": t.key, "kv": kv, "prompt": prompt, "max_new_tokens": max_new});
    let a = args(&[
        "generate",
        "--model",
        &path_arg(&ctx.model),
        "--elm",
        &path_arg(&t.value.checkpoint),
        "--kv",
        kv,
        "--solver",
        "anderson",
        "--prompt",
        prompt,
        "--chat",
        "--max-new-tokens",
        &max_new.to_string(),
    ]);
    let elm = ctx.elm;
    ctx.stages.run("kv", &config, max_new as f64 / 5.0, |_| {
        Ok(elm.run::<Unread>(&a)?.raw)
    })
}

/// `elm spectral --json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spectral {
    pub n: usize,
    pub mean_radius: f64,
    pub min_radius: f64,
    pub max_radius: f64,
    pub max_rel_residual: f64,
}

/// ρ(∂φ/∂z) at z* of a trained ELM over the scale's GSM8K test sequences.
pub fn spectral(ctx: &mut Ctx<'_>, t: &Done<Trained>) -> Result<Done<Spectral>, ReproError> {
    let n = ctx.limits.spectral_sequences;
    let config = json!({"model": ctx.model_id, "data": ctx.data_dir, "elm": t.key, "limit": n, "iterations": 30});
    let a = args(&[
        "spectral",
        "--model",
        &path_arg(&ctx.model),
        "--elm",
        &path_arg(&t.value.checkpoint),
        "--limit",
        &n.to_string(),
        "--iterations",
        "30",
        "--data-dir",
        &path_arg(&ctx.data_dir),
    ]);
    let elm = ctx.elm;
    ctx.stages.run("spectral", &config, n as f64 * 10.0, |_| {
        Ok(elm.run::<Unread>(&a)?.raw)
    })
}
