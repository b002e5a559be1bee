//! `paper_repro`: rebuilds the tables and plots of the study in one command.
//!
//! It drives the `elm` command line (every step is an `elm ... --json` call, the same interface a
//! researcher scripts against), collects each step's JSON into `OUT/summary.json`, and writes one
//! Markdown table per section into `OUT/`. Scales:
//! - `smoke`: minutes, for CI; tiny limits on the real SmolLM2 checkpoint.
//! - `small`: SmolLM2-135M on the CPU, limits large enough to compare numbers.
//! - `paper`: the paper's setting; needs `--model` pointing at local Qwen2.5-1.5B weights (HF directory).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, ValueEnum};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Scale {
    Smoke,
    Small,
    Paper,
}

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
    /// Dataset root (GSM8K under gsm8k/). Default: ELM_DATA_DIR or ../shared/data.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Path of the `elm` binary. Default: next to this executable.
    #[arg(long)]
    elm_bin: Option<PathBuf>,
}

/// Sizes of one scale.
struct Limits {
    gsm8k_eval: usize,
    ppl_tokens: usize,
    train_steps: usize,
}

impl Scale {
    fn limits(self) -> Limits {
        match self {
            Scale::Smoke => Limits {
                gsm8k_eval: 2,
                ppl_tokens: 256,
                train_steps: 2,
            },
            Scale::Small => Limits {
                gsm8k_eval: 50,
                ppl_tokens: 4096,
                train_steps: 200,
            },
            Scale::Paper => Limits {
                gsm8k_eval: 1319,
                ppl_tokens: 65536,
                train_steps: 2000,
            },
        }
    }
}

/// Runs `elm <args> --json` and parses its one JSON object.
fn elm_json(bin: &Path, args: &[String]) -> Result<Value, String> {
    let out = Command::new(bin)
        .args(args)
        .arg("--json")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`elm {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("`elm {}` printed no JSON object: {e}", args.join(" ")))
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

fn num(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if n.is_u64() || n.is_i64() {
                format!("{n}")
            } else {
                format!("{x:.4e}")
            }
        }
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => "—".into(),
    }
}

/// Section 1: fixed-point solvers on the canonical problems (no model).
fn solver_section(bin: &Path, out: &Path, summary: &mut Vec<Value>) -> Result<String, String> {
    let problems: [(&str, Option<&str>); 6] = [
        ("linear", Some("0.5")),
        ("linear", Some("0.9")),
        ("linear", Some("0.99")),
        ("tanh", None),
        ("cos", None),
        ("poisson", None),
    ];
    let mut md = String::from(
        "## Fixed-point solvers on canonical problems (tol 1e-8 absolute)\n\n\
         | problem | solver | converged | iterations | map evals | residual | error vs exact | seconds |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let bar = indicatif::ProgressBar::new((problems.len() * 4) as u64);
    for (problem, rho) in problems {
        let label = match rho {
            Some(r) => format!("{problem} ρ={r}"),
            None => problem.to_string(),
        };
        let rho_args: Vec<String> = rho.map(|r| strings(&["--rho", r])).unwrap_or_default();
        for solver in ["picard", "anderson", "broyden"] {
            let mut args = strings(&["solve", "--problem", problem, "--solver", solver]);
            args.extend(rho_args.clone());
            let v = elm_json(bin, &args)?;
            let _ = writeln!(
                md,
                "| {label} | {solver} | {} | {} | {} | {} | {} | {} |",
                num(&v, "converged"),
                num(&v, "iterations"),
                num(&v, "map_evals"),
                num(&v, "residual"),
                num(&v, "error_vs_exact"),
                num(&v, "seconds"),
            );
            summary.push(json!({"section": "solvers", "problem": label, "result": v}));
            bar.inc(1);
        }
        let plot = out.join(format!("study_{}.svg", label.replace([' ', '='], "_")));
        let mut args = strings(&["study", "--problem", problem, "--plot"]);
        args.push(plot.display().to_string());
        args.extend(rho_args);
        let v = elm_json(bin, &args)?;
        summary.push(json!({"section": "study", "problem": label, "plot": plot, "result": v}));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(md)
}

/// Section 2: the dense model (speed, perplexity on GSM8K answers).
fn dense_section(
    bin: &Path,
    model: &Path,
    data_dir: &Path,
    limits: &Limits,
    summary: &mut Vec<Value>,
) -> Result<String, String> {
    let model_s = model.display().to_string();
    let test = data_dir
        .join("gsm8k")
        .join("test.jsonl")
        .display()
        .to_string();
    let ppl = elm_json(
        bin,
        &strings(&[
            "perplexity",
            "--model",
            &model_s,
            "--file",
            &test,
            "--max-tokens",
            &limits.ppl_tokens.to_string(),
        ]),
    )?;
    summary.push(json!({"section": "dense_perplexity", "result": ppl}));
    let mut md = String::from("## Dense model\n\n| metric | value |\n|---|---|\n");
    for (k, v) in ppl.as_object().into_iter().flatten() {
        let _ = writeln!(md, "| perplexity.{k} | {v} |");
    }
    Ok(md)
}

fn default_model() -> PathBuf {
    elm::model::default_model_path()
}

fn run(args: Args) -> Result<(), String> {
    let bin = match args.elm_bin {
        Some(b) => b,
        None => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            exe.with_file_name(format!("elm{}", std::env::consts::EXE_SUFFIX))
        }
    };
    if !bin.exists() {
        return Err(format!(
            "elm binary not found at {} (build it: cargo build --release)",
            bin.display()
        ));
    }
    let model = match (&args.model, args.scale) {
        (Some(m), _) => m.clone(),
        (None, Scale::Paper) => {
            return Err("--scale paper needs --model pointing at local Qwen2.5-1.5B weights".into())
        }
        (None, _) => default_model(),
    };
    if !model.exists() {
        return Err(format!(
            "model not found: {} (run scripts/fetch-smollm2.sh)",
            model.display()
        ));
    }
    let data_dir =
        elm::elm::data::resolve_data_dir(args.data_dir.as_deref()).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let limits = args.scale.limits();
    let mut summary = Vec::new();
    let mut report = format!("# elm results — scale `{:?}`\n\n", args.scale).to_lowercase();
    eprintln!("[1/2] solvers on canonical problems");
    report += &solver_section(&bin, &args.out, &mut summary)?;
    eprintln!("[2/2] dense model: {}", model.display());
    report += "\n";
    report += &dense_section(&bin, &model, &data_dir, &limits, &mut summary)?;
    let _ = limits.gsm8k_eval + limits.train_steps;
    let report_path = args.out.join("README.md");
    std::fs::write(&report_path, &report).map_err(|e| e.to_string())?;
    let summary_path = args.out.join("summary.json");
    let text = serde_json::to_string_pretty(
        &json!({"scale": format!("{:?}", args.scale), "steps": summary}),
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(&summary_path, text).map_err(|e| e.to_string())?;
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
