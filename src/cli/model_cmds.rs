//! `elm fetch | generate | logits | perplexity | bench`: the dense model from the command line.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use elm::cuda::{CudaModel, DeviceSpec, GpuDecoder};
use elm::data::read_text_file;
use elm::equilibrium::bench::{bench_dense, bench_elm, versus_dense, BenchEntry, BenchSuite};
use elm::equilibrium::infer::{ElmDecoder, ElmModel};
use elm::error::{ElmError, Result};
use elm::eval::gsm8k::stop_ids;
use elm::eval::nll::{teacher_forced_nll, ScoredSequence};
use elm::eval::SolverSummary;
use elm::formats::tokenizer::Tokenizer;
use elm::model::bench::{self, machine_description};
use elm::model::generate::{check_generation_size, generate, Decoder, Generation, SamplingConfig};
use elm::model::{
    default_model_path, load_pretrained, models_dir, AnyTransformer, Transformer, WeightStorage,
};

use super::output::{bar, check_memory, default_blas_threads, print_json, spinner, to_json};
use elm::memory::MemoryEstimate;

/// The prompt's token ids, optionally wrapped in the ChatML template.
fn encode_prompt(tok: &Tokenizer, prompt: &str, chat: bool) -> Result<Vec<u32>> {
    let text = if chat {
        tok.apply_chat_template(&[("user", prompt)], true)
    } else {
        prompt.to_string()
    };
    let ids = tok.encode_prompt(&text)?;
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
        print_json(&json!({ "path": path, "verified": true }))?;
    } else {
        say!("{}", path.display());
    }
    Ok(())
}

// ------------------------------------------------------------------------------- generate

