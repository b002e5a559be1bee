//! `elm fetch | generate | logits | perplexity | bench`: the dense model from the command line.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use elm::error::{ElmError, Result};
use elm::io::tokenizer::Tokenizer;
use elm::model::bench;
use ndarray::Array2;

use elm::cuda::{CudaModel, DeviceSpec, GpuModel};
use elm::equilibrium::infer::{ElmDecoder, ElmModel};
use elm::eval::gsm8k::stop_ids;
use elm::eval::nll::{teacher_forced_nll, ScoredSequence};
use elm::eval::SolverSummary;
use elm::model::generate::{generate, Decoder, Generation, SamplingConfig};
use elm::model::{
    default_model_path, load_inference, load_pretrained, models_dir, DecoderWeights, ModelWeights,
    QuantWeights, Transformer, WeightStorage,
};

/// Single-threaded OpenBLAS unless the user chose (see [`elm::model::ops::set_blas_threads`]).
fn default_blas_threads() {
    if std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        elm::model::ops::set_blas_threads(1);
    }
}

fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

fn load(path: &Path) -> Result<(Transformer, Tokenizer)> {
    let pb = spinner(&format!("loading {}", path.display()));
    let (weights, tokenizer) = load_pretrained(path)?;
    pb.finish_and_clear();
    Ok((Transformer::new(weights)?, tokenizer))
}

/// The dense model for inference with its matrices stored as `storage` says.
fn load_quant(
    path: &Path,
    storage: WeightStorage,
) -> Result<(Transformer<QuantWeights>, Tokenizer)> {
    let pb = spinner(&format!("loading {} ({storage})", path.display()));
    let (weights, tokenizer) = load_inference(path, storage)?;
    pb.finish_and_clear();
    Ok((Transformer::new(weights)?, tokenizer))
}

/// A dense model in either storage, so one command serves both paths.
enum AnyModel {
    F32(Transformer),
    Quant(Transformer<QuantWeights>),
}

fn load_any(path: &Path, storage: WeightStorage) -> Result<(AnyModel, Tokenizer)> {
    Ok(match storage {
        WeightStorage::F32 => {
            let (m, t) = load(path)?;
            (AnyModel::F32(m), t)
        }
        _ => {
            let (m, t) = load_quant(path, storage)?;
            (AnyModel::Quant(m), t)
        }
    })
}

/// Runs `$body` with `$m` bound to the model of either storage.
macro_rules! with_model {
    ($any:expr, $m:ident => $body:expr) => {
        match $any {
            AnyModel::F32($m) => $body,
            AnyModel::Quant($m) => $body,
        }
    };
}

/// The prompt's token ids, optionally wrapped in the ChatML template.
fn encode_prompt(tok: &Tokenizer, prompt: &str, chat: bool) -> Result<Vec<u32>> {
    let text = if chat {
        tok.apply_chat_template(&[("user", prompt)], true)
    } else {
        prompt.to_string()
    };
    let ids = tok.encode(&text, false)?;
    if ids.is_empty() {
        return Err(ElmError::InvalidArgument(
            "--prompt encodes to zero tokens".into(),
        ));
    }
    Ok(ids)
}

// ---------------------------------------------------------------------------------- fetch

#[derive(clap::Args, Debug)]
pub struct FetchArgs {
    /// Print `{"path": ...}` on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `scripts/fetch-smollm2.sh` (idempotent, verifies SHA-256) into `models_dir()`.
pub fn run_fetch(args: FetchArgs) -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-smollm2.sh");
    let dir = models_dir();
    let output = std::process::Command::new("bash")
        .arg(&script)
        .env("ELM_MODELS_DIR", &dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| ElmError::io(&script, e))?;
    if !output.status.success() {
        return Err(ElmError::io(
            &script,
            std::io::Error::other(format!("fetch script failed: {}", output.status)),
        ));
    }
    let path = default_model_path();
    if args.json {
        print_json(&json!({ "path": path, "verified": true }));
    } else {
        println!("{}", path.display());
    }
    Ok(())
}

