//! `elm compress`, `elm train`, `elm eval`: the ELM method's command line.

use std::path::PathBuf;

use elm::elm::accounting::{kv_report, param_report};
use elm::elm::config::TrainConfig;
use elm::elm::data::{
    load_examples, load_gsm8k, resolve_data_dir, tokenize_example, Example, Split,
};
use elm::elm::infer::{ElmModel, InferenceConfig, KvMode};
use elm::elm::module::{load_module, save_module, ElmModule, ModuleMeta, MODULE_FORMAT};
use elm::elm::train::{HeldOut, TrainEvent, Trainer, STATE_FILE};
use elm::elm::ElmConfig;
use elm::error::{ElmError, Result};
use elm::eval::gsm8k::{chat_prompt, eval_gsm8k, Gsm8kOptions};
use elm::io::tokenizer::Tokenizer;
use elm::model::{load_pretrained, load_weights, ModelWeights};
use elm::solver::{SolverConfig, StopCriteria};

/// Prints `value` as one JSON line (for `--json`).
fn print_json(value: &serde_json::Value) -> Result<()> {
    let s = serde_json::to_string(value).map_err(|e| ElmError::Json {
        what: "output".into(),
        msg: e.to_string(),
    })?;
    println!("{s}");
    Ok(())
}

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
    /// Output checkpoint directory (elm.json + module.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Context length for the KV-bytes report.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    #[arg(long)]
    pub json: bool,
}

/// Initialises the fixed-point module from layer `l` and reports parameter/KV accounting.
pub fn run_compress(a: CompressArgs) -> Result<()> {
    let dense = load_weights(&a.model)?;
    let ec = ElmConfig {
        init_seed: a.seed,
        injection: !a.no_injection,
        fixed_iterations: a.fixed_iterations,
        ..ElmConfig::new(a.start, a.num_replaced)
    };
    let module = ElmModule::init(&dense, &ec)?;
    let meta = ModuleMeta {
        format: MODULE_FORMAT.into(),
        elm: ec.clone(),
        model_config: dense.config.clone(),
        base_model: a.model.display().to_string(),
    };
    save_module(&a.out, &module, &meta)?;
    let params = param_report(&dense.config, &ec);
    let kv = kv_report(&dense.config, &ec, 1, a.context, a.num_replaced);
    if a.json {
        print_json(&serde_json::json!({
            "out": a.out.display().to_string(),
            "params": params,
            "kv": kv,
        }))?;
    } else {
        println!("wrote {}", a.out.display());
        println!(
            "parameters: dense {} ({} non-embedding) -> ELM {} ({} non-embedding); reduction {:.1}% total, {:.1}% non-embedding",
            params.dense_total,
            params.dense_non_embedding,
            params.elm_total,
            params.elm_non_embedding,
            100.0 * params.reduction_total,
            100.0 * params.reduction_non_embedding
        );
        println!(
            "KV bytes at {} tokens: dense {}, one-step {} ({:.3}), multi-step(M iterations) {}",
            a.context, kv.dense, kv.one_step, kv.one_step_ratio, kv.multi_step
        );
    }
    Ok(())
}

/// Options selecting and solving an ELM at inference (shared by generate and eval).
#[derive(clap::Args, Debug, Clone)]
pub struct ElmInferArgs {
    /// ELM checkpoint directory (from `elm compress` or `elm train`); omit for the dense model.
    #[arg(long)]
    pub elm: Option<PathBuf>,
    /// Fixed-point solver: picard | anderson | broyden.
    #[arg(long, default_value = "anderson")]
    pub solver: String,
    /// δ: per-token absolute residual tolerance ‖f(z)−z‖₂ (adaptive stopping); 0 = always
    /// max-iter.
    #[arg(long, alias = "tol", default_value_t = 0.5)]
    pub abs_tol: f64,
    /// Maximum solver iterations per token.
    #[arg(long, default_value_t = 16)]
    pub max_iter: usize,
    /// KV cache of the fixed-point block: one-step | multi-step.
    #[arg(long, default_value = "one-step")]
    pub kv: String,
    /// Run every prefill for max-iter iterations instead of stopping adaptively.
    #[arg(long)]
    pub fixed_prefill: bool,
}

