//! The SVG plots of a run (plotters): the solver ablation, the compression sweep and the
//! learning curves, each point with its 95% interval. Table 6's and 7c's plots are `elm`'s own
//! and only copied by the study.

use std::ops::Range;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::element::ErrorBar;
use plotters::prelude::*;

use crate::elm_cli::SOLVERS;
use crate::error::ReproError;
use crate::markdown::count;
use crate::rows::{CurvePoint, Curves, Interval, SolverRow, SweepRow};
use crate::tables::Tables;

/// Writes the plots (when their tables exist); returns which were written (solvers, sweep,
/// learning curves).
pub fn write(t: &Tables, dir: &Path) -> Result<(bool, bool, bool), ReproError> {
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
    let Some(d) = t.reference_row().map(|r| r.answer_nll.value) else {
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

fn plot_err(path: &Path, e: impl std::fmt::Display) -> ReproError {
    ReproError::io(path, std::io::Error::other(e.to_string()))
}

/// The drawing surface of every plot here: answer NLL (y) against a continuous x.
type NllChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One SVG of answer NLL, in the frame every plot shares (white, captioned, the same margins):
/// `draw` configures the axes' mesh and draws the series, then the legend is placed at
/// `legend` and the file written.
fn nll_plot(
    path: &Path,
    size: (u32, u32),
    caption: &str,
    (x, y): (Range<f64>, Range<f64>),
    legend: SeriesLabelPosition,
    draw: impl FnOnce(&mut NllChart<'_, '_>) -> Result<(), ReproError>,
) -> Result<(), ReproError> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(|e| plot_err(path, e))?;
    draw(&mut chart)?;
    chart
        .configure_series_labels()
        .position(legend)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// The y axis of answer NLL: every interval (and the dense line, when there is one) inside it,
/// with room above for the legend.
fn nll_axis<'a>(nll: impl Iterator<Item = &'a Interval>, dense_nll: Option<f64>) -> Range<f64> {
    let ys: Vec<f64> = nll.flat_map(|i| [i.lo, i.hi]).chain(dense_nll).collect();
    let (y0, y1) = with_legend_room(bounds(&ys));
    y0..y1
}

/// The tuned dense model's answer NLL as a black line across the whole x axis.
fn draw_dense_line(
    chart: &mut NllChart<'_, '_>,
    (x0, x1): (f64, f64),
    dense_nll: f64,
    path: &Path,
) -> Result<(), ReproError> {
    chart
        .draw_series(LineSeries::new(
            vec![(x0, dense_nll), (x1, dense_nll)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| plot_err(path, e))?
        .label("dense")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
    Ok(())
}

/// Compute (fixed-point block evaluations per token) vs answer NLL, one line per solver.
pub fn plot_solvers(rows: &[SolverRow], dense_nll: f64, path: &Path) -> Result<(), ReproError> {
    let xs: Vec<f64> = rows.iter().map(|r| r.block_evals_per_token).collect();
    let (x0, x1) = bounds(&xs);
    let y = nll_axis(rows.iter().map(|r| &r.answer_nll), Some(dense_nll));
    nll_plot(
        path,
        (720, 440),
        "Solver ablation: compute vs quality (main ELM)",
        (x0..x1, y),
        SeriesLabelPosition::UpperRight,
        |chart| {
            chart
                .configure_mesh()
                .x_desc("fixed-point block evaluations per token")
                .y_desc("answer NLL (nats/token)")
                .draw()
                .map_err(|e| plot_err(path, e))?;
            let colors = [RED, BLUE, GREEN];
            for (i, solver) in SOLVERS.iter().enumerate() {
                let mut pts: Vec<(f64, &Interval)> = rows
                    .iter()
                    .filter(|r| r.solver == *solver)
                    .map(|r| (r.block_evals_per_token, &r.answer_nll))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let c = colors[i % colors.len()];
                draw_estimates(chart, &pts, c, solver, path)?;
            }
            draw_dense_line(chart, (x0, x1), dense_nll, path)
        },
    )
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
    let y = nll_axis(rows.iter().map(|r| &r.answer_nll), Some(dense_nll));
    nll_plot(
        path,
        (720, 440),
        "Compression sweep: quality vs replaced layers M",
        (x0..x1, y),
        SeriesLabelPosition::UpperLeft,
        |chart| {
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
                draw_estimates(chart, &pts, c, method, path)?;
            }
            draw_dense_line(chart, (x0, x1), dense_nll, path)
        },
    )
}

/// One labelled line through the estimates, each point with its 95% interval as an error bar.
fn draw_estimates(
    chart: &mut NllChart<'_, '_>,
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

/// Answer NLL against the log2 of `x` (training tokens or compute seconds), one line per model.
pub fn plot_curves(
    c: &Curves,
    x_of: fn(&CurvePoint) -> f64,
    x_desc: &str,
    path: &Path,
) -> Result<(), ReproError> {
    let xs: Vec<f64> = c.points.iter().map(|p| x_of(p).max(1.0).log2()).collect();
    let (x0, x1) = bounds(&xs);
    let y = nll_axis(c.points.iter().map(|p| &p.answer_nll), None);
    nll_plot(
        path,
        (760, 480),
        &format!("Learning curves: answer NLL vs {x_desc}"),
        (x0..x1, y),
        SeriesLabelPosition::UpperRight,
        |chart| {
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
                draw_estimates(chart, &pts, colors[i % colors.len()], name, path)?;
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_pad_and_handle_single_values() {
        let (lo, hi) = bounds(&[1.0, 3.0]);
        assert!(lo < 1.0 && hi > 3.0);
        let (lo, hi) = bounds(&[2.0]);
        assert!(lo < 2.0 && hi > 2.0);
    }
}