/// The model and prompt of `generate` and `logits`.
#[derive(clap::Args, Debug)]
pub struct PromptArgs {
    /// A .gguf file or an HF directory (default: the fetched SmolLM2).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(
        long,
        required_unless_present = "prompt_file",
        conflicts_with = "prompt_file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from this UTF-8 file instead (a long context does not fit one
    /// command-line argument, which Linux caps at 128 KiB).
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Wrap the prompt as a user turn of the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Decode every weight and refuse the model if any is NaN or infinite (as llama.cpp's
    /// --check-tensors; a GGUF's quantized blocks are otherwise decoded only as they are used).
    #[arg(long)]
    pub check_tensors: bool,
}

impl PromptArgs {
    /// `--model`, or the fetched SmolLM2 when it is not given.
    fn model_path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model_path)
    }

    /// `--prompt`, or the contents of `--prompt-file` (an error names the file).
    fn prompt_text(&self) -> Result<String> {
        match (&self.prompt, &self.prompt_file) {
            (Some(text), _) => Ok(text.clone()),
            (None, Some(path)) => std::fs::read_to_string(path).map_err(|e| ElmError::io(path, e)),
            (None, None) => Err(ElmError::config(
                "--prompt",
                "give --prompt or --prompt-file",
            )),
        }
    }

    /// The prompt's token ids (in the chat template with `--chat`), filled by the check that
    /// [`Self::checked_prompt`] returns.
    ///
    /// The check runs in the loader once the tokenizer and config are read and before any
    /// weight is, so that a prompt that encodes to nothing or runs past the context (with
    /// `max_new` tokens after it, `batch` times) is refused before hundreds of MB load, with
    /// the tokenizer built once. `--check-tensors` scans the weights there too.
    fn checked_prompt<'a>(
        &'a self,
        path: &'a Path,
        max_new: usize,
        batch: usize,
        ids: &'a std::cell::RefCell<Vec<u32>>,
    ) -> impl Fn(&Tokenizer, &elm::model::ModelConfig) -> Result<()> + 'a {
        move |tok, config| {
            let prompt = encode_prompt(tok, &self.prompt_text()?, self.chat)?;
            check_generation_size(config, prompt.len(), max_new, batch)?;
            if self.check_tensors {
                elm::model::check_tensors_before_load(path)?;
            }
            *ids.borrow_mut() = prompt;
            Ok(())
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub input: PromptArgs,
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
    /// Generate all --max-new-tokens tokens even past the end-of-sequence token (benchmarks
    /// and memory measurements that need every position of the KV cache written).
    #[arg(long)]
    pub ignore_eos: bool,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    /// Weight storage of the CPU inference path: f32 | q8_0 | q4_0 | q4_1 | auto (auto keeps
    /// a GGUF's quantized blocks; a block format quantizes on the fly).
    #[arg(long, default_value = "f32")]
    pub weights: WeightStorage,
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
    let (device, storage) = (args.device, args.weights);
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
    if storage != WeightStorage::F32 && device != DeviceSpec::Cpu {
        return Err(ElmError::Unsupported(
            "--weights other than f32 runs on the CPU only".into(),
        ));
    }
    let path = args.input.model_path();
    let before_load = elm::io::BeforeLoad::now();
    let pb = spinner(&format!("loading {}", path.display()));
    let ids = std::cell::RefCell::new(Vec::new());
    let check = args
        .input
        .checked_prompt(&path, args.max_new_tokens, args.batch, &ids);
    let (model, tok) = match (&args.elm.elm, device) {
        (Some(ckpt), _) => {
            let (m, tok) = ElmModel::load_with_checked(&path, Some(ckpt), storage, &check)?;
            (Loaded::Elm(Box::new(m)), tok)
        }
        (None, DeviceSpec::Cpu) => {
            let (m, tok) = AnyTransformer::load_checked(&path, storage, &check)?;
            (Loaded::Dense(Box::new(m)), tok)
        }
        (None, DeviceSpec::Cuda(ordinal)) => {
            let (w, tok) = elm::model::load_pretrained_checked(&path, &check)?;
            (Loaded::Gpu(Box::new(w), ordinal), tok)
        }
    };
    pb.finish_and_clear();
    let prompt = ids.take();
    let heap_after_load = elm::heap::counters().map(|c| c.live_bytes as u64);
    let mc = match &model {
        Loaded::Elm(m) => m.config(),
        Loaded::Dense(m) => m.config(),
        Loaded::Gpu(w, _) => &w.config,
    };
    // The dense path's caches slide on windowed layers and its prefill runs in chunks; an
    // ELM session keeps full caches and prefills in one call.
    let dense = matches!(model, Loaded::Dense(_));
    let memory = generation_memory(
        mc,
        &path,
        prompt.len(),
        args.max_new_tokens,
        args.batch,
        dense,
    );
    check_memory(&memory, args.json)?;
    let config = SamplingConfig {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        // EOS and, for chat models, the end-of-turn token.
        stop_token_ids: if args.ignore_eos {
            vec![]
        } else {
            stop_ids(&tok)
        },
        stop_strings: args.stop.clone(),
    };
    let kv_tokens = prompt.len() + args.max_new_tokens;
    let prompts = vec![prompt; args.batch];
    let stream = !args.json;
    let (out, elm_report) = match &model {
        Loaded::Elm(model) => {
            let cfg = args.elm.inference_config()?;
            let decoder = ElmDecoder::new(model, cfg.clone())?;
            let out = generate_streaming(&decoder, &prompts, &config, &tok, stream)?;
            let rec = decoder.record();
            // ELM runs report their solver statistics too.
            let stats = ElmGenerateStats {
                kv_bytes: rec.kv_bytes,
                kv_mode: cfg.kv_mode,
                solver: cfg.solver.name().to_string(),
                abs_tol: cfg.stop.abs_tol,
                max_iter: cfg.stop.max_iter,
                decode: SolverSummary::from_stats(&rec.decode_stats, model.kept_layers().len()),
                prefill_iterations: rec.prefill_stats.iter().map(|p| p.iterations).collect(),
            };
            (out, Some(stats))
        }
        Loaded::Dense(model) => (
            generate_streaming(model.as_ref(), &prompts, &config, &tok, stream)?,
            None,
        ),
        Loaded::Gpu(weights, ordinal) => {
            let gpu = GpuDecoder::<CudaModel>::new(weights, *ordinal);
            let out = generate_streaming(&gpu, &prompts, &config, &tok, stream)?;
            (out, None)
        }
    };
    // What the process held against its peak; host memory only (a GPU run's weights and
    // cache live on the device).
    let (weight_bytes, kv_bytes) = match &model {
        Loaded::Elm(m) => (
            m.weight_bytes() as u64,
            elm_report.as_ref().map_or(0, |r| r.kv_bytes as u64),
        ),
        Loaded::Dense(m) => (
            m.weight_bytes() as u64,
            elm::memory::generation_kv_cache_bytes(m.config(), args.batch, kv_tokens),
        ),
        Loaded::Gpu(w, _) => (4 * w.num_params() as u64, 0),
    };
    let resident = before_load.and_then(|b| b.report(weight_bytes, heap_after_load, kv_bytes));
    report_generation(&args, &config, &tok, out, elm_report, &memory, resident)
}