// ------------------------------------------------------------------------------- generate

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A .gguf file or an HF directory (default: the fetched SmolLM2).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt as a user turn of the model's chat template.
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Generate this many samples of the prompt in one batch (seeds seed..seed+B).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Stop once the text contains this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Weight storage of the CPU inference path: f32 | q8_0 | q4_0 | q4_1 | auto (auto keeps
    /// a GGUF's quantized blocks; a block format quantizes on the fly).
    #[arg(long, default_value = "f32")]
    pub weights: String,
    /// One JSON object on stdout instead of streamed text.
    #[arg(long)]
    pub json: bool,
    /// ELM options (`--elm CKPT --solver .. --abs-tol .. --max-iter .. --kv ..`; CPU only).
    #[command(flatten)]
    pub elm: super::elm_cmds::ElmInferArgs,
}

/// Solver and cache figures `generate --elm` adds to its report.
#[derive(Debug, serde::Serialize)]
struct ElmGenerateStats {
    kv_bytes: usize,
    kv_mode: elm::equilibrium::infer::KvMode,
    solver: String,
    abs_tol: f64,
    max_iter: usize,
    decode: SolverSummary,
    prefill_iterations: Vec<usize>,
}

pub fn run_generate(args: GenerateArgs) -> Result<()> {
    default_blas_threads();
    let device: DeviceSpec = args.device.parse()?;
    if args.batch == 0 {
        return Err(ElmError::config("--batch", "must be >= 1"));
    }
    if args.max_new_tokens == 0 {
        return Err(ElmError::config(
            "--max-new-tokens",
            "must be >= 1 (zero new tokens measures nothing)",
        ));
    }
    if args.elm.elm.is_some() && device != DeviceSpec::Cpu {
        return Err(ElmError::Unsupported(
            "ELM generation (--elm) runs on the CPU only".into(),
        ));
    }
    let storage: WeightStorage = args.weights.parse()?;
    if storage != WeightStorage::F32 && device != DeviceSpec::Cpu {
        return Err(ElmError::Unsupported(
            "--weights other than f32 runs on the CPU only".into(),
        ));
    }
    let path = args.model.clone().unwrap_or_else(default_model_path);
    let pb = spinner(&format!("loading {}", path.display()));
    let (model, tok) = if storage != WeightStorage::F32 && args.elm.elm.is_none() {
        // The dense quantized path never holds the f32 weights.
        let (q, tok) = load_quant(&path, storage)?;
        (QuantOrElm::Quant(Box::new(q)), tok)
    } else {
        let (m, tok) = ElmModel::load_with(&path, args.elm.elm.as_deref(), storage)?;
        (QuantOrElm::Elm(Box::new(m)), tok)
    };
    pb.finish_and_clear();
    let prompt = encode_prompt(&tok, &args.prompt, args.chat)?;
    let mc = match &model {
        QuantOrElm::Quant(q) => q.config().clone(),
        QuantOrElm::Elm(m) => m.config().clone(),
    };
    check_generation_size(&mc, prompt.len(), args.max_new_tokens, args.batch)?;
    let config = SamplingConfig {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        // EOS and, for chat models, the end-of-turn token.
        stop_token_ids: stop_ids(&tok),
        stop_strings: args.stop.clone(),
    };
    let prompts = vec![prompt; args.batch];
    let stream = !args.json;
    // ELM runs report their solver statistics too.
    let mut elm_report = None;
    let model = match model {
        QuantOrElm::Quant(q) => {
            let out = generate_streaming(q.as_ref(), &prompts, &config, &tok, stream)?;
            return report_generation(&args, &config, &tok, out, None);
        }
        QuantOrElm::Elm(m) => *m,
    };
    let out = match device {
        DeviceSpec::Cpu if model.elm.is_some() => {
            let cfg = args.elm.inference_config()?;
            let decoder = ElmDecoder::new(&model, cfg.clone())?;
            let out = generate_streaming(&decoder, &prompts, &config, &tok, stream)?;
            let rec = decoder.record();
            elm_report = Some(ElmGenerateStats {
                kv_bytes: rec.kv_bytes,
                kv_mode: cfg.kv_mode,
                solver: cfg.solver.name().to_string(),
                abs_tol: cfg.stop.abs_tol,
                max_iter: cfg.stop.max_iter,
                decode: SolverSummary::from_stats(&rec.decode_stats, model.kept_layers().len()),
                prefill_iterations: rec.prefill_stats.iter().map(|p| p.iterations).collect(),
            });
            out
        }
        DeviceSpec::Cpu => {
            let dense = Transformer::new(model.weights)?;
            generate_streaming(&dense, &prompts, &config, &tok, stream)?
        }
        DeviceSpec::Cuda(ordinal) => {
            let gpu = CudaDecoder {
                weights: &model.weights,
                ordinal,
            };
            generate_streaming(&gpu, &prompts, &config, &tok, stream)?
        }
    };
    report_generation(&args, &config, &tok, out, elm_report)
}

