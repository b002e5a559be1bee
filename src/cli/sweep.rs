//! `elm sweep`: when does acceleration pay? Every solver on the canonical linear problem swept
//! over the spectral radius ρ ([`elm::solver::rho_sweep`]); writes the rows as JSON, a markdown
//! table and a plot of map evaluations against ρ, with the trained ELMs' ρ marked.

use std::path::PathBuf;

use plotters::prelude::*;

use elm::equilibrium::spectral::SpectralReport;
use elm::error::{ElmError, Result};
use elm::io::read_json;
use elm::io::{write_atomic, write_json_atomic};
use elm::solver::rho_sweep::{rho_sweep, RhoSweepConfig, RhoSweepRow};
use elm::solver::{SolverConfig, BUILTIN_SOLVERS};

use super::output::{finish_plot, legend_line, print_json, write_plot, DrawResult};

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    /// Spectral radii (comma-separated, each in [0, 1)); default 0.2 … 0.995.
    #[arg(long, value_delimiter = ',')]
    pub rhos: Vec<f64>,
    /// Relative residual tolerances (comma-separated); default 1e-2, 1e-4, 1e-6.
    #[arg(long, value_delimiter = ',')]
    pub rel_tols: Vec<f64>,
    #[arg(long, default_value_t = 10_000)]
    pub max_iter: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A trained model's measured ρ to mark on the plot, as `NAME=RHO` (repeatable; `elm
    /// spectral` measures it).
    #[arg(long)]
    pub mark: Vec<String>,
    /// A trained model's ρ read from its `elm spectral --json` report, as `NAME=FILE` (repeatable;
    /// the report's mean radius is marked, its range given in the table's note).
    #[arg(long)]
    pub mark_report: Vec<String>,
    /// Directory for rho_sweep.json, rho_sweep.md and rho_sweep.svg.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub json: bool,
}

/// `NAME=FILE` (an `elm spectral --json` report) → (name, mean ρ), the name annotated with the
/// report's range and count so the table says what was measured.
fn parse_mark_report(s: &str) -> Result<(String, f64)> {
    let (name, file) = s
        .split_once('=')
        .ok_or_else(|| ElmError::config("mark_report", format!("`{s}`: expected NAME=FILE")))?;
    let report: SpectralReport = read_json(std::path::Path::new(file.trim()))?;
    if !(report.mean_radius.is_finite() && report.mean_radius >= 0.0) {
        return Err(ElmError::config(
            "mark_report",
            format!(
                "{file}: mean_radius {} is not a spectral radius",
                report.mean_radius
            ),
        ));
    }
    let label = format!(
        "{} (range {:.3}–{:.3} over {} sequences)",
        name.trim(),
        report.min_radius,
        report.max_radius,
        report.n
    );
    Ok((label, report.mean_radius))
}

/// `NAME=RHO` → (name, ρ).
fn parse_mark(s: &str) -> Result<(String, f64)> {
    let bad = || ElmError::config("mark", format!("`{s}`: expected NAME=RHO with 0 <= RHO"));
    let (name, rho) = s.rsplit_once('=').ok_or_else(bad)?;
    let rho: f64 = rho.trim().parse().map_err(|_| bad())?;
    if !(rho.is_finite() && rho >= 0.0) || name.trim().is_empty() {
        return Err(bad());
    }
    Ok((name.trim().to_string(), rho))
}

pub fn run_sweep(a: SweepArgs) -> Result<()> {
    let defaults = RhoSweepConfig::default();
    let cfg = RhoSweepConfig {
        rhos: if a.rhos.is_empty() {
            defaults.rhos
        } else {
            a.rhos.clone()
        },
        rel_tols: if a.rel_tols.is_empty() {
            defaults.rel_tols
        } else {
            a.rel_tols.clone()
        },
        max_iter: a.max_iter,
        seed: a.seed,
        ..defaults
    };
    let marks = a
        .mark
        .iter()
        .map(|m| parse_mark(m))
        .chain(a.mark_report.iter().map(|m| parse_mark_report(m)))
        .collect::<Result<Vec<_>>>()?;
    let solvers = BUILTIN_SOLVERS
        .iter()
        .map(|n| SolverConfig::by_name(n))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let rows = rho_sweep(&cfg, &solvers)?;
    std::fs::create_dir_all(&a.out).map_err(|e| ElmError::io(&a.out, e))?;
    let report = serde_json::json!({ "config": cfg, "marks": marks, "rows": rows });
    write_json_atomic(&a.out.join("rho_sweep.json"), &report)?;
    write_atomic(
        &a.out.join("rho_sweep.md"),
        markdown(&cfg, &rows, &marks).as_bytes(),
    )?;
    let plot = a.out.join("rho_sweep.svg");
    write_plot(
        &plot,
        (900, 560),
        |root| draw(root, &cfg, &rows, &marks),
        None,
    )?;
    if a.json {
        print_json(&report)?;
    } else {
        {
            use std::io::Write as _;
            let _ = std::io::stdout().write_all(markdown(&cfg, &rows, &marks).as_bytes());
        }
        say!("wrote {}", a.out.display());
    }
    Ok(())
}