/// `generate`'s estimate: what is loaded, the model file while it was read, and the decode
/// (KV cache of every row over prompt + new tokens, one layer's prefill activations, a row of
/// logits per sequence). `dense`: the dense path, whose windowed layers' caches slide and whose
/// prefill runs in chunks.
fn generation_memory(
    mc: &elm::model::ModelConfig,
    path: &std::path::Path,
    prompt_tokens: usize,
    max_new_tokens: usize,
    batch: usize,
    dense: bool,
) -> MemoryEstimate {
    use elm::memory::{
        forward_bytes, generation_kv_cache_bytes, kv_cache_bytes, loaded_bytes_or,
        mapped_model_bytes, prefill_bytes,
    };
    let tokens = prompt_tokens + max_new_tokens;
    let (kv, activations) = if dense {
        (
            generation_kv_cache_bytes(mc, batch, tokens),
            prefill_bytes(mc, batch, prompt_tokens, batch),
        )
    } else {
        (
            kv_cache_bytes(mc, batch, tokens),
            forward_bytes(mc, batch, prompt_tokens, batch),
        )
    };
    MemoryEstimate::loaded_model("generate", loaded_bytes_or(0), mapped_model_bytes(path))
        .with_phase(
            "decoding",
            &[("KV cache", kv), ("activations", activations)],
        )
}

/// What `generate` runs: three paths, one sampling loop.
enum Loaded {
    /// An ELM (any storage) through its session.
    Elm(Box<ElmModel>),
    /// The dense transformer in the chosen storage.
    Dense(Box<AnyTransformer>),
    /// The dense f32 weights, uploaded to GPU `ordinal` when generation starts.
    Gpu(Box<elm::model::ModelWeights>, usize),
}

