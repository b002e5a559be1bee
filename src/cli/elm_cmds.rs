//! `elm compress`, `elm train`, `elm eval`: the ELM method's command line.

use std::path::PathBuf;

use elm::data::{load_examples, load_gsm8k, resolve_data_dir, tokenize_all, Example, Split};
use elm::equilibrium::accounting::{kv_report, param_report};
use elm::equilibrium::config::TrainConfig;
use elm::equilibrium::infer::{ActQuant, ElmModel, InferenceConfig, KvMode};
use elm::equilibrium::module::{
    load_module_for, save_module, ElmModule, ModuleMeta, MODULE_FORMAT,
};
use elm::equilibrium::train::{HeldOut, TrainEvent, Trainer, STATE_FILE};
use elm::equilibrium::ElmConfig;
use elm::error::{ElmError, Result};
use elm::eval::{run_task, BootstrapConfig, Task, TaskData, TaskOptions, TaskRun};
use elm::formats::tokenizer::Tokenizer;
use elm::model::{load_weights, ModelWeights};
use elm::solver::{SolverConfig, StopCriteria};

use super::output::{bar, default_blas_threads, print_json, to_json};
use super::output::{open_run, OpenedRun};
use elm::io::RunStart;

#[derive(clap::Args, Debug)]
pub struct CompressArgs {
    /// Dense model: a .gguf file or an HF directory.
    #[arg(long)]
    pub model: PathBuf,
    /// First replaced layer l.
    #[arg(long)]
    pub start: usize,
    /// Number of replaced layers M.
    #[arg(long = "num-replaced", alias = "m")]
    pub num_replaced: usize,
    /// Seed of W_z's init.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// No input injection: `u = z`, iterated from `z⁰ = h` (with --fixed-iterations 1:
    /// LLM-Streamline's replacement layer; with K: a looped layer).
    #[arg(long)]
    pub no_injection: bool,
    /// Exactly K applications of the block at training and inference instead of a solve.
    #[arg(long)]
    pub fixed_iterations: Option<usize>,
    /// The block's init: first-layer (a copy of layer l) | la-co (LaCo's RDSC merge of the
    /// window's layers) | average (the window's mean, Relaxed Recursive Transformers' init).
    #[arg(long, default_value = "first-layer")]
    pub block_init: elm::compress::BlockInit,
    /// Relaxed Recursive Transformers: one LoRA of this rank per loop on the shared block's
    /// seven linear maps, initialised by the truncated SVD of each replaced layer's difference
    /// to the block (needs --no-injection and --fixed-iterations M; pair with --block-init
    /// average, the paper's init).
    #[arg(long)]
    pub relaxed_rank: Option<usize>,
    /// The block's kind: decoder (attention + MLP) | ffn (the MLP half alone, no attention and
    /// no KV cache: LLM-Streamline's FFN replacement).
    #[arg(long, default_value = "decoder")]
    pub block: elm::equilibrium::BlockKind,
    /// Output checkpoint directory (elm.json + module.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Context length for the KV-bytes report.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    #[command(flatten)]
    pub write: super::output::WriteFlags,
}