/// Refuses, before anything is allocated, a generation past the model's context or whose
/// prompts and KV caches for `--batch` sequences cannot fit in memory.
fn check_generation_size(
    mc: &elm::model::ModelConfig,
    prompt: usize,
    max_new: usize,
    batch: usize,
) -> Result<()> {
    if prompt > mc.max_position_embeddings {
        return Err(ElmError::config(
            "--prompt",
            format!(
                "{prompt} tokens exceed the model's context length of {} tokens \
                 (max_position_embeddings)",
                mc.max_position_embeddings
            ),
        ));
    }
    let total = elm::limits::checked_add("--max-new-tokens", prompt, max_new)?;
    if total > mc.max_position_embeddings {
        return Err(ElmError::config(
            "--max-new-tokens",
            format!(
                "prompt of {prompt} tokens + {max_new} new tokens exceeds the model's context \
                 length of {} tokens (max_position_embeddings)",
                mc.max_position_embeddings
            ),
        ));
    }
    let kv = elm::limits::bytes_of(
        2 * 4,
        &[mc.num_layers, batch, mc.num_kv_heads, total, mc.head_dim],
    );
    let prompts = elm::limits::bytes_of(4, &[batch, total]);
    elm::limits::check_alloc("--batch", kv.saturating_add(prompts))
}

/// What `run_generate` loaded: a dense quantized model, or an [`ElmModel`] (dense or ELM).
enum QuantOrElm {
    Quant(Box<Transformer<QuantWeights>>),
    Elm(Box<ElmModel>),
}

fn report_generation(
    args: &GenerateArgs,
    config: &SamplingConfig,
    tok: &Tokenizer,
    out: Generation,
    elm_report: Option<ElmGenerateStats>,
) -> Result<()> {
    let texts: Vec<String> = out
        .tokens
        .iter()
        .map(|ids| {
            // The stop token (e.g. `<|im_end|>`) ends the text; it is not part of it.
            let ids = match ids.split_last() {
                Some((last, rest)) if config.stop_token_ids.contains(last) => rest,
                _ => &ids[..],
            };
            let text = tok.decode(ids)?;
            Ok(truncate_at_stop(text, &args.stop))
        })
        .collect::<Result<_>>()?;
    // The first token of each sequence comes from the prefill logits.
    let decode_tokens = out.new_tokens.saturating_sub(args.batch);
    let prefill_tok_s = out.prompt_tokens as f64 / out.prefill_secs.max(1e-12);
    let decode_tok_s = if out.decode_secs > 0.0 {
        decode_tokens as f64 / out.decode_secs
    } else {
        0.0
    };
    if args.json {
        let mut v = json!({
            "text": texts[0],
            "texts": texts,
            "prompt_tokens": out.prompt_tokens,
            "new_tokens": out.new_tokens,
            "prefill_tok_s": prefill_tok_s,
            "decode_tok_s": decode_tok_s,
            "finish_reasons": out.finish,
            "device": args.device,
        });
        if let (Some(obj), Some(serde_json::Value::Object(extra))) =
            (v.as_object_mut(), elm_report.as_ref().map(|r| json!(r)))
        {
            obj.extend(extra);
        }
        print_json(&v);
    } else {
        println!();
        for (b, text) in texts.iter().enumerate().skip(1) {
            println!("--- sample {b} ---\n{text}");
        }
        eprintln!(
            "[{} prompt tokens, {} new; prefill {prefill_tok_s:.1} tok/s, decode {decode_tok_s:.1} tok/s]",
            out.prompt_tokens, out.new_tokens
        );
        if let Some(r) = &elm_report {
            eprintln!(
                "[ELM {}: iterations/token {:.2} (max {}), layer evals/token {:.2}, KV {} bytes]",
                r.solver,
                r.decode.mean_iterations,
                r.decode.max_iterations,
                r.decode.layer_evals_per_token,
                r.kv_bytes
            );
        }
    }
    Ok(())
}

