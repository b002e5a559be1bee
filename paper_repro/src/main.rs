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

/// Sizes of one scale.
struct Limits {
    gsm8k_eval: usize,
    max_new_tokens: usize,
    train_steps: usize,
    batch_size: usize,
    seq_len: usize,
    held_out: usize,
    bench: bool,
}

impl Scale {
    fn limits(self) -> Limits {
        match self {
            Scale::Smoke => Limits {
                gsm8k_eval: 2,
                max_new_tokens: 32,
                train_steps: 2,
                batch_size: 1,
                seq_len: 64,
                held_out: 2,
                bench: false,
            },
            Scale::Small => Limits {
                gsm8k_eval: 30,
                max_new_tokens: 200,
                train_steps: 200,
                batch_size: 2,
                seq_len: 128,
                held_out: 16,
                bench: true,
            },
            Scale::Paper => Limits {
                gsm8k_eval: 1319,
                max_new_tokens: 256,
                train_steps: 2000,
                batch_size: 8,
                seq_len: 256,
                held_out: 64,
                bench: true,
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
            } else if x == 0.0 || (1e-2..1e5).contains(&x.abs()) {
                format!("{x:.3}")
            } else {
                format!("{x:.3e}")
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
        let plot = out.join(format!(
            "study_{}.svg",
            label.replace('ρ', "rho").replace([' ', '='], "_")
        ));
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

/// Section 2: speed of the dense model on this machine (bandwidth and sgemm rooflines).
fn bench_section(bin: &Path, model: &Path, summary: &mut Vec<Value>) -> Result<String, String> {
    let v = elm_json(
        bin,
        &strings(&["bench", "--model", &model.display().to_string()]),
    )?;
    let mut md =
        String::from("## Dense model speed (`elm bench`)\n\n| metric | value |\n|---|---|\n");
    for (k, x) in v.as_object().into_iter().flatten() {
        if x.is_number() {
            let _ = writeln!(md, "| {k} | {} |", num(&v, k));
        }
    }
    summary.push(json!({"section": "bench", "result": v}));
    Ok(md)
}

/// Section 3: compress (M layers from `start`), train, and evaluate the ELM against the dense model
/// with every solver at δ ∈ {0.1, 0.5}.
#[allow(clippy::too_many_arguments)]
fn elm_section(
    bin: &Path,
    model: &Path,
    data_dir: &Path,
    out: &Path,
    start: usize,
    m: usize,
    limits: &Limits,
    summary: &mut Vec<Value>,
) -> Result<String, String> {
    let model_s = model.display().to_string();
    let data_s = data_dir.display().to_string();
    let init_ck = out.join("elm_init").display().to_string();
    let trained_ck = out.join("elm_trained").display().to_string();
    let bar = indicatif::ProgressBar::new(9);

    let comp = elm_json(
        bin,
        &strings(&[
            "compress",
            "--model",
            &model_s,
            "--start",
            &start.to_string(),
            "--m",
            &m.to_string(),
            "--out",
            &init_ck,
        ]),
    )?;
    summary.push(json!({"section": "elm_compress", "result": comp}));
    bar.inc(1);
    let p = &comp["params"];
    let kv = &comp["kv"];
    let mut md = format!(
        "## ELM: layers [{start}, {}) replaced by one fixed-point module\n\n\
         | parameters | dense | ELM | reduction |\n|---|---|---|---|\n\
         | total | {} | {} | {:.1}% |\n| non-embedding | {} | {} | {:.1}% |\n\n\
         KV cache at {} tokens (batch {}): dense {} B, one-step {} B ({:.3} of dense), \
         multi-step with {} iterations {} B ({:.3} of dense).\n\n",
        start + m,
        p["dense_total"],
        p["elm_total"],
        100.0 * p["reduction_total"].as_f64().unwrap_or(f64::NAN),
        p["dense_non_embedding"],
        p["elm_non_embedding"],
        100.0 * p["reduction_non_embedding"].as_f64().unwrap_or(f64::NAN),
        kv["context"],
        kv["batch"],
        kv["dense"],
        kv["one_step"],
        kv["one_step_ratio"].as_f64().unwrap_or(f64::NAN),
        kv["multi_step_iterations"],
        kv["multi_step"],
        kv["multi_step_ratio"].as_f64().unwrap_or(f64::NAN),
    );

    let train_cfg = out.join("train_config.json");
    let cfg = json!({"steps": limits.train_steps, "batch_size": limits.batch_size, "seq_len": limits.seq_len, "seed": 0});
    std::fs::write(&train_cfg, cfg.to_string())
        .map_err(|e| format!("{}: {e}", train_cfg.display()))?;
    let tr = elm_json(
        bin,
        &strings(&[
            "train",
            "--model",
            &model_s,
            "--elm",
            &init_ck,
            "--config",
            &train_cfg.display().to_string(),
            "--out",
            &trained_ck,
            "--data-dir",
            &data_s,
            "--eval-examples",
            &limits.held_out.to_string(),
        ]),
    )?;
    summary.push(json!({"section": "elm_train", "result": tr}));
    bar.inc(1);
    let _ = writeln!(
        md,
        "Training: {} steps (batch {}, {} tokens, SJFB, CE+distillation schedule) in {} s; distillation MSE on {} \
         held-out GSM8K test problems: {} before → {} after.\n",
        limits.train_steps,
        limits.batch_size,
        limits.seq_len,
        num(&tr, "seconds"),
        limits.held_out,
        num(&tr, "distill_before"),
        num(&tr, "distill_after"),
    );

    md += &format!(
        "GSM8K: first {} test problems, greedy, {} new tokens; iterations include the commit pass.\n\n\
         | model | solver | δ | accuracy | answer perplexity | mean it/token | max it | layer evals/token | tok/s |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        limits.gsm8k_eval, limits.max_new_tokens
    );
    let eval_base = strings(&[
        "eval",
        "--model",
        &model_s,
        "--task",
        "gsm8k",
        "--limit",
        &limits.gsm8k_eval.to_string(),
        "--max-new-tokens",
        &limits.max_new_tokens.to_string(),
        "--batch",
        "10",
        "--data-dir",
        &data_s,
    ]);
    let dense = elm_json(bin, &eval_base)?;
    bar.inc(1);
    let _ = writeln!(
        md,
        "| dense | — | — | {} | {} | — | — | {} | {} |",
        num(&dense, "accuracy"),
        num(&dense, "answer_perplexity"),
        num(p, "num_layers"),
        num(&dense, "tok_s"),
    );
    summary.push(json!({"section": "eval", "model": "dense", "result": dense}));
    for solver in ["picard", "anderson", "broyden"] {
        for tol in ["0.1", "0.5"] {
            let mut args = eval_base.clone();
            args.extend(strings(&[
                "--elm",
                &trained_ck,
                "--solver",
                solver,
                "--tol",
                tol,
            ]));
            let v = elm_json(bin, &args)?;
            let s = &v["solver"];
            let _ = writeln!(
                md,
                "| ELM | {solver} | {tol} | {} | {} | {} | {} | {} | {} |",
                num(&v, "accuracy"),
                num(&v, "answer_perplexity"),
                num(s, "mean_iterations"),
                num(s, "max_iterations"),
                num(s, "layer_evals_per_token"),
                num(&v, "tok_s"),
            );
            summary.push(json!({"section": "eval", "model": "elm", "solver": solver, "tol": tol, "result": v}));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
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
    eprintln!("[1/3] solvers on canonical problems");
    report += &solver_section(&bin, &args.out, &mut summary)?;
    report += "\n";
    if limits.bench {
        eprintln!("[2/3] dense model speed: {}", model.display());
        report += &bench_section(&bin, &model, &mut summary)?;
        report += "\n";
    }
    eprintln!(
        "[3/3] ELM: compress, train {} steps, evaluate",
        limits.train_steps
    );
    report += &elm_section(
        &bin,
        &model,
        &data_dir,
        &args.out,
        args.start,
        args.m,
        &limits,
        &mut summary,
    )?;
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