/// Initialises the fixed-point module from layer `l` and reports parameter/KV accounting.
pub fn run_compress(a: CompressArgs) -> Result<()> {
    let (block_init, block) = (a.block_init, a.block);
    let _run = a.write.lock_dir(&a.out)?;
    let dense = load_weights(&a.model)?;
    // The KV report multiplies the context out: refuse one that overflows.
    let mc = &dense.config;
    elm::limits::checked_product(
        "context",
        &[
            a.context,
            mc.num_layers,
            mc.num_kv_heads,
            mc.head_dim,
            2 * 4,
        ],
    )?;
    let ec = ElmConfig {
        init_seed: a.seed,
        injection: !a.no_injection,
        fixed_iterations: a.fixed_iterations,
        block,
        relaxed: a
            .relaxed_rank
            .map(|rank| elm::equilibrium::RelaxedLoops { rank }),
        ..ElmConfig::new(a.start, a.num_replaced)
    };
    let module = elm::compress::init_module(&dense, &ec, block_init)?;
    if ec.is_relaxed() {
        // Before elm.json: a checkpoint that names its loops has them.
        let shared = module.block.decoder().ok_or_else(|| {
            ElmError::config("block", "a relaxed recursive module needs a decoder block")
        })?;
        let loops = elm::equilibrium::relaxed::svd_init(&dense, &ec, shared)?;
        std::fs::create_dir_all(&a.out).map_err(|e| ElmError::io(&a.out, e))?;
        elm::equilibrium::relaxed::save_loops(&a.out, &loops)?;
    }
    let meta = ModuleMeta {
        format: MODULE_FORMAT.into(),
        elm: ec.clone(),
        model_config: dense.config.clone(),
        base_model: a.model.display().to_string(),
        heal: None,
    };
    save_module(&a.out, &module, &meta)?;
    let params = param_report(&dense.config, &ec);
    let kv = kv_report(&dense.config, &ec, 1, a.context, a.num_replaced);
    if a.write.json {
        print_json(&serde_json::json!({
            "out": a.out.display().to_string(),
            "block_init": block_init,
            "block": block,
            "params": params,
            "kv": kv,
        }))?;
    } else {
        say!("wrote {}", a.out.display());
        say!(
            "parameters: dense {} ({} non-embedding) -> ELM {} ({} non-embedding); reduction {:.1}% total, {:.1}% non-embedding",
            params.dense_total,
            params.dense_non_embedding,
            params.elm_total,
            params.elm_non_embedding,
            100.0 * params.reduction_total,
            100.0 * params.reduction_non_embedding
        );
        say!(
            "KV bytes at {} tokens: dense {}, one-step {} ({:.3}), multi-step(M iterations) {}",
            a.context,
            kv.dense,
            kv.one_step,
            kv.one_step_ratio,
            kv.multi_step
        );
    }
    Ok(())
}

/// Options selecting and solving an ELM at inference (shared by generate and eval).
#[derive(clap::Args, Debug, Clone)]
pub struct ElmInferArgs {
    /// ELM checkpoint directory (from `elm compress` or `elm train`), or a quantized GGUF
    /// from `elm quantize --elm` (the whole model: --model is then not read for it); omit
    /// for the dense model.
    #[arg(long)]
    pub elm: Option<PathBuf>,
    /// Fixed-point solver: picard | anderson | broyden.
    #[arg(long, default_value = "anderson")]
    pub solver: SolverConfig,
    /// δ: per-token absolute residual tolerance ‖f(z)−z‖₂ (adaptive stopping); 0 = always
    /// max-iter.
    #[arg(long, alias = "tol", default_value_t = 0.5)]
    pub abs_tol: f64,
    /// Maximum solver iterations per token.
    #[arg(long, default_value_t = 16)]
    pub max_iter: usize,
    /// KV cache of the fixed-point block: one-step | multi-step.
    #[arg(long, default_value = "one-step")]
    pub kv: KvMode,
    /// Run every prefill for max-iter iterations instead of stopping adaptively.
    #[arg(long)]
    pub fixed_prefill: bool,
    /// How the module's products with quantized weights quantize their activations: q8x2 (two
    /// 8-bit blocks, ≈ 16-bit: the iteration reaches δ) or q8 (one 8-bit block, as the dense
    /// layers: faster per evaluation, but the residual stalls above δ). No effect on f32 weights.
    #[arg(long, default_value = "q8x2")]
    pub module_acts: ActQuant,
}

