//! The `elm` command line. Each subcommand group lives in its own file and
//! exposes `XArgs` (clap) + `run_x(args) -> Result<()>`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `println!` that never panics: when stdout fails (a pipe closed early, a full disk under a
/// redirect, an injected fault) the human-readable line is lost, not the command's work and
/// not its exit status. Machine output goes through `output::print_json`, which reports it.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// [`say!`] for stderr (progress notes, warnings, the error line).
macro_rules! say_err {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

pub mod elm_cmds;
pub mod interchange;
pub mod lora;
pub mod model_cmds;
pub mod output;
pub mod prune;
pub mod quantize;
pub mod registry;
pub mod search;
pub mod solve;
pub mod sweep;

/// Equilibrium Language Models: solvers, models, compression, evaluation.
#[derive(Parser, Debug)]
#[command(name = "elm", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Number format the large matrix products read (training, LoRA, prefill, evaluation):
    /// f32, or bf16 (AVX-512 BF16 dot products, f32 accumulation, f32 weights and optimiser
    /// state; refused on a CPU without them).
    #[arg(long, global = true, default_value = "f32")]
    pub precision: elm::gemm::Precision,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Solve a canonical fixed-point problem with one solver.
    Solve(solve::SolveArgs),
    /// Run every solver on one problem and plot residual-vs-iteration curves.
    Study(solve::StudyArgs),
    /// Every solver on the canonical linear problem swept over the spectral radius ρ: when
    /// does acceleration pay?
    Sweep(sweep::SweepArgs),
    /// Download and verify the default SmolLM2-135M-Instruct GGUF.
    Fetch(model_cmds::FetchArgs),
    /// Generate text with a model (dense or ELM).
    Generate(model_cmds::GenerateArgs),
    /// Print prompt token ids and the top-K logits at the last position.
    Logits(model_cmds::LogitsArgs),
    /// Perplexity of a model on a text or jsonl file.
    Perplexity(model_cmds::PerplexityArgs),
    /// Measure memory bandwidth, sgemm peak, prefill and decode speed.
    Bench(model_cmds::BenchArgs),
    /// Replace layers [l, l+M) of a model by a fixed-point module.
    Compress(elm_cmds::CompressArgs),
    /// Train a fixed-point module (CE + distillation, SJFB).
    Train(elm_cmds::TrainArgs),
    /// Evaluate a model (dense or ELM) on a task, with intervals and paired comparisons.
    Eval(elm_cmds::EvalArgs),
    /// Compress a model with a training-free baseline (ShortGPT, Shortened-LLaMA, window
    /// deletion, ReplaceMe, LaCo) into an HF model directory.
    Prune(prune::PruneArgs),
    /// LoRA SFT of the dense model, merged with α/r into a tuned dense model directory.
    Lora(lora::LoraArgs),
    /// Choose the replaced window: GPPO, enumeration, metric selectors, or the report.
    Search(search::SearchArgs),
    /// Save a model (dense, or with --elm an ELM) as one quantized GGUF for deployment.
    Quantize(quantize::QuantizeArgs),
    /// Spectral radius of a trained module's Jacobian ∂φ/∂z at its fixed point.
    Spectral(elm_cmds::SpectralArgs),
    /// Write an ELM in the official ELM code's integrated format (Qwen2ELMForCausalLM loads
    /// it); every --elm also takes such a directory.
    ExportOfficial(interchange::ExportOfficialArgs),
}

/// Parses arguments, runs the subcommand, maps errors to exit code 1 (2 for usage errors).
/// With `--json` anywhere on the line, a failure is also one JSON object on stdout,
/// `{"error": {"kind", "message", "file", "field"}}`, so scripts never parse an empty stream.
pub fn main() -> ExitCode {
    // Our GEMM on rayon's threads; OpenBLAS single-threaded beside it (see gemm.rs).
    elm::gemm::prefer_own_threads();
    let json = std::env::args_os().any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            if json && e.use_stderr() {
                let field = e
                    .get(clap::error::ContextKind::InvalidArg)
                    .map(|v| v.to_string());
                let message = e.render().to_string();
                let message = message
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim_start_matches("error: ");
                say!(
                    "{}",
                    serde_json::json!({"error": {
                        "kind": "usage",
                        "message": message,
                        "file": null,
                        "field": field,
                    }})
                );
            }
            e.exit()
        }
    };
    // Before any large allocation: training and evaluation steps reuse warm pages (see
    // heap.rs). Not for `generate`, the deployment's command: it frees its load-time buffers
    // (a parsed vocabulary, a checkpoint's f32 module) back to the system instead of holding
    // them beside the weights for its whole life (issue 42), and its decode loop allocates
    // next to nothing per token.
    if !matches!(cli.command, Command::Generate(_)) {
        elm::heap::retain_freed_memory();
    }
    let result = elm::gemm::set_precision(cli.precision).and_then(|()| match cli.command {
        Command::Solve(a) => solve::run_solve(a),
        Command::Study(a) => solve::run_study(a),
        Command::Sweep(a) => sweep::run_sweep(a),
        Command::Fetch(a) => model_cmds::run_fetch(a),
        Command::Generate(a) => model_cmds::run_generate(a),
        Command::Logits(a) => model_cmds::run_logits(a),
        Command::Perplexity(a) => model_cmds::run_perplexity(a),
        Command::Bench(a) => model_cmds::run_bench(a),
        Command::Compress(a) => elm_cmds::run_compress(a),
        Command::Train(a) => elm_cmds::run_train(a),
        Command::Eval(a) => elm_cmds::run_eval(a),
        Command::Prune(a) => prune::run_prune(a),
        Command::Lora(a) => lora::run_lora(a),
        Command::Search(a) => search::run_search(a),
        Command::Spectral(a) => elm_cmds::run_spectral(a),
        Command::Quantize(a) => quantize::run_quantize(a),
        Command::ExportOfficial(a) => interchange::run_export_official(a),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say_err!("error: {e}");
            if json {
                say!("{}", e.to_json());
            }
            ExitCode::FAILURE
        }
    }
}
