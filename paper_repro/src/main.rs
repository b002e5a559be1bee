//! `paper_repro`: rebuilds the tables and plots of the study in one command.
//!
//! It drives the `elm` command line (every step is an `elm ... --json` call, the same interface a
//! researcher scripts against), collects each step's JSON into `OUT/summary.json`, and writes one
//! Markdown table per section into `OUT/README.md`. Each section lives in its own module and
//! decodes the `elm` output it reads into typed structs, so a key the CLI no longer prints stops
//! the run instead of leaving a blank cell. Scales:
//! - `smoke`: minutes, for CI; tiny limits on the real SmolLM2 checkpoint.
//! - `small`: SmolLM2-135M on the CPU, limits large enough to compare numbers.
//! - `paper`: the paper's setting; needs `--model` pointing at local Qwen2.5-1.5B weights (HF directory).

mod bench;
mod compress;
mod elm_cli;
mod error;
mod eval;
mod markdown;
mod scale;
mod solvers;
mod summary;
mod train;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::elm_cli::ElmCli;
use crate::error::ReproError;
use crate::scale::Scale;
use crate::summary::Summary;

/// Rebuild every table and plot at one scale.
#[derive(Parser, Debug)]
#[command(name = "paper_repro", version, about)]
struct Args {
    #[arg(long, value_enum, default_value = "small")]
    scale: Scale,
    /// Output directory for tables, plots and summary.json.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Dense model (.gguf or HF directory). Default: the SmolLM2 GGUF in ELM_MODELS_DIR (not for `paper`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Dataset root (GSM8K under gsm8k/). Default: ELM_DATA_DIR or the repository's data/.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// First replaced layer l.
    #[arg(long, default_value_t = 12)]
    start: usize,
    /// Number of replaced layers M.
    #[arg(long, default_value_t = 8)]
    m: usize,
    /// Path of the `elm` binary. Default: next to this executable.
    #[arg(long)]
    elm_bin: Option<PathBuf>,
}

/// The `elm` binary: `--elm-bin`, else the one built next to this executable.
fn elm_binary(explicit: Option<PathBuf>) -> Result<PathBuf, ReproError> {
    let bin = match explicit {
        Some(bin) => bin,
        None => std::env::current_exe()
            .map_err(|e| ReproError::Setup(format!("cannot locate this executable: {e}")))?
            .with_file_name(format!("elm{}", std::env::consts::EXE_SUFFIX)),
    };
    if !bin.exists() {
        return Err(ReproError::Setup(format!(
            "elm binary not found at {} (build it: cargo build --release)",
            bin.display()
        )));
    }
    Ok(bin)
}

fn run(args: Args) -> Result<(), ReproError> {
    let elm = ElmCli::new(elm_binary(args.elm_bin)?);
    let model = match (args.model, args.scale) {
        (Some(m), _) => m,
        (None, Scale::Paper) => {
            return Err(ReproError::Setup(
                "--scale paper needs --model pointing at local Qwen2.5-1.5B weights".into(),
            ))
        }
        (None, _) => elm::model::default_model_path(),
    };
    if !model.exists() {
        return Err(ReproError::Setup(format!(
            "model not found: {} (run scripts/fetch-smollm2.sh)",
            model.display()
        )));
    }
    let data_dir = elm::elm::data::resolve_data_dir(args.data_dir.as_deref())
        .map_err(|e| ReproError::Setup(e.to_string()))?;
    let out = args.out;
    std::fs::create_dir_all(&out).map_err(|e| ReproError::io(&out, e))?;
    let limits = args.scale.limits();
    let mut summary = Summary::default();
    let mut report = format!("# elm results — scale `{:?}`\n\n", args.scale).to_lowercase();

    eprintln!("[1/3] solvers on canonical problems");
    report += &solvers::section(&elm, &out, &mut summary)?;
    report += "\n";
    if limits.bench {
        eprintln!("[2/3] dense model speed: {}", model.display());
        report += &bench::section(&elm, &model, &mut summary)?;
        report += "\n";
    }

    eprintln!(
        "[3/3] ELM: compress, train {} steps, evaluate",
        limits.train_steps
    );
    let initial = out.join("elm_init");
    let trained = out.join("elm_trained");
    let bar = indicatif::ProgressBar::new((2 + eval::RUNS) as u64);
    let compressed = compress::section(&elm, &model, args.start, args.m, &initial, &mut summary)?;
    bar.inc(1);
    report += &compressed.markdown;
    let train_paths = train::TrainPaths {
        model: &model,
        data_dir: &data_dir,
        initial: &initial,
        trained: &trained,
        config: &out.join("train_config.json"),
    };
    report += &train::section(&elm, &train_paths, &limits, &mut summary)?;
    bar.inc(1);
    let eval_inputs = eval::EvalInputs {
        model: &model,
        data_dir: &data_dir,
        trained: &trained,
        dense_layers: compressed.num_layers,
    };
    report += &eval::section(&elm, &eval_inputs, &limits, &bar, &mut summary)?;
    bar.finish_and_clear();

    let report_path = out.join("README.md");
    std::fs::write(&report_path, &report).map_err(|e| ReproError::io(&report_path, e))?;
    let summary_path = out.join("summary.json");
    summary.write(&summary_path, &format!("{:?}", args.scale))?;
    println!("{report}");
    eprintln!(
        "wrote {} and {}",
        report_path.display(),
        summary_path.display()
    );
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