impl ElmInferArgs {
    /// These options as `elm generate` arguments (what `elm bench` passes to the processes
    /// it measures memory in).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![];
        if let Some(elm) = &self.elm {
            args.extend(["--elm".to_string(), elm.display().to_string()]);
        }
        args.extend([
            "--solver".to_string(),
            self.solver.name().to_string(),
            "--abs-tol".to_string(),
            self.abs_tol.to_string(),
            "--max-iter".to_string(),
            self.max_iter.to_string(),
            "--kv".to_string(),
            self.kv.to_string(),
            "--module-acts".to_string(),
            self.module_acts.to_string(),
        ]);
        if self.fixed_prefill {
            args.push("--fixed-prefill".to_string());
        }
        args
    }
    pub fn inference_config(&self) -> Result<InferenceConfig> {
        let cfg = InferenceConfig {
            solver: self.solver.clone(),
            stop: StopCriteria::absolute(self.abs_tol, self.max_iter),
            kv_mode: self.kv,
            adaptive_prefill: !self.fixed_prefill,
            module_activations: self.module_acts,
            z0: elm::equilibrium::inference_config::InitialState::Module,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Dense model: a .gguf file or an HF directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Initial module checkpoint (from `elm compress`); else give --start and --m.
    #[arg(long)]
    pub elm: Option<PathBuf>,
    #[arg(long)]
    pub start: Option<usize>,
    /// Number of replaced layers M (with --start).
    #[arg(long = "num-replaced", alias = "m")]
    pub num_replaced: Option<usize>,
    /// Training config JSON (TrainConfig; unknown keys rejected).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Overrides the config's step count.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Output directory (resumable checkpoint + module).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub run: super::output::RunFlags,
    #[command(flatten)]
    pub source: super::output::DataFlags,
    /// Held-out GSM8K validation problems (the end of train.jsonl, never trained on) for the
    /// distillation loss before/after (0 = skip).
    #[arg(long, default_value_t = 16)]
    pub eval_examples: usize,
    /// Cache the teacher's states (h_l, h_{l+M}) of every batch in this directory, shared by
    /// runs over the same model, window and batches (bit-identical results).
    #[arg(long)]
    pub teacher_cache: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// `elm train`: trains the module, checkpointing atomically; `--resume` continues a run.
pub fn run_train(a: TrainArgs) -> Result<()> {
    if a.run.resume
        && (a.config.is_some()
            || a.steps.is_some()
            || a.elm.is_some()
            || a.start.is_some()
            || a.num_replaced.is_some())
    {
        return Err(ElmError::config(
            "resume",
            "--resume continues the saved run as configured: drop --config/--steps/--elm/--start/--m",
        ));
    }
    let OpenedRun {
        run,
        start,
        dense,
        tok,
    } = open_run::<TrainRequest>(&a.out, &a.run, ("train", STATE_FILE, "run"), &a.model)?;
    // A fresh run's request, written once everything is checked, before its first save.
    let mut request = None;
    let mut trainer = match start {
        RunStart::Resume => Trainer::resume(&dense, &a.out)?,
        // Stopped before its starting point was saved (a full disk): nothing was trained, so
        // the run starts again as it was requested.
        RunStart::Restart { request: req, .. } => match &req.init_module {
            Some(dir) => {
                let (ec, module, loops) = start_module(dir, &dense, &a.model)?;
                let t = Trainer::new(
                    &dense,
                    ec,
                    &module,
                    req.train,
                    a.model.display().to_string(),
                )?;
                with_start_loops(t, loops)?
            }
            None => {
                let module = ElmModule::init(&dense, &req.elm)?;
                Trainer::new(
                    &dense,
                    req.elm,
                    &module,
                    req.train,
                    a.model.display().to_string(),
                )?
            }
        },
        RunStart::Fresh => {
            let mut start_loops = None;
            let mut cfg = match &a.config {
                Some(p) => TrainConfig::from_file(p)?,
                None => TrainConfig::default(),
            };
            if let Some(s) = a.steps {
                cfg.steps = s;
            }
            let (ec, module) = match (&a.elm, a.start, a.num_replaced) {
                (Some(dir), None, None) => {
                    if elm::equilibrium::interchange::is_official_dir(dir) {
                        return Err(ElmError::Unsupported(format!(
                            "{}: an official integrated ELM holds no replaced layers (training's \
                         teacher), so it cannot be trained further here; evaluate, decode or \
                         quantize it, or train a module with --start/--num-replaced",
                            dir.display()
                        )));
                    }
                    let (ec, module, loops) = start_module(dir, &dense, &a.model)?;
                    start_loops = loops;
                    (ec, module)
                }
                (None, Some(l), Some(m)) => {
                    let ec = ElmConfig::new(l, m);
                    let module = ElmModule::init(&dense, &ec)?;
                    (ec, module)
                }
                _ => {
                    return Err(ElmError::config(
                        "elm",
                        "give either --elm CKPT or both --start and --m",
                    ))
                }
            };
            request = Some(TrainRequest {
                train: cfg.clone(),
                elm: ec.clone(),
                init_module: a.elm.clone(),
            });
            let t = Trainer::new(&dense, ec, &module, cfg, a.model.display().to_string())?;
            with_start_loops(t, start_loops)?
        }
    };
    let examples: Vec<Example> = match &a.source.data {
        Some(p) => load_examples(p)?,
        None => {
            let dir = resolve_data_dir(a.source.data_dir.as_deref())?;
            load_gsm8k(&dir, Split::Train)?
                .into_iter()
                .map(Example::Qa)
                .collect()
        }
    };
    if let Some(dir) = &a.teacher_cache {
        trainer.set_teacher_cache(dir.clone())?;
    }
    let seq_len = trainer.cfg.seq_len;
    let data = tokenize_all(&tok, &examples, seq_len)?;
    if data.is_empty() {
        return Err(ElmError::InvalidArgument(
            "training data has no usable sequence".into(),
        ));
    }
    let pad = tok.eos_id().unwrap_or(0);
    let memory = training_memory("train", &a.model, &dense, &trainer, &data, pad)?;
    super::output::check_memory(&memory, a.json)?;
    let held = if a.eval_examples > 0 {
        let dir = resolve_data_dir(a.source.data_dir.as_deref())?;
        let held: Vec<Example> = load_gsm8k(&dir, Split::Validation)?
            .into_iter()
            .take(a.eval_examples)
            .map(Example::Qa)
            .collect();
        tokenize_all(&tok, &held, seq_len)?
    } else {
        vec![]
    };
    let bar = bar(trainer.cfg.steps, trainer.step);
    if let Some(req) = &request {
        // Before the starting point is saved: a run stopped before that save (a full disk) is
        // then resumed by starting it again as asked.
        run.write_request("train", &dense.config, req)?;
    }
    let outcome = trainer.run(&data, pad, &a.out, Some(&HeldOut::new(&held)), |event| {
        if let TrainEvent::Step(log) = event {
            bar.set_message(format!(
                "loss {:.4} distill {:.4} ce {} λce {:.2} lr {:.2e} |g| {:.3}",
                log.loss,
                log.distill,
                log.ce.map_or("-".into(), |c| format!("{c:.4}")),
                log.lambda_ce,
                log.lr,
                log.grad_norm
            ));
            bar.inc(1);
        }
    })?;
    bar.finish_and_clear();
    let params = param_report(&dense.config, &trainer.elm);
    if a.json {
        let mut v = to_json(&outcome)?;
        v["out"] = a.out.display().to_string().into();
        v["params"] = serde_json::to_value(&params).unwrap_or_default();
        // Measured high-water mark of this process (the whole training, evaluation included).
        v["peak_rss_bytes"] = elm::io::peak_rss_bytes().into();
        v["memory_estimate"] = serde_json::to_value(&memory).unwrap_or_default();
        v["teacher_cache"] =
            serde_json::to_value(trainer.teacher_cache_stats()).map_err(|e| ElmError::Json {
                what: "teacher cache counts".into(),
                msg: e.to_string(),
            })?;
        print_json(&v)?;
    } else {
        say!(
            "trained {} steps ({} this run, {:.1}s) -> {}",
            outcome.steps,
            outcome.steps_this_run,
            outcome.seconds,
            a.out.display()
        );
        if let (Some(b), Some(f)) = (outcome.distill_before, outcome.distill_after) {
            say!(
                "held-out distillation MSE ({} GSM8K test problems): {b:.5} -> {f:.5}",
                outcome.held_out_examples
            );
        }
    }
    Ok(())
}

/// The module a training starts from, read from checkpoint `dir`: its layout, its module and,
/// for a relaxed recursive module, its loops' adapters.
fn start_module(
    dir: &std::path::Path,
    dense: &ModelWeights,
    model: &std::path::Path,
) -> Result<(
    ElmConfig,
    ElmModule,
    Option<elm::equilibrium::checkpoint::TensorMap>,
)> {
    let meta = elm::equilibrium::module::read_module_meta(dir)?;
    let (module, meta, loops) = if meta.elm.is_relaxed() {
        let (module, meta, loops) =
            elm::equilibrium::module::load_relaxed_for(dir, &dense.config, model)?;
        (module, meta, Some(loops))
    } else {
        let (module, meta) = load_module_for(dir, &dense.config, model)?;
        (module, meta, None)
    };
    if meta.heal.is_some() {
        // A fresh run would start from the module alone and drop the healed layers.
        return Err(ElmError::Unsupported(format!(
            "{}: this module was trained with a heal of the layers after its window; continue \
             that run with --resume, or start a new one from --start/--num-replaced",
            dir.display()
        )));
    }
    Ok((meta.elm, module, loops))
}

/// `trainer` starting from a checkpoint's loop adapters when it has them.
fn with_start_loops<'a>(
    trainer: Trainer<'a>,
    loops: Option<elm::equilibrium::checkpoint::TensorMap>,
) -> Result<Trainer<'a>> {
    match loops {
        Some(l) => trainer.with_loops(l),
        None => Ok(trainer),
    }
}

