//! `elm solve` (one solver on one canonical problem) and `elm study` (all solvers, residual plot).

use std::path::{Path, PathBuf};
use std::time::Instant;

use plotters::prelude::*;
use serde_json::{json, Value};

use elm::error::{ElmError, Result};
use elm::solver::problems::{max_row_error, Problem, PROBLEM_NAMES};
use elm::solver::{IterationInfo, Solution, SolverConfig, StopCriteria, BUILTIN_SOLVERS};

use super::output::{finish_plot, legend_line, print_json};

/// Arguments of `elm solve`.
#[derive(clap::Args, Debug)]
pub struct SolveArgs {
    /// Canonical problem.
    #[arg(long, value_parser = PROBLEM_NAMES)]
    pub problem: String,
    /// Spectral radius of A for `--problem linear`.
    #[arg(long, default_value_t = 0.9)]
    pub rho: f64,
    /// Solver.
    #[arg(long, value_parser = BUILTIN_SOLVERS, default_value = "anderson")]
    pub solver: String,
    /// Anderson history length.
    #[arg(long, alias = "m")]
    pub history: Option<usize>,
    /// Anderson ridge (relative to the Gram diagonal).
    #[arg(long)]
    pub lambda: Option<f64>,
    /// Damping / mixing β.
    #[arg(long)]
    pub beta: Option<f64>,
    /// Broyden memory L.
    #[arg(long)]
    pub memory: Option<usize>,
    /// Broyden: backtrack on residual growth.
    #[arg(long)]
    pub backtrack: bool,
    /// Absolute tolerance on ‖f(z) − z‖₂ per row (0 disables).
    #[arg(long, alias = "tol", default_value_t = 1e-8)]
    pub abs_tol: f64,
    /// Relative tolerance ‖f(z) − z‖₂ / (‖f(z)‖₂ + ε) per row (0 disables).
    #[arg(long, default_value_t = 0.0)]
    pub rel_tol: f64,
    /// Maximum map evaluations per row.
    #[arg(long, default_value_t = 50_000)]
    pub max_iter: usize,
    /// Power-iteration steps for the spectral radius of ∂f/∂z at the solution (0 = off).
    #[arg(long, default_value_t = 0)]
    pub spectral_iters: usize,
    /// Seed of the random problem data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Solver config as JSON (file): the algorithm and its options (`{"kind": "anderson",
    /// "history": 3}`), replacing --solver; the flags above may still override its options.
    /// Stopping comes from --abs-tol/--rel-tol/--max-iter only.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `elm study`.
#[derive(clap::Args, Debug)]
pub struct StudyArgs {
    /// Canonical problem.
    #[arg(long, value_parser = PROBLEM_NAMES)]
    pub problem: String,
    /// Spectral radius of A for `--problem linear`.
    #[arg(long, default_value_t = 0.9)]
    pub rho: f64,
    /// Absolute tolerance on ‖f(z) − z‖₂ per row.
    #[arg(long, alias = "tol", default_value_t = 1e-8)]
    pub abs_tol: f64,
    /// Maximum map evaluations per row.
    #[arg(long, default_value_t = 50_000)]
    pub max_iter: usize,
    /// Seed of the random problem data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output plot (`.svg` or `.png`).
    #[arg(long)]
    pub plot: PathBuf,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

fn solver_config(args: &SolveArgs) -> Result<SolverConfig> {
    let mut cfg = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| ElmError::io(path, e))?;
            SolverConfig::from_json(&text).map_err(|e| match ElmError::from(e) {
                ElmError::Json { msg, .. } => ElmError::Json {
                    what: path.display().to_string(),
                    msg,
                },
                other => other,
            })?
        }
        None => SolverConfig::by_name(&args.solver)?,
    };
    // Each flag sets the field of that name; a solver without it refuses, naming the ones with it.
    let params: [(&str, Option<Value>); 5] = [
        ("history", args.history.map(|v| json!(v))),
        ("lambda", args.lambda.map(|v| json!(v))),
        ("beta", args.beta.map(|v| json!(v))),
        ("memory", args.memory.map(|v| json!(v))),
        ("backtrack", args.backtrack.then_some(json!(true))),
    ];
    for (key, value) in params {
        if let Some(value) = value {
            cfg = cfg.with_param(key, value)?;
        }
    }
    if args.spectral_iters > elm::limits::MAX_ITER_CAP {
        return Err(ElmError::config(
            "spectral-iters",
            format!("exceeds the cap of {}", elm::limits::MAX_ITER_CAP),
        ));
    }
    if let Some(output) = cfg.output_mut() {
        output.spectral_radius_iters = args.spectral_iters;
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The stop criteria of `elm solve`'s flags.
fn stop_criteria(args: &SolveArgs) -> Result<StopCriteria> {
    let stop = StopCriteria {
        abs_tol: args.abs_tol,
        rel_tol: args.rel_tol,
        max_iter: args.max_iter,
        ..StopCriteria::default()
    };
    stop.validate()?;
    Ok(stop)
}

fn finite_or_null(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

fn summary(
    problem: &Problem,
    cfg: &SolverConfig,
    stop: &StopCriteria,
    sol: &Solution<f64>,
    seconds: f64,
) -> Value {
    let exact = problem.exact();
    let error = exact.map(|e| max_row_error(sol.z.view(), e.view()));
    let rel_residual = sol.rows.iter().map(|r| r.rel_residual).fold(0.0, f64::max);
    let spectral = sol
        .rows
        .iter()
        .filter_map(|r| r.spectral_radius)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    let statuses: Vec<_> = sol.rows.iter().map(|r| r.status).collect();
    json!({
        "problem": problem.name(),
        "rho": if let Problem::Linear(p) = problem { json!(p.rho) } else { Value::Null },
        "solver": cfg.name(),
        "config": cfg,
        "stop": stop,
        "batch": sol.z.nrows(),
        "dim": sol.z.ncols(),
        "iterations": sol.max_iterations(),
        "map_evals": sol.map_evals,
        "converged": sol.all_converged(),
        "rows_converged": sol.rows.iter().filter(|r| r.status == elm::solver::RowStatus::Converged).count(),
        "statuses": if statuses.len() <= 8 { json!(statuses) } else { Value::Null },
        "residual": finite_or_null(sol.max_residual()),
        "rel_residual": finite_or_null(rel_residual),
        "error_vs_exact": error.map(finite_or_null),
        "error_bound": problem.lipschitz().map(|l| finite_or_null(sol.max_residual() / (1.0 - l))),
        "spectral_radius": spectral,
        "spectral_map_evals": sol.spectral_map_evals,
        "restarts": sol.rows.iter().map(|r| r.restarts).sum::<usize>(),
        "backtracks": sol.rows.iter().map(|r| r.backtracks).sum::<usize>(),
        "seconds": seconds,
    })
}

/// `elm solve`: one solver on one canonical problem.
pub fn run_solve(args: SolveArgs) -> Result<()> {
    let cfg = solver_config(&args)?;
    let stop = stop_criteria(&args)?;
    let mut problem = Problem::by_name(&args.problem, args.rho, args.seed)?;
    let z0 = problem.z0();
    let solver = cfg.build::<f64>();
    let start = Instant::now();
    let sol = solver.solve(problem.map(), z0.view(), &stop)?;
    let seconds = start.elapsed().as_secs_f64();
    let out = summary(&problem, &cfg, &stop, &sol, seconds);
    if args.json {
        print_json(&out)?;
    } else {
        say!(
            "{} on {}: converged {} ({}/{} rows), {} iterations, {} map evals, residual {:.3e}, error vs exact {}, {:.4} s",
            cfg.name(),
            problem.name(),
            out["converged"],
            out["rows_converged"],
            out["batch"],
            out["iterations"],
            out["map_evals"],
            sol.max_residual(),
            out["error_vs_exact"],
            seconds
        );
    }
    Ok(())
}

/// Max residual over rows after each batched map evaluation, for one solver.
struct Curve {
    solver: &'static str,
    residuals: Vec<f64>,
    sol: Solution<f64>,
    seconds: f64,
}

/// `elm study`: every solver on one problem, residual-vs-map-evaluation curves (log y).
pub fn run_study(args: StudyArgs) -> Result<()> {
    let ext = args
        .plot
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase());
    if !matches!(ext.as_deref(), Some("svg") | Some("png")) {
        return Err(ElmError::config(
            "plot",
            format!("{}: extension must be .svg or .png", args.plot.display()),
        ));
    }
    let mut problem = Problem::by_name(&args.problem, args.rho, args.seed)?;
    let z0 = problem.z0();
    let mut curves = Vec::new();
    for name in BUILTIN_SOLVERS {
        let cfg = SolverConfig::by_name(name)?;
        let stop = StopCriteria::absolute(args.abs_tol, args.max_iter);
        stop.validate()?;
        let mut residuals = Vec::new();
        let mut observer = |info: &IterationInfo<'_, f64>| {
            residuals.push(info.residuals.iter().cloned().fold(0.0, f64::max));
        };
        let start = Instant::now();
        let sol =
            cfg.build::<f64>()
                .solve_observed(problem.map(), z0.view(), &stop, &mut observer)?;
        curves.push(Curve {
            solver: name,
            residuals,
            sol,
            seconds: start.elapsed().as_secs_f64(),
        });
    }
    let title = match &problem {
        Problem::Linear(p) => format!("linear (rho = {})", p.rho),
        p => p.name().to_string(),
    };
    draw_curves(&args.plot, &title, &curves)?;
    let solvers: Vec<Value> = curves
        .iter()
        .map(|c| {
            json!({
                "solver": c.solver,
                "map_evals": c.sol.map_evals,
                "converged": c.sol.all_converged(),
                "residual": finite_or_null(c.sol.max_residual()),
                "seconds": c.seconds,
                "curve": c.residuals.iter().map(|&r| finite_or_null(r)).collect::<Vec<_>>(),
            })
        })
        .collect();
    if args.json {
        print_json(&json!({"problem": problem.name(), "plot": args.plot, "solvers": solvers}))?;
    } else {
        for c in &curves {
            say!(
                "{:9} {} map evals, converged {}, residual {:.3e}",
                c.solver,
                c.sol.map_evals,
                c.sol.all_converged(),
                c.sol.max_residual()
            );
        }
        say!("plot written to {}", args.plot.display());
    }
    Ok(())
}

