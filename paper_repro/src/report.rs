//! `OUT/tables.json` (typed, read back by the smoke test), `OUT/README.md` (every table next
//! to what the paper reports for it, the plots embedded) and the SVG plots.

use elm::search::report::WhereToPrune;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::element::ErrorBar;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::ReproError;
use crate::markdown::{float, Table, NOT_APPLICABLE};
use crate::paper;
use crate::solvers::CanonicalRow;
use crate::stage::{seconds, StageLog};
use crate::tables::*;

/// `elm bench` figures the speed section reads.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchFigures {
    pub sgemm_gflop_s: f64,
    pub prefill_tok_s: f64,
    pub prefill_gflop_s: f64,
    pub decode_b1_tok_s: f64,
}

/// Every table of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tables {
    pub scale: String,
    pub model: String,
    pub main: Vec<MainRow>,
    pub kv: Vec<KvRow>,
    pub solver: Vec<SolverRow>,
    pub grad: Vec<GradRow>,
    pub sweep: Vec<SweepRow>,
    /// Table 6 (absent when `--only` never selected it).
    #[serde(deserialize_with = "Option::deserialize")]
    pub where_to_prune: Option<WhereToPrune>,
    pub canonical: Vec<CanonicalRow>,
    pub spectral: Vec<SpectralRow>,
    pub speed: Vec<SpeedRow>,
    /// Absent at `smoke` (no benchmark).
    #[serde(deserialize_with = "Option::deserialize")]
    pub bench: Option<BenchFigures>,
    /// Stages of the last invocation, in order (cached or computed, with their seconds).
    pub stages: Vec<StageLog>,
    /// Wall seconds of the last invocation.
    pub seconds: f64,
    /// Settings of the scale (budgets, limits).
    pub limits: serde_json::Value,
    /// Table 1's method-against-method comparison at the best healed baseline's window.
    #[serde(default)]
    pub same_window: Option<SameWindow>,
    /// Table 6: fully trained ELMs at the windows the pipeline considers.
    #[serde(default)]
    pub trained_windows: Vec<TrainedWindow>,
    /// Table 1's ELM + heal row against the plain ELM (and the baseline) at its window.
    #[serde(default)]
    pub healed_elm: Option<HealedElm>,
    /// Table 7c: the ρ sweep with table 7b's trained ELMs marked.
    #[serde(default)]
    pub rho_sweep: Option<crate::runs::RhoSweep>,
    /// Table 8 (scales with a curve study).
    #[serde(default)]
    pub curves: Option<crate::curves::Curves>,
    /// Table 9 (same scales).
    #[serde(default)]
    pub seeds: Option<crate::curves::Seeds>,
}

/// The model as a reader can find it: its file (or directory) name, not this machine's path.
fn model_label(model: &str) -> String {
    Path::new(model)
        .file_name()
        .map_or_else(|| model.to_string(), |f| f.to_string_lossy().into_owned())
}

fn iv(i: &Interval) -> String {
    format!("{} [{}, {}]", float(i.value), float(i.lo), float(i.hi))
}

fn signed(i: &Interval) -> String {
    let s = |x: f64| format!("{}{}", if x >= 0.0 { "+" } else { "" }, float(x));
    let mark = if i.lo > 0.0 {
        " ↑"
    } else if i.hi < 0.0 {
        " ↓"
    } else {
        ""
    };
    format!("{} [{}, {}]{mark}", s(i.value), s(i.lo), s(i.hi))
}