/// Runs [`generate`], printing sequence 0's text as it grows when `stream` is set
/// (a token may end inside a UTF-8 character: wait until no replacement char trails).
fn generate_streaming<D: Decoder>(
    model: &D,
    prompts: &[Vec<u32>],
    config: &SamplingConfig,
    tok: &Tokenizer,
    stream: bool,
) -> Result<Generation> {
    let detok = |ids: &[u32]| tok.decode(ids);
    let mut shown = 0usize;
    let mut seq0: Vec<u32> = Vec::new();
    let mut stdout = std::io::stdout();
    generate(model, prompts, config, Some(&detok), |b, t| {
        if !stream || b != 0 || config.stop_token_ids.contains(&t) {
            return;
        }
        seq0.push(t);
        if let Ok(text) = tok.decode(&seq0) {
            if !text.ends_with('\u{FFFD}') && text.len() > shown && text.is_char_boundary(shown) {
                let _ = write!(stdout, "{}", &text[shown..]);
                let _ = stdout.flush();
                shown = text.len();
            }
        }
    })
}

/// The GPU model behind the shared sampling loop: the state is the [`CudaModel`]
/// itself, sized for the batch. Finished sequences are still decoded (their rows are
/// ignored); the cache is large enough for that.
struct CudaDecoder<'a> {
    weights: &'a ModelWeights,
    ordinal: usize,
}

impl Decoder for CudaDecoder<'_> {
    type State = CudaModel;
    fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }
    fn context_len(&self) -> Option<usize> {
        Some(self.weights.config.max_position_embeddings)
    }
    fn new_state(&self, batch: usize, max_seq: usize) -> Result<CudaModel> {
        CudaModel::new(self.weights, self.ordinal, batch, max_seq)
    }
    fn prefill(&self, tokens: &[Vec<u32>], state: &mut CudaModel) -> Result<Array2<f32>> {
        state.prefill(tokens)
    }
    fn decode_step(
        &self,
        tokens: &[u32],
        _active: &[bool],
        state: &mut CudaModel,
        logits: &mut Array2<f32>,
    ) -> Result<()> {
        let next = state.decode(tokens)?;
        if next.dim() != logits.dim() {
            return Err(ElmError::shape(
                "cuda decode",
                format!("logits {:?}, expected {:?}", next.dim(), logits.dim()),
            ));
        }
        logits.assign(&next);
        Ok(())
    }
}

/// Cuts `text` at the first occurrence of any stop string.
fn truncate_at_stop(mut text: String, stops: &[String]) -> String {
    if let Some(cut) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
        text.truncate(cut);
    }
    text
}

// --------------------------------------------------------------------------------- logits

#[derive(clap::Args, Debug)]
pub struct LogitsArgs {
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long)]
    pub prompt: String,
    #[arg(long)]
    pub chat: bool,
    /// Weight storage: f32 | q8_0 | q4_0 | q4_1 | auto.
    #[arg(long, default_value = "f32")]
    pub weights: String,
    /// Number of `[token_id, logit]` pairs to print.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run_logits(args: LogitsArgs) -> Result<()> {
    default_blas_threads();
    let path = args.model.clone().unwrap_or_else(default_model_path);
    let (model, tok) = load_any(&path, args.weights.parse()?)?;
    let ids = encode_prompt(&tok, &args.prompt, args.chat)?;
    let logits = with_model!(&model, m => {
        let mut cache = m.new_cache(1, ids.len())?;
        m.prefill(std::slice::from_ref(&ids), &mut cache)?
    });
    let row = logits.row(0);
    let mut order: Vec<usize> = (0..row.len()).collect();
    let k = args.top.min(row.len());
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    order.truncate(k);
    if args.json {
        let top: Vec<(usize, f32)> = order.iter().map(|&i| (i, row[i])).collect();
        print_json(&json!({ "prompt_tokens": ids, "top": top }));
    } else {
        println!("prompt tokens: {ids:?}");
        for &i in &order {
            let piece = tok.decode(&[i as u32]).unwrap_or_default();
            println!("{i:>8} {:>12.5} {piece:?}", row[i]);
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------------- perplexity

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Plain text, or .jsonl (fields `text`, or `question` + `answer` as in GSM8K).
    #[arg(long)]
    pub file: PathBuf,
    /// Evaluate at most this many tokens.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// Weight storage: f32 | q8_0 | q4_0 | q4_1 | auto.
    #[arg(long, default_value = "f32")]
    pub weights: String,
    /// Window length; the text is cut into non-overlapping windows.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Windows per forward batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// `--elm DIR` scores the ELM checkpoint (solver flags as `elm eval`).
    #[command(flatten)]
    pub infer: crate::cli::elm_cmds::ElmInferArgs,
    #[arg(long)]
    pub json: bool,
}

/// The text of a plain or jsonl file (jsonl records joined by blank lines).
pub fn read_text_file(path: &Path) -> Result<String> {
    let raw = std::fs::read_to_string(path).map_err(|e| ElmError::io(path, e))?;
    if path.extension().is_some_and(|e| e == "jsonl") {
        let mut parts = Vec::new();
        for (n, line) in raw
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                ElmError::format(path, format!("line {}: invalid JSON: {e}", n + 1))
            })?;
            let field = |k: &str| v.get(k).and_then(|x| x.as_str());
            let text = match (field("text"), field("question"), field("answer")) {
                (Some(t), _, _) => t.to_string(),
                (None, Some(q), Some(a)) => format!("{q}\n{a}"),
                _ => {
                    return Err(ElmError::format(
                        path,
                        format!(
                            "line {}: needs a `text` or `question`+`answer` field",
                            n + 1
                        ),
                    ))
                }
            };
            parts.push(text);
        }
        Ok(parts.join("\n\n"))
    } else {
        Ok(raw)
    }
}