impl ElmInferArgs {
    pub fn inference_config(&self) -> Result<InferenceConfig> {
        let cfg = InferenceConfig {
            solver: SolverConfig::by_name(&self.solver)?,
            stop: StopCriteria::absolute(self.abs_tol, self.max_iter),
            kv_mode: self.kv.parse::<KvMode>()?,
            adaptive_prefill: !self.fixed_prefill,
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
    /// Continue the run saved in --out.
    #[arg(long)]
    pub resume: bool,
    /// Training data: a .jsonl (question/answer or text) or text file; default GSM8K train.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Data directory holding gsm8k/ (default: $ELM_DATA_DIR or ../shared/data).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Held-out GSM8K test problems for the distillation loss before/after (0 = skip).
    #[arg(long, default_value_t = 16)]
    pub eval_examples: usize,
    #[arg(long)]
    pub json: bool,
}

/// Tokenizes examples into training sequences (chat template for Q/A).
fn tokenize_all(
    tok: &Tokenizer,
    examples: &[Example],
    max_len: usize,
) -> Result<Vec<elm::elm::data::TokenSequence>> {
    let prompt = |q: &str| chat_prompt(tok, q);
    let enc = |s: &str| tok.encode(s, false);
    examples
        .iter()
        .map(|e| tokenize_example(e, max_len, &prompt, "<|im_end|>\n", &enc))
        .filter(|r| r.as_ref().map_or(true, |s| s.tokens.len() >= 2))
        .collect()
}

/// `elm train`: trains the module, checkpointing atomically; `--resume` continues a run.
pub fn run_train(a: TrainArgs) -> Result<()> {
    let (dense, tok): (ModelWeights, Tokenizer) = load_pretrained(&a.model)?;
    let mut trainer = if a.resume {
        if a.config.is_some()
            || a.steps.is_some()
            || a.elm.is_some()
            || a.start.is_some()
            || a.num_replaced.is_some()
        {
            return Err(ElmError::config(
                "resume",
                "--resume continues the saved run as configured: drop --config/--steps/--elm/--start/--m",
            ));
        }
        if !a.out.join(STATE_FILE).exists() {
            return Err(ElmError::config(
                "resume",
                format!("no {} in {}", STATE_FILE, a.out.display()),
            ));
        }
        Trainer::resume(&dense, &a.out)?
    } else {
        let mut cfg = match &a.config {
            Some(p) => TrainConfig::from_file(p)?,
            None => TrainConfig::default(),
        };
        if let Some(s) = a.steps {
            cfg.steps = s;
        }
        let (ec, module) = match (&a.elm, a.start, a.num_replaced) {
            (Some(dir), None, None) => {
                let (module, meta) = load_module(dir)?;
                if meta.model_config != dense.config {
                    return Err(ElmError::config(
                        "elm",
                        "module was built for a different model",
                    ));
                }
                (meta.elm, module)
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
        Trainer::new(&dense, ec, &module, cfg, a.model.display().to_string())?
    };
    let examples: Vec<Example> = match &a.data {
        Some(p) => load_examples(p)?,
        None => {
            let dir = resolve_data_dir(a.data_dir.as_deref())?;
            load_gsm8k(&dir, Split::Train)?
                .into_iter()
                .map(Example::Qa)
                .collect()
        }
    };
    let seq_len = trainer.cfg.seq_len;
    let data = tokenize_all(&tok, &examples, seq_len)?;
    if data.is_empty() {
        return Err(ElmError::InvalidArgument(
            "training data has no usable sequence".into(),
        ));
    }
    let pad = tok.eos_id().unwrap_or(0);
    let held = if a.eval_examples > 0 {
        let dir = resolve_data_dir(a.data_dir.as_deref())?;
        let test: Vec<Example> = load_gsm8k(&dir, Split::Test)?
            .into_iter()
            .take(a.eval_examples)
            .map(Example::Qa)
            .collect();
        tokenize_all(&tok, &test, seq_len)?
    } else {
        vec![]
    };
    let bar = indicatif::ProgressBar::new(trainer.cfg.steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_position(trainer.step as u64);
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
        let mut v = serde_json::to_value(&outcome).map_err(|e| ElmError::Json {
            what: "output".into(),
            msg: e.to_string(),
        })?;
        v["out"] = a.out.display().to_string().into();
        v["params"] = serde_json::to_value(&params).unwrap_or_default();
        print_json(&v)?;
    } else {
        println!(
            "trained {} steps ({} this run, {:.1}s) -> {}",
            outcome.steps,
            outcome.steps_this_run,
            outcome.seconds,
            a.out.display()
        );
        if let (Some(b), Some(f)) = (outcome.distill_before, outcome.distill_after) {
            println!(
                "held-out distillation MSE ({} GSM8K test problems): {b:.5} -> {f:.5}",
                outcome.held_out_examples
            );
        }
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Dense model: a .gguf file or an HF directory.
    #[arg(long)]
    pub model: PathBuf,
    #[command(flatten)]
    pub infer: ElmInferArgs,
    /// Task (only gsm8k).
    #[arg(long, default_value = "gsm8k")]
    pub task: String,
    /// Number of GSM8K test problems (from the start of the split).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Skip the reference-answer perplexity.
    #[arg(long)]
    pub no_perplexity: bool,
    /// Print every sample.
    #[arg(long)]
    pub samples: bool,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// `elm eval --task gsm8k`: greedy accuracy (exact match) + answer perplexity.
pub fn run_eval(a: EvalArgs) -> Result<()> {
    if a.task != "gsm8k" {
        return Err(ElmError::config(
            "task",
            format!("`{}`: only gsm8k is supported", a.task),
        ));
    }
    let (model, tok) = ElmModel::load(&a.model, a.infer.elm.as_deref())?;
    let dir = resolve_data_dir(a.data_dir.as_deref())?;
    let test: Vec<_> = load_gsm8k(&dir, Split::Test)?
        .into_iter()
        .take(a.limit)
        .collect();
    let opts = Gsm8kOptions {
        batch: a.batch,
        max_new_tokens: a.max_new_tokens,
        inference: a.infer.inference_config()?,
        perplexity: !a.no_perplexity,
    };
    let bar = indicatif::ProgressBar::new(test.len() as u64);
    let mut r = eval_gsm8k(&model, &tok, &test, &opts, |done| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    if !a.samples {
        r.samples.iter_mut().for_each(|s| s.question.clear());
    }
    if a.json {
        let mut v = serde_json::to_value(&r).map_err(|e| ElmError::Json {
            what: "result".into(),
            msg: e.to_string(),
        })?;
        if !a.samples {
            v.as_object_mut().map(|o| o.remove("samples"));
        }
        v["model"] = a.model.display().to_string().into();
        v["elm"] = a.infer.elm.as_ref().map(|p| p.display().to_string()).into();
        v["inference"] = serde_json::to_value(&opts.inference).unwrap_or_default();
        print_json(&v)?;
    } else {
        println!(
            "GSM8K {}/{} = {:.1}% | answer ppl {} | {:.1} tok/s | iterations/token {:.2} (max {}) | layer evals/token {:.2}",
            r.correct,
            r.n,
            100.0 * r.accuracy,
            r.answer_perplexity.map_or("-".into(), |p| format!("{p:.3}")),
            r.tok_s,
            r.solver.mean_iterations,
            r.solver.max_iterations,
            r.solver.layer_evals_per_token
        );
        if a.samples {
            for s in &r.samples {
                println!(
                    "---\n{}\n=> {:?} (ref {:?}) {}",
                    s.prediction,
                    s.extracted,
                    s.reference,
                    if s.correct { "✓" } else { "✗" }
                );
            }
        }
    }
    Ok(())
}