fn opt(i: &Option<Interval>, f: fn(&Interval) -> String) -> String {
    i.as_ref().map_or_else(|| NOT_APPLICABLE.to_string(), f)
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

pub fn main_table(rows: &[MainRow]) -> String {
    let mut t = Table::new(&[
        "model",
        "kind",
        "params",
        "non-emb. params",
        "KV bytes @1k",
        "own training tokens",
        "own compute",
        "answer NLL",
        "ΔNLL vs dense",
        "ΔNLL vs ELM",
        "flexible EM",
        "strict EM",
        "RP (flexible)",
    ]);
    for r in rows {
        t.row(&[
            r.model.clone(),
            r.kind.clone(),
            r.params.to_string(),
            r.non_embedding_params.to_string(),
            r.kv_bytes_1k.to_string(),
            r.train_tokens.to_string(),
            seconds(r.train_seconds),
            iv(&r.answer_nll),
            opt(&r.delta_nll, signed),
            opt(&r.delta_nll_vs_elm, signed),
            iv(&r.flexible_em),
            iv(&r.strict_em),
            opt(&r.rp_flexible, iv),
        ]);
    }
    t.into_markdown()
}

fn kv_table(rows: &[KvRow]) -> String {
    let mut t = Table::new(&[
        "M",
        "KV mode",
        "KV bytes (allocated)",
        "dense bytes",
        "ratio vs dense",
        "flexible EM",
        "strict EM",
        "mean it/token",
        "layer evals/token",
    ]);
    for r in rows {
        t.row(&[
            r.m.to_string(),
            r.mode.clone(),
            r.kv_bytes.to_string(),
            r.dense_kv_bytes.to_string(),
            format!("{:.3}", r.ratio_vs_dense),
            iv(&r.flexible_em),
            iv(&r.strict_em),
            float(r.mean_iterations),
            float(r.layer_evals_per_token),
        ]);
    }
    t.into_markdown()
}

fn solver_table(rows: &[SolverRow]) -> String {
    let mut t = Table::new(&[
        "solver",
        "δ",
        "mean it",
        "max it",
        "block evals/token",
        "layer evals/token",
        "compute saved vs Picard",
        "answer NLL",
        "ΔNLL vs dense",
    ]);
    for r in rows {
        t.row(&[
            r.solver.clone(),
            float(r.tol),
            float(r.mean_iterations),
            r.max_iterations.to_string(),
            float(r.block_evals_per_token),
            float(r.layer_evals_per_token),
            pct(r.compute_saved_vs_picard),
            iv(&r.answer_nll),
            signed(&r.delta_nll),
        ]);
    }
    t.into_markdown()
}

fn grad_table(rows: &[GradRow]) -> String {
    let mut t = Table::new(&[
        "gradient rule",
        "steps",
        "s/step",
        "tokens/s",
        "peak RSS (MiB)",
        "teacher cache hits/misses",
        "held-out distill MSE",
        "answer NLL",
        "ΔNLL vs dense",
    ]);
    for r in rows {
        t.row(&[
            r.rule.clone(),
            r.steps.to_string(),
            float(r.seconds_per_step),
            float(r.tokens_per_s),
            mib(r.peak_rss_bytes),
            format!("{}/{}", r.teacher_cache_hits, r.teacher_cache_misses),
            float(r.distill_after),
            iv(&r.answer_nll),
            signed(&r.delta_nll),
        ]);
    }
    t.into_markdown()
}

fn sweep_table(rows: &[SweepRow]) -> String {
    let mut t = Table::new(&[
        "M",
        "method",
        "params",
        "non-emb. params",
        "KV bytes @1k",
        "answer NLL",
        "ΔNLL vs dense",
    ]);
    for r in rows {
        t.row(&[
            r.m.to_string(),
            r.method.clone(),
            r.params.to_string(),
            r.non_embedding_params.to_string(),
            r.kv_bytes_1k.to_string(),
            iv(&r.answer_nll),
            signed(&r.delta_nll),
        ]);
    }
    t.into_markdown()
}

fn canonical_table(rows: &[CanonicalRow]) -> String {
    let mut t = Table::new(&[
        "problem",
        "solver",
        "converged",
        "iterations",
        "map evals",
        "residual",
        "error vs exact",
        "seconds",
    ]);
    for r in rows {
        t.row(&r.cells());
    }
    t.into_markdown()
}

fn spectral_table(rows: &[SpectralRow]) -> String {
    let mut t = Table::new(&[
        "model",
        "M",
        "sequences",
        "mean ρ",
        "min ρ",
        "max ρ",
        "max ‖φ(z*)−z*‖/‖z*‖",
    ]);
    for r in rows {
        t.row(&[
            r.model.clone(),
            r.m.to_string(),
            r.sequences.to_string(),
            float(r.mean_radius),
            float(r.min_radius),
            float(r.max_radius),
            float(r.max_rel_residual),
        ]);
    }
    t.into_markdown()
}

fn speed_table(rows: &[SpeedRow], bench: &Option<BenchFigures>) -> String {
    let mut t = Table::new(&[
        "training",
        "steps",
        "tokens",
        "seconds",
        "tokens/s",
        "× dense prefill tok/s",
        "teacher cache hits/misses",
        "peak RSS (MiB)",
    ]);
    for r in rows {
        t.row(&[
            r.training.clone(),
            r.steps.to_string(),
            r.tokens.to_string(),
            float(r.seconds),
            float(r.tokens_per_s),
            bench.as_ref().map_or_else(
                || NOT_APPLICABLE.into(),
                |b| format!("{:.3}", r.tokens_per_s / b.prefill_tok_s),
            ),
            format!("{}/{}", r.teacher_cache_hits, r.teacher_cache_misses),
            mib(r.peak_rss_bytes),
        ]);
    }
    t.into_markdown()
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> ReproError {
    ReproError::io(path, std::io::Error::other(e.to_string()))
}

/// Compute (fixed-point block evaluations per token) vs answer NLL, one line per solver.
pub fn plot_solvers(rows: &[SolverRow], dense_nll: f64, path: &Path) -> Result<(), ReproError> {
    let xs: Vec<f64> = rows.iter().map(|r| r.block_evals_per_token).collect();
    let ys: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.answer_nll.lo, r.answer_nll.hi])
        .chain([dense_nll])
        .collect();
    let (x0, x1) = bounds(&xs);
    let (y0, y1) = with_legend_room(bounds(&ys));
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Solver ablation: compute vs quality (main ELM)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("fixed-point block evaluations per token")
        .y_desc("answer NLL (nats/token)")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    let colors = [RED, BLUE, GREEN];
    for (i, solver) in crate::elm_cli::SOLVERS.iter().enumerate() {
        let mut pts: Vec<(f64, &Interval)> = rows
            .iter()
            .filter(|r| r.solver == *solver)
            .map(|r| (r.block_evals_per_token, &r.answer_nll))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = colors[i % colors.len()];
        draw_estimates(&mut chart, &pts, c, solver, path)?;
    }
    chart
        .draw_series(LineSeries::new(
            vec![(x0, dense_nll), (x1, dense_nll)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| plot_err(path, e))?
        .label("dense")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Answer NLL vs M for the ELM and the baseline of the sweep.
pub fn plot_sweep(rows: &[SweepRow], dense_nll: f64, path: &Path) -> Result<(), ReproError> {
    let ms: Vec<usize> = rows.iter().map(|r| r.m).collect();
    let (m0, m1) = (
        ms.iter().copied().min().unwrap_or(0),
        ms.iter().copied().max().unwrap_or(1),
    );
    // Whole layers: the axis runs half a layer past the ends and labels integers only.
    let (x0, x1) = (m0 as f64 - 0.5, m1 as f64 + 0.5);
    let ys: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.answer_nll.lo, r.answer_nll.hi])
        .chain([dense_nll])
        .collect();
    let (y0, y1) = with_legend_room(bounds(&ys));
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Compression sweep: quality vs replaced layers M",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_labels(m1 - m0 + 2)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{:.0}", x)
            } else {
                String::new()
            }
        })
        .x_desc("replaced layers M")
        .y_desc("answer NLL (nats/token)")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    let mut methods: Vec<String> = rows.iter().map(|r| r.method.clone()).collect();
    methods.dedup();
    methods.sort();
    methods.dedup();
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for (i, method) in methods.iter().enumerate() {
        let pts: Vec<(f64, &Interval)> = rows
            .iter()
            .filter(|r| &r.method == method)
            .map(|r| (r.m as f64, &r.answer_nll))
            .collect();
        let c = colors[i % colors.len()];
        draw_estimates(&mut chart, &pts, c, method, path)?;
    }
    chart
        .draw_series(LineSeries::new(
            vec![(x0, dense_nll), (x1, dense_nll)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| plot_err(path, e))?
        .label("dense")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// One labelled line through the estimates, each point with its 95% interval as an error bar.
fn draw_estimates<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    pts: &[(f64, &Interval)],
    c: RGBColor,
    label: &str,
    path: &Path,
) -> Result<(), ReproError> {
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|(x, e)| (*x, e.value)),
            c.stroke_width(2),
        ))
        .map_err(|e| plot_err(path, e))?
        .label(format!("{label} (bars: 95% interval)"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c));
    chart
        .draw_series(
            pts.iter()
                .map(|(x, e)| ErrorBar::new_vertical(*x, e.lo, e.value, e.hi, c.filled(), 8)),
        )
        .map_err(|e| plot_err(path, e))?;
    chart
        .draw_series(
            pts.iter()
                .map(|(x, e)| Circle::new((*x, e.value), 3, c.filled())),
        )
        .map_err(|e| plot_err(path, e))?;
    Ok(())
}