pub fn run_perplexity(args: PerplexityArgs) -> Result<()> {
    default_blas_threads();
    if args.context < 2 {
        return Err(ElmError::config("--context", "must be >= 2"));
    }
    let inference = args.infer.inference_config()?;
    let path = args.model.clone().unwrap_or_else(default_model_path);
    let pb = spinner(&format!("loading {}", path.display()));
    let (model, tok) =
        ElmModel::load_with(&path, args.infer.elm.as_deref(), args.weights.parse()?)?;
    pb.finish_and_clear();
    let text = read_text_file(&args.file)?;
    let mut ids = tok.encode(&text, false)?;
    ids.truncate(args.max_tokens);
    if ids.len() < 2 {
        return Err(ElmError::InvalidArgument(format!(
            "{}: fewer than 2 tokens to score",
            args.file.display()
        )));
    }
    let ctx = model.config().max_position_embeddings;
    if args.context > ctx {
        return Err(ElmError::config(
            "--context",
            format!(
                "windows of {} tokens exceed the model's context length of {ctx} tokens \
                 (max_position_embeddings)",
                args.context
            ),
        ));
    }
    // Every window scores its tokens after the first, each from the tokens before it in the
    // window: the same teacher-forced path (and ELM solve) as `elm eval`'s answer NLL.
    let windows = ids
        .chunks(args.context)
        .filter(|w| w.len() >= 2)
        .enumerate()
        .map(|(i, w)| ScoredSequence::new(format!("window {i}"), &w[..1], &w[1..]))
        .collect::<Result<Vec<_>>>()?;
    let bar = ProgressBar::new(windows.len() as u64).with_style(
        ProgressStyle::with_template("perplexity {bar:30} {pos}/{len} windows {eta}")
            .expect("valid template"),
    );
    let run = teacher_forced_nll(&model, &inference, &windows, args.batch, |done| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    let nll: f64 = run.items.iter().map(|i| i.value).sum();
    let mean = nll / run.scored_tokens as f64;
    if args.json {
        print_json(&json!({
            "file": args.file,
            "elm": args.infer.elm,
            "tokens": ids.len(),
            "scored_tokens": run.scored_tokens,
            "windows": windows.len(),
            "context": args.context,
            "mean_nll": mean,
            "perplexity": mean.exp(),
            "seconds": run.seconds,
            "tok_s": run.tok_s,
            "solver": run.solver,
        }));
    } else {
        println!(
            "perplexity {:.4} (mean NLL {mean:.4} over {} tokens, {} windows of ≤ {})",
            mean.exp(),
            run.scored_tokens,
            windows.len(),
            args.context
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------- bench

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 32)]
    pub decode_steps: usize,
    /// Weight storages to compare, comma-separated (f32, auto, q8_0, q4_0, q4_1). With more
    /// than one, the report is `{"runs": [...]}` with memory figures per configuration.
    #[arg(long, default_value = "f32")]
    pub weights: String,
    #[arg(long)]
    pub json: bool,
    /// With `--elm CKPT`, every storage is also benched as that ELM (solver options apply).
    #[command(flatten)]
    pub elm: super::elm_cmds::ElmInferArgs,
}

pub fn run_bench(args: BenchArgs) -> Result<()> {
    default_blas_threads();
    if args.prompt_len == 0 || args.decode_steps == 0 {
        return Err(ElmError::config(
            "--prompt-len/--decode-steps",
            "must be >= 1",
        ));
    }
    let storages: Vec<WeightStorage> = args
        .weights
        .split(',')
        .map(|w| w.trim().parse())
        .collect::<Result<_>>()?;
    let path = args.model.clone().unwrap_or_else(default_model_path);
    let value = if storages == [WeightStorage::F32] && args.elm.elm.is_none() {
        // The single-configuration report, as before.
        let (model, _) = load(&path)?;
        let pb = spinner("bench");
        let report = run_bench_inner(&model, &args, &pb)?;
        pb.finish_and_clear();
        to_json(&report)?
    } else {
        let mut runs = Vec::new();
        for storage in storages {
            // One configuration in memory at a time, so RSS figures are its own.
            let (model, _) = load_any(&path, storage)?;
            let pb = spinner(&format!("bench {storage}"));
            let run = with_model!(&model, m => bench_run(m, "dense", &storage_label(&storage, m), &args, &pb))?;
            pb.finish_and_clear();
            runs.push(serde_json::to_value(run).expect("serializable"));
            drop(model);
            if let Some(dir) = &args.elm.elm {
                let (elm_model, _) = ElmModel::load_with(&path, Some(dir), storage)?;
                let pb = spinner(&format!("bench elm {storage}"));
                let run = bench_elm(&elm_model, storage, &args, &pb)?;
                pb.finish_and_clear();
                runs.push(run);
            }
        }
        json!({
            "machine": machine_description(),
            "threads": elm::model::team::SpinTeam::global().parts(),
            "runs": runs,
        })
    };
    if args.json {
        print_json(&value);
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("serializable")
        );
    }
    Ok(())
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| ElmError::Json {
        what: "bench report".into(),
        msg: e.to_string(),
    })
}