fn report_generation(
    args: &GenerateArgs,
    config: &SamplingConfig,
    tok: &Tokenizer,
    out: Generation,
    elm_report: Option<ElmGenerateStats>,
    memory: &MemoryEstimate,
    resident: Option<elm::io::ResidentReport>,
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
            "device": args.device.to_string(),
            "memory_estimate": memory,
            "peak_rss_bytes": elm::io::peak_rss_bytes(),
            "resident": resident,
        });
        if let (Some(obj), Some(serde_json::Value::Object(extra))) =
            (v.as_object_mut(), elm_report.as_ref().map(|r| json!(r)))
        {
            obj.extend(extra);
        }
        print_json(&v)?;
    } else {
        say!();
        for (b, text) in texts.iter().enumerate().skip(1) {
            say!("--- sample {b} ---\n{text}");
        }
        say_err!(
            "[{} prompt tokens, {} new; prefill {prefill_tok_s:.1} tok/s, decode {decode_tok_s:.1} tok/s]",
            out.prompt_tokens, out.new_tokens
        );
        if let Some(r) = &elm_report {
            say_err!(
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
    #[command(flatten)]
    pub input: PromptArgs,
    /// Weight storage: f32 | q8_0 | q4_0 | q4_1 | auto.
    #[arg(long, default_value = "f32")]
    pub weights: WeightStorage,
    /// Number of `[token_id, logit]` pairs to print.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run_logits(args: LogitsArgs) -> Result<()> {
    default_blas_threads();
    let path = args.input.model_path();
    let ids = std::cell::RefCell::new(Vec::new());
    let check = args.input.checked_prompt(&path, 0, 1, &ids);
    let (model, tok) = AnyTransformer::load_checked(&path, args.weights, &check)?;
    let ids = ids.take();
    let logits = model.prompt_logits(std::slice::from_ref(&ids))?;
    let row = logits.row(0);
    // NaN logits would sort as "top" ids 0, 1, 2, ... and print as null: an invalid model.
    if let Some(i) = row.iter().position(|v| !v.is_finite()) {
        return Err(ElmError::NonFinite(format!(
            "logit of token {i} is {} (NaN or infinite weights in {}?)",
            row[i],
            path.display()
        )));
    }
    let mut order: Vec<usize> = (0..row.len()).collect();
    let k = args.top.min(row.len());
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    order.truncate(k);
    if args.json {
        let top: Vec<(usize, f32)> = order.iter().map(|&i| (i, row[i])).collect();
        print_json(&json!({ "prompt_tokens": ids, "top": top }))?;
    } else {
        say!("prompt tokens: {ids:?}");
        for &i in &order {
            let piece = tok.decode(&[i as u32]).unwrap_or_default();
            say!("{i:>8} {:>12.5} {piece:?}", row[i]);
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
    pub weights: WeightStorage,
    /// Window length; the text is cut into non-overlapping windows.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Windows per forward batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// `--elm DIR` scores the ELM checkpoint (solver flags as `elm eval`).
    #[command(flatten)]
    pub infer: crate::cli::elm_cmds::ElmInferArgs,
    /// Decode every weight of the model and refuse it if any is NaN or infinite.
    #[arg(long)]
    pub check_tensors: bool,
    #[arg(long)]
    pub json: bool,
}

/// `perplexity`'s refusals of its input: fewer than 2 tokens to score, or windows longer than
/// the model's context.
fn check_perplexity_input(
    ids: &[u32],
    context: usize,
    config: &elm::model::ModelConfig,
    file: &Path,
) -> Result<()> {
    if ids.len() < 2 {
        return Err(ElmError::InvalidArgument(format!(
            "{}: fewer than 2 tokens to score",
            file.display()
        )));
    }
    let ctx = config.max_position_embeddings;
    if context > ctx {
        return Err(ElmError::config(
            "--context",
            format!(
                "windows of {context} tokens exceed the model's context length of {ctx} tokens \
                 (max_position_embeddings)"
            ),
        ));
    }
    Ok(())
}

pub fn run_perplexity(args: PerplexityArgs) -> Result<()> {
    default_blas_threads();
    if args.context < 2 {
        return Err(ElmError::config("--context", "must be >= 2"));
    }
    let inference = args.infer.inference_config()?;
    // The text first: a missing or unreadable file is refused before hundreds of MB load.
    let text = read_text_file(&args.file)?;
    let path = args.model.clone().unwrap_or_else(default_model_path);
    // The text's tokens and the windows against the context, checked in the loader once the
    // tokenizer and config are read (before any weight is, for a dense model).
    let ids = std::cell::RefCell::new(Vec::new());
    let check = |tok: &Tokenizer, config: &elm::model::ModelConfig| -> Result<()> {
        let mut encoded = tok.encode(&text, false)?;
        encoded.truncate(args.max_tokens);
        check_perplexity_input(&encoded, args.context, config, &args.file)?;
        if args.check_tensors {
            elm::model::check_tensors_before_load(&path)?;
        }
        *ids.borrow_mut() = encoded;
        Ok(())
    };
    let pb = spinner(&format!("loading {}", path.display()));
    let (model, _) =
        ElmModel::load_with_checked(&path, args.infer.elm.as_deref(), args.weights, &check)?;
    pb.finish_and_clear();
    let ids = ids.take();
    // Every window scores its tokens after the first, each from the tokens before it in the
    // window: the same teacher-forced path (and ELM solve) as `elm eval`'s answer NLL.
    let windows = ids
        .chunks(args.context)
        .filter(|w| w.len() >= 2)
        .enumerate()
        .map(|(i, w)| ScoredSequence::new(format!("window {i}"), &w[..1], &w[1..]))
        .collect::<Result<Vec<_>>>()?;
    let pb = bar(windows.len(), 0);
    pb.set_message("windows");
    let run = teacher_forced_nll(&model, &inference, &windows, args.batch, |done| {
        pb.set_position(done as u64)
    })?;
    pb.finish_and_clear();
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
        }))?;
    } else {
        say!(
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
    #[arg(long, default_value = "f32", value_delimiter = ',')]
    pub weights: Vec<WeightStorage>,
    #[arg(long)]
    pub json: bool,
    /// With `--elm CKPT`, every storage is also benched as that ELM (solver options apply).
    #[command(flatten)]
    pub elm: super::elm_cmds::ElmInferArgs,
    /// Context (tokens of one sequence) at which each configuration's KV cache is allocated
    /// and its bytes reported.
    #[arg(long, default_value_t = 4096)]
    pub kv_context: usize,
    /// Only each configuration's memory, from processes of its own (see `memory` in the
    /// report): no speed runs.
    #[arg(long)]
    pub memory_only: bool,
    /// With --elm: rounds of the ELM against its dense parent, both loaded in one process and
    /// decoded alternately (`versus_dense` in the report: per-round tok/s, the median ratio
    /// and its range, batch 1 and 8); 0 skips them.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

/// Tokens each memory process generates after its prompt (the KV cache is allocated for them
/// all whatever is sampled).
const MEMORY_NEW_TOKENS: usize = 32;

/// The resident report of an `elm generate` process of its own on `model` (with `elm`, the ELM)
/// under `storage`.
fn generate_resident(
    model: &Path,
    storage: WeightStorage,
    elm: Option<&super::elm_cmds::ElmInferArgs>,
) -> Result<elm::io::ResidentReport> {
    let exe = std::env::current_exe().map_err(|e| ElmError::io("current executable", e))?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("generate")
        .arg("--model")
        .arg(model)
        .args(["--weights", &storage.to_string()])
        .args(["--prompt", "The capital of France is"])
        .args(["--max-new-tokens", &MEMORY_NEW_TOKENS.to_string()])
        .arg("--json");
    if let Some(e) = elm {
        cmd.args(e.to_args());
    }
    let out = cmd.output().map_err(|e| ElmError::io(&exe, e))?;
    let what = format!("`elm generate` on {}", model.display());
    if !out.status.success() {
        return Err(ElmError::InvalidArgument(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| ElmError::Json {
        what: what.clone(),
        msg: e.to_string(),
    })?;
    serde_json::from_value(v["resident"].clone()).map_err(|e| ElmError::Json {
        what: format!("{what}: `resident` (no /proc on this system?)"),
        msg: e.to_string(),
    })
}

/// A configuration's memory for the `--memory-only` report.
#[derive(Debug, serde::Serialize)]
struct MemoryEntry {
    model: &'static str,
    weights: String,
    #[serde(flatten)]
    memory: elm::io::ProcessMemory,
}

/// Measures configurations' memory in `elm generate` processes of their own, against the
/// runtime measured on a probe model cut from the same file (see [`elm::io::ProcessMemory`]).
/// The probe is written next to the temporary files, removed when dropped, and run once per
/// weight storage.
struct MemoryMeter {
    model: PathBuf,
    probe: PathBuf,
    runtime: Vec<(WeightStorage, elm::io::ResidentReport)>,
}

impl MemoryMeter {
    /// A meter for `model`, or `None` where memory cannot be measured: an HF directory (the
    /// probe is cut from a GGUF file) or a GGUF without a tokenizer (`generate` needs one).
    fn for_model(model: &Path) -> Result<Option<Self>> {
        if !model.is_file() {
            return Ok(None);
        }
        let gguf = elm::formats::GgufFile::open(model)?;
        if gguf.get("tokenizer.ggml.model").is_none() {
            return Ok(None);
        }
        let probe =
            std::env::temp_dir().join(format!("elm-runtime-probe-{}.gguf", std::process::id()));
        elm::formats::write_runtime_probe(&gguf, &probe)?;
        Ok(Some(MemoryMeter {
            model: model.to_path_buf(),
            probe,
            runtime: vec![],
        }))
    }

    /// One configuration's memory: the model under `storage` (with `elm`, the ELM).
    fn measure(
        &mut self,
        storage: WeightStorage,
        elm: Option<&super::elm_cmds::ElmInferArgs>,
    ) -> Result<elm::io::ProcessMemory> {
        let probe = match self.runtime.iter().position(|(s, _)| *s == storage) {
            Some(i) => i,
            None => {
                let report = generate_resident(&self.probe, storage, None)?;
                self.runtime.push((storage, report));
                self.runtime.len() - 1
            }
        };
        let run = generate_resident(&self.model, storage, elm)?;
        Ok(elm::io::ProcessMemory::new(run, &self.runtime[probe].1))
    }
}

impl Drop for MemoryMeter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.probe);
    }
}

pub fn run_bench(args: BenchArgs) -> Result<()> {
    default_blas_threads();
    if args.prompt_len == 0 || args.decode_steps == 0 || args.kv_context == 0 {
        return Err(ElmError::config(
            "--prompt-len/--decode-steps/--kv-context",
            "must be >= 1",
        ));
    }
    let path = args.model.clone().unwrap_or_else(default_model_path);
    elm::model::check_context(
        &elm::model::load_config(&path)?,
        args.kv_context,
        "--kv-context",
    )?;
    let value = if args.memory_only {
        let mut meter = MemoryMeter::for_model(&path)?.ok_or_else(|| {
            ElmError::Unsupported(format!(
                "memory measurement needs a GGUF model file with a tokenizer, not {}",
                path.display()
            ))
        })?;
        let mut entries = Vec::new();
        for &storage in &args.weights {
            let pb = spinner(&format!("memory {storage}"));
            let dense = meter.measure(storage, None)?;
            entries.push(MemoryEntry {
                model: "dense",
                weights: storage.to_string(),
                memory: dense,
            });
            if args.elm.elm.is_some() {
                let elm_run = meter.measure(storage, Some(&args.elm))?;
                entries.push(MemoryEntry {
                    model: "elm",
                    weights: storage.to_string(),
                    memory: elm_run,
                });
            }
            pb.finish_and_clear();
        }
        json!({ "machine": machine_description(), "memory": entries })
    } else if args.weights == [WeightStorage::F32] && args.elm.elm.is_none() {
        // The single-configuration report.
        let pb = spinner(&format!("loading {}", path.display()));
        let (weights, _) = load_pretrained(&path)?;
        let model = Transformer::new(weights)?;
        let report = bench::run_bench(&model, args.prompt_len, args.decode_steps, |stage| {
            pb.set_message(format!("bench: {stage}"))
        })?;
        pb.finish_and_clear();
        to_json(&report)?
    } else {
        let elm_cfg = args.elm.inference_config()?;
        let (prompt_len, steps, ctx) = (args.prompt_len, args.decode_steps, args.kv_context);
        // Memory from processes of their own where it can be measured; otherwise null.
        let mut meter = MemoryMeter::for_model(&path)?;
        let mut memory = |storage, elm| {
            meter
                .as_mut()
                .map(|m: &mut MemoryMeter| m.measure(storage, elm))
                .transpose()
        };
        let mut runs = Vec::new();
        for &storage in &args.weights {
            // One configuration in memory at a time, so RSS figures are its own.
            let (model, _) = AnyTransformer::load(&path, storage)?;
            let label = model.storage_label(&storage);
            let pb = spinner(&format!("bench dense {label}"));
            let progress = |stage: &str| pb.set_message(format!("bench dense {label}: {stage}"));
            let run = match &model {
                AnyTransformer::F32(m) => bench_dense(m, &label, prompt_len, steps, ctx, progress),
                AnyTransformer::Quant(m) => {
                    bench_dense(m, &label, prompt_len, steps, ctx, progress)
                }
            }?;
            pb.finish_and_clear();
            let mut run = run;
            run.header.memory = memory(storage, None)?;
            runs.push(BenchEntry::Dense(run));
            drop(model);
            if let Some(dir) = &args.elm.elm {
                let (elm_model, _) = ElmModel::load_with(&path, Some(dir), storage)?;
                let pb = spinner(&format!("bench elm {storage}"));
                let progress =
                    |stage: &str| pb.set_message(format!("bench elm {storage}: {stage}"));
                let mut run = bench_elm(
                    &elm_model, &elm_cfg, storage, prompt_len, steps, ctx, progress,
                )?;
                if args.rounds > 0 {
                    let (parent, _) = ElmModel::load_with(&path, None, storage)?;
                    for batch in [1, 8] {
                        pb.set_message(format!(
                            "bench elm {storage}: {} rounds against the dense model, batch {batch}",
                            args.rounds
                        ));
                        run.versus_dense.push(versus_dense(
                            &parent,
                            &elm_model,
                            &elm_cfg,
                            batch,
                            steps,
                            args.rounds,
                        )?);
                    }
                }
                pb.finish_and_clear();
                drop(elm_model);
                run.header.memory = memory(storage, Some(&args.elm))?;
                runs.push(BenchEntry::Elm(run));
            }
        }
        to_json(&BenchSuite {
            machine: machine_description(),
            threads: elm::team::SpinTeam::global().parts(),
            runs,
        })?
    };
    if args.json {
        print_json(&value)?;
    } else {
        say!(
            "{}",
            serde_json::to_string_pretty(&value).expect("serializable")
        );
    }
    Ok(())
}