/// What a fresh `elm train` was asked to do (`run_request.json`).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainRequest {
    train: TrainConfig,
    elm: ElmConfig,
    /// `--elm`: the module the run starts from (`None`: initialised from `--start`/`--m`).
    init_module: Option<PathBuf>,
}

/// A training command's estimate (`train`, `lora`): what is loaded, the model file while it
/// was read, optimiser moments still to come, and a step on the longest sequence (measured on
/// one sequence and scaled to the batch).
pub(crate) fn training_memory(
    command: &str,
    model_path: &std::path::Path,
    dense: &ModelWeights,
    trainer: &impl elm::memory::StepMemory,
    data: &[elm::data::TokenSequence],
    pad: u32,
) -> Result<elm::memory::MemoryEstimate> {
    use elm::memory::{loaded_bytes_or, mapped_model_bytes, MemoryEstimate};
    let longest = data
        .iter()
        .max_by_key(|s| s.tokens.len())
        .ok_or_else(|| ElmError::InvalidArgument("training data has no usable sequence".into()))?;
    // What is loaded is read before the probe, which packs the frozen weights (held after it).
    let loaded = loaded_bytes_or(4 * dense.num_params() as u64);
    let step = trainer.probe_step_bytes(longest, pad)?;
    Ok(
        MemoryEstimate::loaded_model(command, loaded, mapped_model_bytes(model_path))
            .with_held("optimiser moments", trainer.unallocated_optimizer_bytes())
            .with_held("packed frozen weights", trainer.packed_weight_bytes())
            .with_phase(
                "training step",
                &[("step (one sequence probed × batch)", step)],
            ),
    )
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Dense model: a .gguf file or an HF directory.
    #[arg(long)]
    pub model: PathBuf,
    #[command(flatten)]
    pub infer: ElmInferArgs,
    /// The evaluation task.
    #[arg(long, default_value = "gsm8k-nll", value_parser = super::registry::named::<Task>())]
    pub task: Task,
    /// First N items of the split (default: all); with --sample-seed, N drawn at random.
    #[arg(long)]
    pub limit: Option<usize>,
    /// GSM8K split: `test`, or `validation` (the last 500 problems of train.jsonl, which no
    /// training reads: what a study selects on).
    #[arg(long, default_value = "test")]
    pub split: elm::data::Split,
    /// Draw the --limit problems by a shuffle with this seed instead of taking the first ones
    /// (the same seed and size, the same problems; a smaller sample lies inside a larger one).
    #[arg(long)]
    pub sample_seed: Option<u64>,
    /// Sequences per forward batch.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Generation tasks: new tokens per item, or `auto` (GSM8K): the 99th percentile of the
    /// validation split's reference solutions in this model's tokens, rounded up to 16, so
    /// that the budget does not cut answers off (the JSON's `generation_budget` says what it
    /// measured; each sample's `truncated` and the `truncated` metric what was cut).
    #[arg(long, default_value = "256")]
    pub max_new_tokens: elm::eval::gsm8k::MaxNewTokens,
    /// How deep the module runs: `trained` (as trained: its fixed K, or solved), `solved` (by
    /// --solver to --abs-tol, also a module trained as a fixed loop) or a number K' (exactly
    /// K' applications from z⁰, also for a module trained solved). The train-K × test-K study.
    #[arg(long, default_value = "trained")]
    pub depth: elm::equilibrium::inference_config::Depth,
    /// Where the module's iteration starts: `module` (as trained: 0 with injection, h without),
    /// `zero`, `input` (h) or `random` (N(0, RMS(h)²), seed 0). A solved module that is path
    /// independent scores the same from each.
    #[arg(long, default_value = "module")]
    pub z0: elm::equilibrium::inference_config::InitialState,
    /// Pair against the dense model of --model on the same items (Δ with its interval).
    #[arg(long, conflicts_with_all = ["compare_elm", "compare_model"])]
    pub compare_dense: bool,
    /// Pair against this other ELM checkpoint (same solver settings) on the same items.
    #[arg(long, conflicts_with = "compare_model")]
    pub compare_elm: Option<PathBuf>,
    /// Pair against this other dense model (a .gguf file or an HF directory, e.g. another
    /// `elm lora` run's OUT/model) on the same items; it must share --model's tokenizer.
    #[arg(long)]
    pub compare_model: Option<PathBuf>,
    /// Bootstrap resamples of every interval.
    #[arg(long, default_value_t = 2000)]
    pub bootstrap: usize,
    /// Bootstrap seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// HumanEval: wall-clock limit per program, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
    /// HumanEval: run generated code even where no bubblewrap sandbox can be set up (rlimits
    /// and an audit hook only: the code can read and change your files). Never needed where
    /// `bwrap` works.
    #[arg(long)]
    pub unsafe_run_code_without_sandbox: bool,
    /// Print (and keep in the JSON) every generated sample.
    #[arg(long)]
    pub samples: bool,
    /// Data directory holding gsm8k/ and humaneval/ (default: $ELM_DATA_DIR or the repo's data/).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// Runs `task` on one model with a progress bar.
fn run_one(
    label: &str,
    model: &ElmModel,
    tok: &Tokenizer,
    task: Task,
    data: &TaskData,
    opts: &TaskOptions,
) -> Result<TaskRun> {
    let bar = bar(data.len(), 0);
    bar.set_message(label.to_string());
    let run = run_task(model, tok, task, data, opts, |done, _| {
        bar.set_position(done as u64)
    });
    bar.finish_and_clear();
    run
}

/// `elm eval`: one task on one model (dense or ELM), each figure with its 95% bootstrap
/// interval; with `--compare-dense` / `--compare-elm` also the paired difference.
pub fn run_eval(a: EvalArgs) -> Result<()> {
    let task = a.task;
    let dir = resolve_data_dir(a.data_dir.as_deref())?;
    // Sized on validation, never on the problems being scored.
    let (max_new_tokens, generation_budget) = match a.max_new_tokens {
        elm::eval::gsm8k::MaxNewTokens::Fixed(n) => (n, None),
        elm::eval::gsm8k::MaxNewTokens::FromReferences => {
            if task != Task::Gsm8k {
                return Err(ElmError::config(
                    "max-new-tokens",
                    "auto sizes the budget from GSM8K's reference solutions: --task gsm8k only",
                ));
            }
            let tok = elm::model::load_tokenizer(&a.model)?;
            let refs = elm::data::load_gsm8k(&dir, elm::data::Split::Validation)?;
            let b = elm::eval::gsm8k::reference_token_budget(
                &tok,
                &refs,
                elm::eval::gsm8k::REFERENCE_BUDGET_QUANTILE,
            )?;
            (b.max_new_tokens, Some(b))
        }
    };
    let opts = TaskOptions {
        limit: a.limit,
        batch: a.batch,
        max_new_tokens,
        inference: InferenceConfig {
            z0: a.z0,
            ..a.infer.inference_config()?
        },
        bootstrap: BootstrapConfig {
            resamples: a.bootstrap,
            seed: a.seed,
            ..BootstrapConfig::default()
        },
        timeout_s: a.timeout,
        run_without_sandbox: a.unsafe_run_code_without_sandbox,
    };
    opts.validate()?;
    if task.generates() && max_new_tokens == 0 {
        return Err(ElmError::config("max-new-tokens", "must be >= 1"));
    }
    if a.compare_dense && a.infer.elm.is_none() {
        return Err(ElmError::config(
            "compare-dense",
            "needs --elm (the model compared with its dense reference)",
        ));
    }
    let n = a.limit.unwrap_or(usize::MAX);
    let sample = match a.sample_seed {
        Some(seed) => elm::data::ProblemSample::Seeded { n, seed },
        None => elm::data::ProblemSample::First(n),
    };
    let data = TaskData::load(task, &dir, a.split, sample)?;
    default_blas_threads();
    let (model, tok) = ElmModel::load(&a.model, a.infer.elm.as_deref())?;
    let model = model.with_depth(a.depth)?;
    let loaded = elm::memory::loaded_bytes_or(0);
    let comparing = a.compare_dense || a.compare_elm.is_some() || a.compare_model.is_some();
    // The reference model is loaded beside the first: counted as large as it.
    let loaded = if comparing { 2 * loaded } else { loaded };
    let memory = elm::eval::task::memory_estimate(
        &model,
        &tok,
        task,
        &data,
        &opts,
        loaded,
        elm::memory::mapped_model_bytes(&a.model),
    )?;
    super::output::check_memory(&memory, a.json)?;
    let mut run = run_one("model", &model, &tok, task, &data, &opts)?;
    let reference_elm = a.compare_elm.as_ref();
    let reference = if a.compare_dense || reference_elm.is_some() || a.compare_model.is_some() {
        let reference_model = match (reference_elm, &a.compare_model) {
            (Some(dir), _) => ElmModel::load(&a.model, Some(dir))?.0.with_depth(a.depth)?,
            (None, Some(other)) => {
                let (other_model, other_tok) = ElmModel::load(other, None)?;
                if other_tok.vocab_size() != tok.vocab_size() {
                    return Err(ElmError::config(
                        "compare-model",
                        format!(
                            "{}: vocabulary of {} tokens, --model has {}: items would not pair",
                            other.display(),
                            other_tok.vocab_size(),
                            tok.vocab_size()
                        ),
                    ));
                }
                other_model
            }
            // A quantized --elm file holds no f32 weights: the reference is --model itself.
            (None, None) => match model.dense_reference() {
                Some(dense) => dense,
                None => ElmModel::load(&a.model, None)?.0,
            },
        };
        let r = run_one("reference", &reference_model, &tok, task, &data, &opts)?;
        run.pair_with(&r, &opts.bootstrap)?;
        Some(r)
    } else {
        None
    };
    if !a.samples {
        run.gsm8k_samples.clear();
        run.humaneval_samples.clear();
    }
    if a.json {
        let to_value = |r: &TaskRun| {
            serde_json::to_value(r).map_err(|e| ElmError::Json {
                what: "result".into(),
                msg: e.to_string(),
            })
        };
        let mut v = to_value(&run)?;
        v["model"] = a.model.display().to_string().into();
        v["elm"] = a.infer.elm.as_ref().map(|p| p.display().to_string()).into();
        v["data_dir"] = dir.display().to_string().into();
        v["inference"] = serde_json::to_value(&opts.inference).unwrap_or_default();
        v["max_new_tokens"] = max_new_tokens.into();
        v["generation_budget"] = serde_json::to_value(&generation_budget).unwrap_or_default();
        v["memory_estimate"] = serde_json::to_value(&memory).unwrap_or_default();
        v["peak_rss_bytes"] = elm::io::peak_rss_bytes().into();
        v["reference"] = match &reference {
            Some(r) => {
                let mut rv = to_value(r)?;
                if let Some(o) = rv.as_object_mut() {
                    o.remove("gsm8k_samples");
                    o.remove("humaneval_samples");
                }
                rv["elm"] = reference_elm.map(|p| p.display().to_string()).into();
                rv
            }
            None => serde_json::Value::Null,
        };
        print_json(&v)?;
    } else {
        print_run("model", &run);
        if let Some(r) = &reference {
            print_run("reference", r);
        }
        for (name, m) in &run.metrics {
            if let Some(p) = &m.paired {
                say!(
                    "{name}: Δ = {:+.4} [{:+.4}, {:+.4}] ({}){}{}",
                    p.delta.value,
                    p.delta.lo,
                    p.delta.hi,
                    p.verdict,
                    p.ratio.as_ref().map_or(String::new(), |q| format!(
                        ", ratio {:.3} [{:.3}, {:.3}]",
                        q.value, q.lo, q.hi
                    )),
                    p.exact_mcnemar_p
                        .map_or(String::new(), |v| format!(", exact McNemar p = {v:.3}"))
                );
            }
        }
        for s in &run.gsm8k_samples {
            say!(
                "--- {}\n{}\n=> strict {} ({}), flexible {} ({})",
                s.id,
                s.prediction,
                s.score.strict,
                s.score.strict_correct,
                s.score.flexible,
                s.score.flexible_correct
            );
        }
        for s in &run.humaneval_samples {
            say!("--- {} {:?}\n{}", s.task_id, s.verdict, s.completion);
        }
    }
    Ok(())
}

fn print_run(label: &str, r: &TaskRun) {
    for (name, m) in &r.metrics {
        let e = &m.estimate;
        say!(
            "{label}: {name} = {:.4} [{:.4}, {:.4}] (95% bootstrap, n = {})",
            e.value,
            e.lo,
            e.hi,
            e.n
        );
    }
    say!(
        "{label}: {} tokens in {:.1}s = {:.1} tok/s{}",
        r.tokens,
        r.seconds,
        r.tok_s,
        r.perplexity
            .map_or(String::new(), |p| format!(", perplexity {p:.3}"))
    );
}

#[derive(clap::Args, Debug)]
pub struct SpectralArgs {
    /// Dense model: a .gguf file or an HF directory.
    #[arg(long)]
    pub model: PathBuf,
    /// ELM checkpoint directory.
    #[arg(long)]
    pub elm: PathBuf,
    /// GSM8K test problems (question + reference answer, chat template), one sequence each.
    #[arg(long, default_value_t = 8)]
    pub limit: usize,
    /// Sequences are truncated to this many tokens.
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    /// Solver of the fixed point the Jacobian is taken at.
    #[arg(long, default_value = "anderson")]
    pub solver: SolverConfig,
    /// Relative residual tolerance of that solve.
    #[arg(long, default_value_t = 1e-4)]
    pub tol: f64,
    #[arg(long, default_value_t = 50)]
    pub max_iter: usize,
    /// Power iterations (Jacobian-vector products) per sequence.
    #[arg(long, default_value_t = 30)]
    pub iterations: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Data directory holding gsm8k/ (default: $ELM_DATA_DIR or the repo's data/).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// `elm spectral`: ρ(∂φ/∂z) of a trained module at its fixed point, per GSM8K sequence.
pub fn run_spectral(a: SpectralArgs) -> Result<()> {
    use elm::equilibrium::spectral::{sequences_spectral_radius, PowerIteration};
    if a.limit == 0 {
        return Err(ElmError::config("limit", "must be >= 1"));
    }
    // Any ELM `--elm` names (a checkpoint directory, an official integrated directory, a
    // quantized GGUF): only the layers before the window and the module take part.
    let (model, tok) = ElmModel::load(&a.model, Some(&a.elm))?;
    let elm_config = model
        .elm_config()
        .cloned()
        .ok_or_else(|| ElmError::config("elm", "not an ELM"))?;
    let (front, module) = model
        .layers_before_window()
        .ok_or_else(|| ElmError::config("elm", "the ELM has no module"))?;
    let dir = resolve_data_dir(a.data_dir.as_deref())?;
    let test: Vec<Example> = load_gsm8k(&dir, Split::Test)?
        .into_iter()
        .take(a.limit)
        .map(Example::Qa)
        .collect();
    let seqs: Vec<Vec<u32>> = tokenize_all(&tok, &test, a.seq_len)?
        .into_iter()
        .map(|s| s.tokens)
        .collect();
    let power = PowerIteration {
        iterations: a.iterations,
        seed: a.seed,
        ..PowerIteration::default()
    };
    let r = sequences_spectral_radius(
        &front,
        &elm_config,
        &module,
        &seqs,
        &a.solver,
        a.tol,
        a.max_iter,
        &power,
    )?;
    if a.json {
        print_json(&r)?;
    } else {
        say!(
            "ρ(∂φ/∂z) at z* over {} sequences: mean {:.4}, min {:.4}, max {:.4} (max relative residual of z* {:.2e})",
            r.n, r.mean_radius, r.min_radius, r.max_radius, r.max_rel_residual
        );
    }
    Ok(())
}