/// `f32`, or the block formats the model actually holds (e.g. `auto` on a Q4_1 file whose
/// embedding is Q8_0 gives `q4_1+q8_0`).
fn storage_label<W: DecoderWeights>(storage: &WeightStorage, m: &Transformer<W>) -> String {
    let mut names: Vec<&str> = Vec::new();
    let mut add = |l: elm::model::quant::LinearRef<'_>| {
        let n = match l {
            elm::model::quant::LinearRef::F32(_) => "f32",
            elm::model::quant::LinearRef::Quant(q) => q.format().name(),
        };
        if !names.contains(&n) {
            names.push(n);
        }
    };
    for l in m.weights.layers() {
        let b = elm::model::BlockWeights::block_ref(l);
        for w in b.linears() {
            add(w);
        }
    }
    add(m.weights.lm_head_ref());
    format!("{storage} ({})", names.join("+"))
}

fn bench_run<W: DecoderWeights>(
    model: &Transformer<W>,
    kind: &str,
    weights: &str,
    args: &BenchArgs,
    pb: &ProgressBar,
) -> Result<bench::BenchRun> {
    pb.set_message(format!("bench {kind} {weights}: peak RSS"));
    let peak_rss_bytes = bench::generation_peak_rss(model, 64, 32)?;
    let report = bench::run_bench(model, args.prompt_len, args.decode_steps, |stage| {
        pb.set_message(format!("bench {kind} {weights}: {stage}"))
    })?;
    Ok(bench::BenchRun {
        model: kind.to_string(),
        weights: weights.to_string(),
        resident_weight_bytes: model.weights.weight_bytes(),
        params: elm::equilibrium::accounting::dense_params(model.config()),
        peak_rss_bytes,
        kv_bytes_per_token: bench::kv_bytes_per_token(model.config(), model.weights.layers().len()),
        report,
    })
}