fn row<'a>(rows: &'a [RhoSweepRow], rho: f64, tol: f64, solver: &str) -> Option<&'a RhoSweepRow> {
    rows.iter()
        .find(|r| r.rho == rho && r.rel_tol == tol && r.solver == solver)
}

/// One table per tolerance: mean map evaluations per solver and the saving against Picard.
fn markdown(cfg: &RhoSweepConfig, rows: &[RhoSweepRow], marks: &[(String, f64)]) -> String {
    let mut s = String::from(
        "Map evaluations to a relative residual tolerance on `z = A z + b` (A symmetric, \
         eigenvalues evenly over [−ρ, ρ], dimension 100, 8 right-hand sides), written by `elm sweep`.\n",
    );
    for &tol in &cfg.rel_tols {
        s += &format!("\n| ρ (tol {tol:e}) |");
        for n in BUILTIN_SOLVERS {
            s += &format!(" {n} |");
        }
        for n in BUILTIN_SOLVERS.iter().filter(|n| **n != "picard") {
            s += &format!(" {n} saving |");
        }
        s += "\n|---|";
        s += &"---:|".repeat(2 * BUILTIN_SOLVERS.len() - 1);
        s += "\n";
        for &rho in &cfg.rhos {
            s += &format!("| {rho} |");
            for n in BUILTIN_SOLVERS {
                let cell = row(rows, rho, tol, n).map_or("–".into(), |r| {
                    let star = if r.rows_converged < r.rows { "*" } else { "" };
                    format!(" {:.1}{star} |", r.mean_evaluations)
                });
                s += &cell;
            }
            for n in BUILTIN_SOLVERS.iter().filter(|n| **n != "picard") {
                let cell = row(rows, rho, tol, n).map_or("–".into(), |r| {
                    format!(" {:+.1}% |", 100.0 * r.saving_vs_picard)
                });
                s += &cell;
            }
            s += "\n";
        }
    }
    s += "\n`*`: some rows did not reach the tolerance within the evaluation budget.\n";
    if !marks.is_empty() {
        s += "\nMeasured ρ(∂φ/∂z) of trained models: ";
        let m: Vec<String> = marks
            .iter()
            .map(|(n, r)| format!("{n} ρ = {r:.3}"))
            .collect();
        s += &m.join(", ");
        s += ".\n";
    }
    s
}

/// Mean evaluations against ρ (log y), one line per solver at the middle tolerance, the
/// marked models' ρ as vertical lines.
fn draw(
    root: DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    cfg: &RhoSweepConfig,
    rows: &[RhoSweepRow],
    marks: &[(String, f64)],
) -> DrawResult {
    root.fill(&WHITE)?;
    let tol = cfg.rel_tols[cfg.rel_tols.len() / 2];
    let ys: Vec<f64> = rows
        .iter()
        .filter(|r| r.rel_tol == tol)
        .map(|r| r.mean_evaluations.max(1.0))
        .collect();
    let hi = ys.iter().copied().fold(2.0, f64::max) * 1.5;
    let x_lo = cfg.rhos.iter().copied().fold(1.0, f64::min).min(0.2) - 0.02;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("map evaluations to relative residual {tol:e} vs spectral radius"),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_lo..1.0f64, (1.0..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("ρ")
        .y_desc("mean map evaluations")
        .draw()?;
    let colors = [RED, BLUE, RGBColor(0, 150, 0)];
    for (n, color) in BUILTIN_SOLVERS.iter().zip(colors.iter()) {
        let color = *color;
        let pts: Vec<(f64, f64)> = cfg
            .rhos
            .iter()
            .filter_map(|&rho| row(rows, rho, tol, n).map(|r| (rho, r.mean_evaluations.max(1.0))))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(*n)
            .legend(legend_line(color.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    // Marks often sit close together (same window, different regularisation): labels are
    // staggered downwards and carry the short name only.
    let shown = marks.iter().filter(|(_, r)| *r < 1.0 && *r > x_lo);
    for (i, (name, rho)) in shown.enumerate() {
        chart.draw_series(LineSeries::new(
            vec![(*rho, 1.0), (*rho, hi)],
            BLACK.mix(0.5).stroke_width(1),
        ))?;
        // The short name unless another mark shares it (the main and the ablation budget's
        // ELM at one M): then the whole name, so that no two marks read alike.
        let short_of = |n: &str| n.split(" (").next().unwrap_or(n).to_string();
        let short = if marks
            .iter()
            .filter(|(other, _)| short_of(other) == short_of(name))
            .count()
            > 1
        {
            name.clone()
        } else {
            short_of(name)
        };
        chart.draw_series(std::iter::once(Text::new(
            short,
            (*rho, hi / 1.6 / 1.4f64.powi(i as i32)),
            ("sans-serif", 14),
        )))?;
    }
    finish_plot(&mut chart, None)
}