/// Stretches a y range upwards by 40% so that the legend, drawn at the top, covers no data.
fn with_legend_room((lo, hi): (f64, f64)) -> (f64, f64) {
    (lo, hi + 0.4 * (hi - lo))
}

/// Axis range covering `v` with a 5% margin (a unit range around a single value).
fn bounds(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-3 * hi.abs().max(1.0));
    (lo - pad, hi + pad)
}

/// `12.3k` tokens, `1.2M`.
fn count(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn signed_float(x: f64) -> String {
    format!("{}{}", if x >= 0.0 { "+" } else { "" }, float(x))
}

/// Table 8: the points, then each curve's trend against the reference ELM.
fn curves_table(c: &crate::curves::Curves) -> String {
    let mut t = Table::new(&[
        "model",
        "steps",
        "training tokens",
        "compute",
        "answer NLL",
        "minus the reference ELM (paired)",
    ]);
    for p in &c.points {
        t.row(&[
            p.series.clone(),
            p.steps.to_string(),
            count(p.tokens as f64),
            seconds(p.compute_seconds),
            iv(&p.answer_nll),
            opt(&p.minus_elm, signed),
        ]);
    }
    let mut tr = Table::new(&[
        "model",
        "answer NLL per doubling of tokens",
        "gap at the smallest budget",
        "gap at the largest budget",
        "gap per doubling",
        "gap",
        "gap extrapolated to the paper's budget",
    ]);
    for r in &c.trends {
        tr.row(&[
            r.series.clone(),
            signed_float(r.slope_per_doubling),
            opt(&r.gap_smallest, signed),
            opt(&r.gap_largest, signed),
            r.gap_slope_per_doubling
                .map_or_else(|| NOT_APPLICABLE.into(), signed_float),
            r.verdict.clone(),
            r.gap_at_paper_budget
                .map_or_else(|| NOT_APPLICABLE.into(), signed_float),
        ]);
    }
    let mut s = format!(
        "Gaps are each model's answer NLL minus that of **{}** trained with the same number of steps (positive: the ELM is better). \
         Trends are least-squares lines against log2(tokens) through every budget. The paper's budget (two epochs of MetaMathQA, {} \
         problems seen) lies {:.1} doublings beyond the largest budget here; a line through {} points spanning {:.0} doublings says \
         little that far out, so read the extrapolated gap as the sign of the trend, not a forecast.\n\n{}\n{}",
        c.reference,
        count(crate::curves::PAPER_PROBLEMS),
        c.doublings_to_paper,
        c.points.iter().filter(|p| p.series == c.reference).count(),
        curve_span(c),
        t.into_markdown(),
        tr.into_markdown()
    );
    if let Some(v) = curves_verdict(c) {
        s += &format!("\n{v}\n");
    }
    s
}

/// Doublings between the smallest and the largest budget of the reference curve.
fn curve_span(c: &crate::curves::Curves) -> f64 {
    let toks: Vec<f64> = c
        .points
        .iter()
        .filter(|p| p.series == c.reference)
        .map(|p| p.tokens as f64)
        .collect();
    elm::eval::stats::spread(&toks).map_or(0.0, |s| (s.max / s.min.max(1.0)).log2())
}

/// The sentence a reader looks for: does the best baseline's gap to the ELM shrink, cross or
/// grow with the budget (the first trend after the reference's own).
fn curves_verdict(c: &crate::curves::Curves) -> Option<String> {
    let r = c.trends.iter().find(|r| r.series != c.reference)?;
    let (first, last) = (r.gap_smallest?, r.gap_largest?);
    let sure = |i: &Interval| {
        if i.lo > 0.0 {
            "the ELM is surely better"
        } else if i.hi < 0.0 {
            "the ELM is surely worse"
        } else {
            "not distinguishable"
        }
    };
    Some(format!(
        "**Verdict:** against {}, the gap {} with the budget: {} at the smallest budget ({}), {} at the largest ({}); \
         it changes by {} nats/token per doubling of tokens.",
        r.series,
        r.verdict,
        signed(&first),
        sure(&first),
        signed(&last),
        sure(&last),
        r.gap_slope_per_doubling
            .map_or_else(|| NOT_APPLICABLE.into(), signed_float),
    ))
}

/// Table 9: every seed, then the spread over seeds beside the intervals over problems.
fn seeds_table(s: &crate::curves::Seeds) -> String {
    let mut t = Table::new(&[
        "model",
        "seed",
        "answer NLL",
        "minus the ELM (paired, same seed)",
    ]);
    for r in &s.rows {
        t.row(&[
            r.series.clone(),
            r.seed.to_string(),
            iv(&r.answer_nll),
            opt(&r.minus_elm, signed),
        ]);
    }
    let spread = |x: &elm::eval::stats::Spread| {
        format!(
            "{} ± {} ({} … {})",
            float(x.mean),
            float(x.sd),
            float(x.min),
            float(x.max)
        )
    };
    let mut u = Table::new(&[
        "model",
        "seeds",
        "answer NLL: mean ± sd (min … max) over seeds",
        "minus the ELM: mean ± sd (min … max)",
        "verdict",
    ]);
    for r in &s.summaries {
        u.row(&[
            r.series.clone(),
            r.answer_nll.n.to_string(),
            spread(&r.answer_nll),
            r.minus_elm
                .as_ref()
                .map_or_else(|| NOT_APPLICABLE.into(), spread),
            r.verdict.clone(),
        ]);
    }
    format!(
        "Each model trained again with another seed (data order, LoRA init, dropout masks) at the main budget; the compressed \
         models are cut from the same LoRA-tuned dense model (seed 0). \"Surely\" better or worse needs every seed's paired \
         interval over problems to exclude 0 on the same side.\n\n{}\n{}",
        t.into_markdown(),
        u.into_markdown()
    )
}

/// Answer NLL against the log2 of `x` (training tokens or compute seconds), one line per model.
pub fn plot_curves(
    c: &crate::curves::Curves,
    x_of: fn(&crate::curves::CurvePoint) -> f64,
    x_desc: &str,
    path: &Path,
) -> Result<(), ReproError> {
    let xs: Vec<f64> = c.points.iter().map(|p| x_of(p).max(1.0).log2()).collect();
    let ys: Vec<f64> = c
        .points
        .iter()
        .flat_map(|p| [p.answer_nll.lo, p.answer_nll.hi])
        .collect();
    let (x0, x1) = bounds(&xs);
    let (y0, y1) = with_legend_room(bounds(&ys));
    let root = SVGBackend::new(path, (760, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Learning curves: answer NLL vs {x_desc}"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| count(x.exp2()))
        .x_desc(format!("{x_desc} (log scale)"))
        .y_desc("answer NLL (nats/token)")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    let mut names: Vec<&str> = vec![];
    for p in &c.points {
        if !names.contains(&p.series.as_str()) {
            names.push(&p.series);
        }
    }
    let colors = [
        RED,
        BLUE,
        BLACK,
        MAGENTA,
        GREEN,
        CYAN,
        RGBColor(230, 140, 0),
    ];
    for (i, name) in names.iter().enumerate() {
        let mut pts: Vec<(f64, &Interval)> = c
            .points
            .iter()
            .filter(|p| p.series == *name)
            .map(|p| (x_of(p).max(1.0).log2(), &p.answer_nll))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        draw_estimates(&mut chart, &pts, colors[i % colors.len()], name, path)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Table 7c: map evaluations against ρ at the middle tolerance of the sweep, where each trained
/// ELM sits on that axis, and what the solver ablation measured on the real module.
fn rho_sweep_table(r: &crate::runs::RhoSweep, solver: &[SolverRow]) -> String {
    let tols = &r.config.rel_tols;
    let Some(&tol) = tols.get(tols.len() / 2) else {
        return String::new();
    };
    let at = |rho: f64, name: &str| {
        r.rows
            .iter()
            .find(|x| x.rho == rho && x.rel_tol == tol && x.solver == name)
    };
    let mut t = Table::new(&[
        "ρ",
        "Picard evaluations",
        "Anderson evaluations (saved)",
        "Broyden evaluations (saved)",
    ]);
    for &rho in &r.config.rhos {
        let cell = |name: &str| {
            at(rho, name).map_or_else(
                || NOT_APPLICABLE.to_string(),
                |x| {
                    format!(
                        "{} ({})",
                        float(x.mean_evaluations),
                        pct(x.saving_vs_picard)
                    )
                },
            )
        };
        t.row(&[
            float(rho),
            at(rho, "picard").map_or_else(|| NOT_APPLICABLE.into(), |x| float(x.mean_evaluations)),
            cell("anderson"),
            cell("broyden"),
        ]);
    }
    // Each trained ELM at the nearest swept ρ.
    let mut marks = String::new();
    for (name, rho) in &r.marks {
        let nearest = r
            .config
            .rhos
            .iter()
            .copied()
            .min_by(|a, b| (a - rho).abs().total_cmp(&(b - rho).abs()));
        if let Some(x) = nearest.and_then(|n| at(n, "anderson")) {
            marks += &format!(
                "- {name}: ρ = {} → nearest swept ρ {}: Anderson saves {} of Picard's evaluations.\n",
                float(*rho),
                float(x.rho),
                pct(x.saving_vs_picard)
            );
        }
    }
    let measured: Vec<String> = solver
        .iter()
        .filter(|s| s.solver == "anderson")
        .map(|s| format!("{} at δ = {}", pct(s.compute_saved_vs_picard), s.tol))
        .collect();
    format!(
        "Map evaluations of each solver to relative residual {tol:e} on `z = A z + b` (A symmetric, eigenvalues evenly \
         over [−ρ, ρ], dimension {}, {} right-hand sides; `elm sweep`), against ρ:\n\n{}\nThe trained maps of table 7b on that axis:\n\n{marks}\n\
         On the real module (table 3) Anderson saved {} of the block evaluations. On this problem Anderson first saves \
         at least the paper's 38.6% of compute at ρ = {}: a trained map well below that ρ leaves acceleration little \
         to save, whatever the solver.\n",
        r.config.dim,
        r.config.batch,
        t.into_markdown(),
        if measured.is_empty() {
            NOT_APPLICABLE.to_string()
        } else {
            measured.join(", ")
        },
        r.config
            .rhos
            .iter()
            .copied()
            .find(|&rho| at(rho, "anderson").is_some_and(|x| x.saving_vs_picard >= 0.386))
            .map_or_else(|| "none of the swept values".to_string(), float)
    )
}

/// A section: our table, then the paper's figure it mirrors.
fn section(title: &str, ours: &str, paper: &str) -> String {
    format!("## {title}\n\n{ours}\n**Paper:** {paper}\n\n")
}

fn dense_nll(t: &Tables) -> Option<f64> {
    t.main
        .iter()
        .find(|r| r.kind == "dense")
        .map(|r| r.answer_nll.value)
}

/// The headline: the ELM against the dense model and the best baseline.
fn headline(t: &Tables) -> String {
    let dense = t.main.iter().find(|r| r.kind == "dense");
    let elm = t.main.iter().find(|r| r.model == MAIN_ELM_ROW);
    let best = t
        .main
        .iter()
        .filter(|r| !r.kind.starts_with("dense") && !r.kind.starts_with("ELM"))
        .min_by(|a, b| a.answer_nll.value.total_cmp(&b.answer_nll.value));
    match (dense, elm) {
        (Some(d), Some(e)) => {
            let mut s = format!(
                "**Headline ({} scale, {}):** the ELM removes {} of the dense model's parameters ({} non-embedding) and {} of its KV cache; \
                 its answer NLL is {} vs the LoRA-tuned dense model's {} (Δ {}, perplexity {:.2} vs {:.2}), flexible exact match {} vs {} (RP {}).",
                t.scale,
                model_label(&t.model),
                pct(1.0 - e.params as f64 / d.params as f64),
                pct(1.0 - e.non_embedding_params as f64 / d.non_embedding_params as f64),
                pct(1.0 - e.kv_bytes_1k as f64 / d.kv_bytes_1k as f64),
                iv(&e.answer_nll),
                iv(&d.answer_nll),
                opt(&e.delta_nll, signed),
                e.answer_nll.value.exp(),
                d.answer_nll.value.exp(),
                iv(&e.flexible_em),
                iv(&d.flexible_em),
                opt(&e.rp_flexible, iv),
            );
            if let Some(b) = best {
                s += &format!(
                    " Best other compressed model: {} ({}), answer NLL {}; its NLL minus the ELM's, paired over the same problems: {}.",
                    b.model,
                    b.kind,
                    iv(&b.answer_nll),
                    opt(&b.delta_nll_vs_elm, signed)
                );
            }
            if let Some(w) = &t.same_window {
                if let Some(r) = t.main.iter().find(|r| r.model == w.elm) {
                    let b = t.main.iter().find(|r| r.model == w.baseline);
                    s += &format!(
                        " Method against method at one window: trained with the same budget on layers {}–{} (the layers {} removes), \
                         the ELM reaches answer NLL {} (Δ vs the tuned dense model {}) against that baseline's {}; the baseline's NLL minus this ELM's, paired: {}.",
                        w.layers.0,
                        w.layers.1,
                        w.baseline,
                        iv(&r.answer_nll),
                        opt(&r.delta_nll, signed),
                        b.map_or_else(|| "n/a".to_string(), |b| iv(&b.answer_nll)),
                        signed(&w.delta_baseline_minus_elm),
                    );
                }
            }
            if let Some(h) = &t.healed_elm {
                if let Some(r) = t.main.iter().find(|r| r.model == h.healed) {
                    s += &format!(
                        " ELM + heal (a row no paper has; the module and a LoRA heal of the layers after the window trained together, same budget) on layers {}–{}: answer NLL {}; minus the plain ELM's at that window, paired: {}{}.",
                        h.layers.0,
                        h.layers.1,
                        iv(&r.answer_nll),
                        signed(&h.healed_minus_plain),
                        match (&h.baseline, &h.baseline_minus_healed) {
                            (Some(b), Some(d)) => format!("; {b} minus it: {}", signed(d)),
                            _ => String::new(),
                        }
                    );
                }
            }
            if let Some(v) = t.curves.as_ref().and_then(curves_verdict) {
                s += &format!(
                    " Learning curves (table 8): {}",
                    v.trim_start_matches("**Verdict:** ")
                );
            }
            if let Some(seeds) = &t.seeds {
                for r in &seeds.summaries {
                    if let Some(g) = &r.minus_elm {
                        s += &format!(
                            " Over {} seeds, {} minus {}: {} ± {} (sd): {}.",
                            g.n,
                            r.series,
                            seeds.reference,
                            signed_float(g.mean),
                            float(g.sd),
                            r.verdict
                        );
                    }
                }
            }
            s + "\n\n"
        }
        _ => "The main-results table was not computed in this run (`--only`).\n\n".into(),
    }
}

/// `OUT/README.md`.
pub fn readme(t: &Tables, plots_ok: (bool, bool, bool)) -> String {
    let mut s = format!(
        "# ELM study — `{}` scale\n\nRegenerated by `paper_repro --scale {}` (the main job: `bash scripts/main.sh`); \
         every figure below comes from `tables.json` of the same run. Model: {}. Compute time of the run's {} distinct \
         stages on this machine: {}. Last invocation: {} ({} stages, {} computed, {} read from the stage cache).\n\n",
        t.scale,
        t.scale,
        model_label(&t.model),
        t.stages.iter().map(|s| &s.key).collect::<std::collections::BTreeSet<_>>().len(),
        seconds(unique_stage_seconds(t)),
        seconds(t.seconds),
        t.stages.len(),
        t.stages.iter().filter(|s| !s.cached).count(),
        t.stages.iter().filter(|s| s.cached).count(),
    );
    s += &headline(t);
    s += &format!(
        "Budgets: main results {}; ablations {} (see `tables.json` → `limits`). Quality: GSM8K test answer NLL \
         (teacher-forced, nats/token, the primary signal at 135M) and exact match (greedy; strict `#### N` / flexible last number). \
         Brackets are 95% bootstrap intervals over problems; Δ and RP are paired over the same problems (↑/↓: the interval excludes 0).\n\n",
        budget(&t.limits["main"]),
        budget(&t.limits["study"]),
    );
    s += &section(
        "Table 1 — Main results (paper: main table / `assets/performance.png`)",
        &nonempty(&t.main, main_table),
        paper::MAIN,
    );
    s += &section(
        "Table 2 — One-step vs multi-step KV (paper: one-step KV ablation)",
        &format!(
            "KV bytes are those the decoding session allocated for one GSM8K question (prompt + new tokens + 1 positions); the dense \
             figure is N × the measured per-layer bytes. Quality: exact match of greedy decoding (teacher-forced NLL does not use the cache).\n\n{}",
            nonempty(&t.kv, kv_table)
        ),
        paper::KV,
    );
    let solver_plot = if plots_ok.0 {
        "\n![solver ablation](plots/solver_ablation.svg)\n"
    } else {
        ""
    };
    s += &section(
        "Table 3 — Solver ablation (paper: solver comparison and early-exit threshold)",
        &format!(
            "Main ELM, teacher-forced GSM8K answer NLL; δ is the per-token absolute residual tolerance, at most 16 iterations. Iterations \
             are those of the whole-sequence solve (every position iterated together, as in training), block evaluations per token are \
             the fixed-point block's applications per token.\n\n{}{solver_plot}",
            nonempty(&t.solver, solver_table)
        ),
        paper::SOLVERS,
    );
    s += &section(
        "Table 4 — Gradient rules (paper: SJFB ablation)",
        &format!(
            "Same ELM, data, steps, optimiser and seed; only the gradient rule differs. Peak RSS: the training process's VmHWM (measured, \
             evaluation of the held-out loss included). Every rule reads the same cached teacher states.\n\n{}",
            nonempty(&t.grad, grad_table)
        ),
        paper::GRAD,
    );
    let sweep_plot = if plots_ok.1 {
        "\n![compression sweep](plots/compression_sweep.svg)\n"
    } else {
        ""
    };
    s += &section(
        "Table 5 — Compression sweep (paper: ratio column of the main table)",
        &format!("ELM (ablation budget, Anderson δ = 0.5) and the strongest training-free baseline of table 1 at each M.\n\n{}{sweep_plot}", nonempty(&t.sweep, sweep_table)),
        paper::SWEEP,
    );
    s += &section(
        "Table 6 — Where to prune (paper: GPPO start-layer study)",
        &t.where_to_prune.as_ref().map_or_else(
            || "Not computed in this run (`--only` selected other tables).\n".to_string(),
            |w| where_table(w, &t.limits["search"]) + &trained_windows_table(&t.trained_windows, w),
        ),
        paper::WHERE,
    );
    let rho = t.rho_sweep.as_ref().map_or_else(String::new, |r| {
        format!(
            "\n**Table 7c — when acceleration pays.** {}\n![rho sweep](plots/rho_sweep.svg)\n",
            rho_sweep_table(r, &t.solver)
        )
    });
    s += &section(
        "Table 7 — Fixed-point solvers on canonical problems, and the spectral radius of the trained maps",
        &format!(
            "{}\nρ(∂φ/∂z) at z* (power iteration on central-difference Jacobian-vector products, 30 iterations, GSM8K test sequences):\n\n{}{rho}",
            nonempty(&t.canonical, canonical_table),
            nonempty(&t.spectral, spectral_table)
        ),
        paper::SPECTRAL,
    );
    if let Some(c) = &t.curves {
        let plots = if plots_ok.2 {
            "\n![learning curves, tokens](plots/curves_tokens.svg)\n![learning curves, compute](plots/curves_seconds.svg)\n"
        } else {
            ""
        };
        s += &section(
            "Table 8 — Learning curves (no counterpart in the paper)",
            &format!("{}{plots}", curves_table(c)),
            paper::CURVES,
        );
    }
    if let Some(seeds) = &t.seeds {
        s += &section(
            "Table 9 — Seeds of the headline rows (no counterpart in the paper)",
            &seeds_table(seeds),
            paper::SEEDS,
        );
    }
    s += &format!(
        "## Training throughput\n\nMeasured tokens/s of every training of this run (steps of this invocation; a cached training shows the run that \
         computed it). {}\n\n{}\n",
        t.bench.as_ref().map_or_else(
            || "No benchmark at this scale.".to_string(),
            |b| format!(
                "`elm bench` on this machine: sgemm {} GFLOP/s, dense prefill {} tok/s ({} GFLOP/s), decode batch 1 {} tok/s. A training token costs the teacher's forward over layers [0, l + M) (skipped on a teacher-cache hit), the solve and the taped backward of the module, and after half of training the back layers and LM head with their backward: expressed in dense-forward FLOPs it is a lower bound on the work done.",
                float(b.sgemm_gflop_s), float(b.prefill_tok_s), float(b.prefill_gflop_s), float(b.decode_b1_tok_s)
            )
        ),
        nonempty(&t.speed, |r| speed_table(r, &t.bench))
    );
    s += paper::SCALES;
    s
}

fn budget(v: &serde_json::Value) -> String {
    format!(
        "{} steps × batch {} × {} tokens",
        v["steps"], v["batch_size"], v["seq_len"]
    )
}

fn nonempty<T>(rows: &[T], f: impl Fn(&[T]) -> String) -> String {
    if rows.is_empty() {
        "Not computed in this run (`--only` selected other tables).\n".into()
    } else {
        f(rows)
    }
}

/// Writes the plots (when their tables exist); returns which were written (solvers, sweep,
/// learning curves).
pub fn plots(t: &Tables, dir: &Path) -> Result<(bool, bool, bool), ReproError> {
    std::fs::create_dir_all(dir).map_err(|e| ReproError::io(dir, e))?;
    let c = t.curves.as_ref().filter(|c| !c.points.is_empty());
    if let Some(c) = c {
        plot_curves(
            c,
            |p| p.tokens as f64,
            "training tokens",
            &dir.join("curves_tokens.svg"),
        )?;
        plot_curves(
            c,
            |p| p.compute_seconds,
            "compute seconds",
            &dir.join("curves_seconds.svg"),
        )?;
    }
    let Some(d) = dense_nll(t) else {
        return Ok((false, false, c.is_some()));
    };
    let a = !t.solver.is_empty();
    if a {
        plot_solvers(&t.solver, d, &dir.join("solver_ablation.svg"))?;
    }
    let b = !t.sweep.is_empty();
    if b {
        plot_sweep(&t.sweep, d, &dir.join("compression_sweep.svg"))?;
    }
    Ok((a, b, c.is_some()))
}

/// Table 6: each selector's window placed in the enumeration of trained windows.
fn where_table(w: &WhereToPrune, budget: &serde_json::Value) -> String {
    let mut s = format!(
        "On the LoRA-tuned dense model, M = {}. Enumeration: every start ≡ 0 mod {} (and the last) trained {} steps as a GPPO candidate \
         (projection + LoRA on the kept layer, fixed iterations), scored by held-out answer NLL on {} GSM8K test problems \
         (dense: {}); GPPO: {} steps. Rank 1 is the enumeration's best window; the gap is that window's NLL minus the best's.\n\n\
         | selector | chosen start (layers) | best enumerated start by the selector's own score | its rank of {} | its NLL gap (nats/token) |\n|---|---|---|---|---|\n",
        w.num_replaced,
        budget["enum_every"],
        budget["enum_steps"],
        budget["enum_eval"],
        float(w.dense_nll),
        budget["gppo_steps"],
        w.enum_ranking.len(),
    );
    let mut row = |p: &elm::search::report::Placement| {
        s += &format!(
            "| {} | {} ([{}, {})) | {} | {} | {} |\n",
            p.method,
            p.choice,
            p.choice,
            p.choice + w.num_replaced,
            p.choice_on_grid,
            p.enum_rank,
            float(p.nll_gap)
        );
    };
    if let Some(g) = &w.gppo {
        row(g);
    }
    for p in &w.metrics {
        row(p);
    }
    match w.gppo_spearman {
        Some(r) => {
            s += &format!(
                "\nSpearman ρ between GPPO's policy logits and −NLL over the enumerated starts: {}.\n",
                float(r)
            )
        }
        None if w.gppo.is_some() => {
            s += "\nGPPO's policy is still uniform (fewer steps than one policy update): its choice is the first of tied starts, \
                  and no rank correlation exists.\n"
        }
        None => {}
    }
    let mut by_start = w.enum_nll.clone();
    by_start.sort_by_key(|e| e.0);
    s += &format!(
        "\nEnumerated answer NLL by start: {}.\n\n![where to prune](plots/where_to_prune.svg)\n",
        by_start
            .iter()
            .map(|(st, n)| format!("{st}: {}", float(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    s
}

/// Table 6's check: do the enumeration's short candidates rank fully trained ELMs?
fn trained_windows_table(rows: &[TrainedWindow], w: &WhereToPrune) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\nFully trained ELMs (the main results' budget, Anderson δ = 0.5) at the windows the pipeline considers, against the rank \
         the enumeration's short candidates gave their start (of {}):\n\n| start (layers) | why this window | answer NLL | enumeration rank |\n|---|---|---|---|\n",
        w.enum_ranking.len()
    );
    let mut sorted = rows.to_vec();
    sorted.sort_by(|a, b| a.answer_nll.value.total_cmp(&b.answer_nll.value));
    for r in &sorted {
        s += &format!(
            "| {} ([{}, {})) | {} | {} | {} |\n",
            r.start,
            r.start,
            r.start + w.num_replaced,
            r.why,
            iv(&r.answer_nll),
            r.enum_rank
                .map_or_else(|| "not enumerated".to_string(), |k| k.to_string())
        );
    }
    s
}

pub const HEADLINE_BEGIN: &str = "<!-- headline:begin -->";
pub const HEADLINE_END: &str = "<!-- headline:end -->";

/// The headline and table 1 of a run, for the repository README (`--readme`).
pub fn headline_block(t: &Tables, full: &Path) -> String {
    format!(
        "{HEADLINE_BEGIN}\n*Written by `paper_repro --scale {}`: {} stages that took {} to compute on this machine \
         (this invocation computed {} of them); all tables: [{}]({}).*\n\n{}{}{HEADLINE_END}",
        t.scale,
        t.stages.len(),
        seconds(unique_stage_seconds(t)),
        t.stages.iter().filter(|s| !s.cached).count(),
        full.file_name().map_or("README.md".into(), |f| f.to_string_lossy().to_string()),
        full.parent()
            .and_then(|p| p.file_name())
            .map_or_else(|| "README.md".to_string(), |d| format!("{}/README.md", d.to_string_lossy())),
        headline(t),
        nonempty(&t.main, main_table),
    )
}

/// Compute seconds of the distinct stages of a run (a stage read twice counts once).
fn unique_stage_seconds(t: &Tables) -> f64 {
    let mut seen = std::collections::BTreeSet::new();
    t.stages
        .iter()
        .filter(|s| seen.insert(&s.key))
        .map(|s| s.seconds)
        .sum()
}

/// `text` with its headline block replaced by `block` (`None` when it has none).
pub fn replace_headline_block(text: &str, block: &str) -> Option<String> {
    replace_block(text, HEADLINE_BEGIN, HEADLINE_END, block)
}

/// `text` with the span from `begin` to `end` (markers included) replaced by `block`.
pub fn replace_block(text: &str, begin: &str, end: &str, block: &str) -> Option<String> {
    let start = text.find(begin)?;
    let stop = text[start..].find(end)? + start + end.len();
    Some(format!("{}{block}{}", &text[..start], &text[stop..]))
}

/// Markers of the block a `long` run writes into the repository's README (the headline block
/// stays the main job's).
pub const LONG_BEGIN: &str = "<!-- long:begin -->";
pub const LONG_END: &str = "<!-- long:end -->";

/// The `long` run's block: its compute time, the curves' verdict and trends, the seeds'
/// summary; `link` is the run's README relative to the repository's.
pub fn long_block(t: &Tables, link: &str) -> String {
    let mut s = format!(
        "{LONG_BEGIN}\n*Written by `paper_repro --scale long`: {} stages that took {} to compute on this machine \
         (this invocation computed {} of them); all tables: [{link}]({link}).*\n\n",
        t.stages.len(),
        seconds(unique_stage_seconds(t)),
        t.stages.iter().filter(|s| !s.cached).count(),
    );
    if let Some(c) = &t.curves {
        s += &curves_table(c);
        s += "\n";
    }
    if let Some(seeds) = &t.seeds {
        s += &seeds_table(seeds);
        s += "\n";
    }
    s + LONG_END
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headline_block_is_replaced_in_place_and_only_there() {
        let text = format!("intro\n{HEADLINE_BEGIN}\nold\n{HEADLINE_END}\nrest\n");
        let new =
            replace_headline_block(&text, &format!("{HEADLINE_BEGIN}new{HEADLINE_END}")).unwrap();
        assert_eq!(
            new,
            format!("intro\n{HEADLINE_BEGIN}new{HEADLINE_END}\nrest\n")
        );
        assert!(replace_headline_block("no block", "x").is_none());
    }

    #[test]
    fn signed_interval_marks_sure_differences() {
        let i = Interval {
            value: 0.2,
            lo: 0.1,
            hi: 0.3,
        };
        assert_eq!(signed(&i), "+0.200 [+0.100, +0.300] ↑");
        let i = Interval {
            value: -0.2,
            lo: -0.3,
            hi: 0.1,
        };
        assert_eq!(signed(&i), "-0.200 [-0.300, +0.100]");
    }

    #[test]
    fn bounds_pad_and_handle_single_values() {
        let (lo, hi) = bounds(&[1.0, 3.0]);
        assert!(lo < 1.0 && hi > 3.0);
        let (lo, hi) = bounds(&[2.0]);
        assert!(lo < 2.0 && hi > 2.0);
    }
}