/// ELM decode/prefill speed and memory on an [`ElmSession`]: best-step and mean decode
/// tok/s at batch 1 and 8 (prefill excluded), prefill tok/s of one `prompt_len` prompt, block
/// evaluations per token (kept dense layers + fixed-point evaluations incl. the commit one).
fn bench_elm(
    model: &ElmModel,
    storage: WeightStorage,
    args: &BenchArgs,
    pb: &ProgressBar,
) -> Result<serde_json::Value> {
    use elm::equilibrium::infer::ElmSession;
    bench::check_bench_len(model.config(), args.prompt_len, args.decode_steps)?;
    let cfg = args.elm.inference_config()?;
    let vocab = model.config().vocab_size;
    let toks = |n: usize, salt: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32)
            .collect()
    };
    let argmax = |row: ndarray::ArrayView1<f32>| elm::model::generate::argmax(row) as u32;
    // Decode: (best tok/s, mean tok/s, block evaluations per token, KV bytes).
    let decode = |batch: usize| -> Result<(f64, f64, f64, usize)> {
        let steps = args.decode_steps;
        let mut s = ElmSession::new(model, cfg.clone(), batch, 16 + steps + 1)?;
        let prompts: Vec<Vec<u32>> = (0..batch).map(|b| toks(16, b + 1)).collect();
        let mut logits = s.prefill(&prompts)?;
        s.decode_stats.clear();
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps {
            let next: Vec<u32> = (0..batch).map(|b| argmax(logits.row(b))).collect();
            let t = Instant::now();
            logits = s.decode_step(&next)?;
            times.push(t.elapsed().as_secs_f64());
        }
        let fp: f64 = s
            .decode_stats
            .iter()
            .map(|st| st.iterations as f64)
            .sum::<f64>()
            / s.decode_stats.len().max(1) as f64;
        let evals = model.kept_layers().len() as f64 + fp;
        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
        let total: f64 = times.iter().sum();
        Ok((
            batch as f64 / best,
            (batch * steps) as f64 / total,
            evals,
            s.kv_bytes(),
        ))
    };
    pb.set_message(format!("bench elm {storage}: peak RSS"));
    let reset = bench::reset_peak_rss();
    {
        let mut s = ElmSession::new(model, cfg.clone(), 1, 64 + 33)?;
        let mut logits = s.prefill(&[toks(64, 3)])?;
        for _ in 0..32 {
            logits = s.decode_step(&[argmax(logits.row(0))])?;
        }
    }
    let peak_rss_bytes = if reset { bench::peak_rss_bytes() } else { None };
    pb.set_message(format!("bench elm {storage}: prefill"));
    let mut prefill_best = f64::INFINITY;
    for _ in 0..3 {
        let mut s = ElmSession::new(model, cfg.clone(), 1, args.prompt_len)?;
        let t = Instant::now();
        std::hint::black_box(s.prefill(&[toks(args.prompt_len, 0)])?);
        prefill_best = prefill_best.min(t.elapsed().as_secs_f64());
    }
    pb.set_message(format!("bench elm {storage}: decode"));
    let (b1, b1_mean, evals, _) = decode(1)?;
    let (b8, b8_mean, evals8, _) = decode(8)?;
    let kept = model.kept_layers().len() + 1; // one-step: one fixed-point cache
    let label = match (&model.quant, storage) {
        (None, _) => "f32".to_string(),
        (Some(_), s) => s.to_string(),
    };
    Ok(json!({
        "model": "elm",
        "weights": label,
        "resident_weight_bytes": model.weight_bytes(),
        "params": model.elm.as_ref().map_or_else(
            || elm::equilibrium::accounting::dense_params(model.config()),
            |(ec, _)| elm::equilibrium::accounting::param_report(model.config(), ec).elm_total
        ),
        "peak_rss_bytes": peak_rss_bytes,
        "kv_bytes_per_token": bench::kv_bytes_per_token(model.config(), kept),
        "prefill_tokens": args.prompt_len,
        "prefill_tok_s": args.prompt_len as f64 / prefill_best,
        "decode_steps": args.decode_steps,
        "decode_b1_tok_s": b1,
        "decode_b1_mean_tok_s": b1_mean,
        "decode_b8_tok_s": b8,
        "decode_b8_mean_tok_s": b8_mean,
        "block_evals_per_token_b1": evals,
        "block_evals_per_token_b8": evals8,
        "solver": cfg.solver.name(),
        "abs_tol": cfg.stop.abs_tol,
        "max_iter": cfg.stop.max_iter,
    }))
}

/// CPU model and core count from /proc/cpuinfo.
fn machine_description() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU".to_string(), |s| s.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores available")
}

fn run_bench_inner(
    model: &Transformer,
    args: &BenchArgs,
    pb: &ProgressBar,
) -> Result<elm::model::bench::BenchReport> {
    bench::run_bench(model, args.prompt_len, args.decode_steps, |stage| {
        pb.set_message(format!("bench: {stage}"))
    })
}