/// Draws the curves to `path` (SVG, or PNG by extension).
fn draw_curves(path: &Path, title: &str, curves: &[Curve]) -> Result<()> {
    super::output::write_plot(
        path,
        (900, 600),
        |root| draw_on(root, title, curves),
        Some(&|root| draw_on(root, title, curves)),
    )
}

fn draw_on<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    curves: &[Curve],
) -> std::result::Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let positive = curves
        .iter()
        .flat_map(|c| c.residuals.iter().cloned())
        .filter(|r| r.is_finite() && *r > 0.0);
    let (lo, hi) = positive.fold((f64::INFINITY, 0.0f64), |(lo, hi), r| {
        (lo.min(r), hi.max(r))
    });
    let (lo, hi) = if lo.is_finite() {
        (lo * 0.5, hi * 2.0)
    } else {
        (1e-16, 1.0)
    };
    let max_x = curves
        .iter()
        .map(|c| c.residuals.len())
        .max()
        .unwrap_or(1)
        .max(2);
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("fixed-point residual: {title}"), ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(1f64..max_x as f64, (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("map evaluations")
        .y_desc("max row ||f(z) - z||")
        .y_label_formatter(&|v| format!("{v:.0e}"))
        .draw()?;
    let colors = [RED, BLUE, RGBColor(0, 150, 0)];
    for (c, color) in curves.iter().zip(colors.iter()) {
        let color = *color;
        chart
            .draw_series(LineSeries::new(
                c.residuals
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.is_finite() && **r > 0.0)
                    .map(|(i, &r)| ((i + 1) as f64, r)),
                color.stroke_width(2),
            ))?
            .label(format!("{} ({} evals)", c.solver, c.residuals.len()))
            .legend(legend_line(color.stroke_width(2)));
    }
    finish_plot(&mut chart, None)
}
