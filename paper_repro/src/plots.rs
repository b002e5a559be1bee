//! The SVG plots of a run (plotters): the solver ablation, the compression sweep and the
//! learning curves, each point with its 95% interval. Table 6's and 7c's plots are `elm`'s own
//! and only copied by the study.

use std::ops::Range;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::element::{DashedPathElement, ErrorBar};
use plotters::prelude::*;

use crate::elm_cli::SOLVERS;
use crate::error::ReproError;
use crate::markdown::count;
use crate::rows::{
    CurvePoint, Curves, FullyTrained, Grid, GridDepth, Interval, SolverRow, SweepRow, TrainedStart,
};
use crate::tables::{Tables, Written};
use elm::search::report::WhereToPrune;

/// Writes the plots whose tables exist.
pub fn write(t: &Tables, dir: &Path) -> Result<Written, ReproError> {
    std::fs::create_dir_all(dir).map_err(|e| ReproError::io(dir, e))?;
    let mut w = Written::default();
    if let Some(c) = t.curves.as_ref().filter(|c| !c.points.is_empty()) {
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
        w.curves = true;
    }
    if let (Some(f), Some(wp)) = (&t.fully_trained, &t.where_to_prune) {
        if !f.starts.is_empty() {
            plot_fully_trained(f, wp, &dir.join("where_to_prune_trained.svg"))?;
            w.fully_trained = true;
        }
    }
    let Some(d) = t.reference_row().map(|r| r.answer_nll.value) else {
        return Ok(w);
    };
    if !t.solver.is_empty() {
        plot_solvers(&t.solver, d, &dir.join("solver_ablation.svg"))?;
        w.solvers = true;
    }
    if !t.sweep.is_empty() {
        plot_sweep(&t.sweep, d, &dir.join("compression_sweep.svg"))?;
        w.sweep = true;
    }
    if let Some(g) = t.grid.as_ref().filter(|g| !g.rows.is_empty()) {
        plot_grid(g, &dir.join("train_k_test_k.svg"))?;
        w.grid = true;
    }
    Ok(w)
}

/// Table 11: test answer NLL against block evaluations per token, one line per trained
/// module through its fixed test depths (K' = 1, 2, …), its solved cells as separate points.
pub fn plot_grid(g: &Grid, path: &Path) -> Result<(), ReproError> {
    let xs: Vec<f64> = g
        .rows
        .iter()
        .map(|r| r.block_evals_per_token.max(1.0).log2())
        .collect();
    let (x0, x1) = bounds(&xs);
    let y = nll_axis(g.rows.iter().map(|r| &r.answer_nll), None);
    let mut trained: Vec<GridDepth> = vec![];
    for r in &g.rows {
        if !trained.contains(&r.trained) {
            trained.push(r.trained);
        }
    }
    nll_plot(
        path,
        (720, 440),
        "Train-K × test-K: test NLL against compute",
        (x0..x1, y),
        |chart| {
            chart
                .configure_mesh()
                .x_desc("log2 of block evaluations per token")
                .y_desc("answer NLL (nats/token)")
                .draw()
                .map_err(|e| plot_err(path, e))?;
            let mut entries = vec![];
            for (i, t) in trained.iter().enumerate() {
                let l = look(i);
                let mut pts: Vec<(f64, &Interval)> = g
                    .rows
                    .iter()
                    .filter(|r| r.trained == *t && matches!(r.tested, GridDepth::Fixed(_)))
                    .map(|r| (r.block_evals_per_token.max(1.0).log2(), &r.answer_nll))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                draw_estimates(chart, &pts, l, path)?;
                // The solved cells: the same colour, a larger marker, no line.
                let solved: Vec<(f64, f64)> = g
                    .rows
                    .iter()
                    .filter(|r| r.trained == *t && matches!(r.tested, GridDepth::Solved { .. }))
                    .map(|r| (r.block_evals_per_token.max(1.0).log2(), r.answer_nll.value))
                    .collect();
                chart
                    .draw_series(
                        solved
                            .iter()
                            .map(|&(x, y)| Circle::new((x, y), 7, l.color.stroke_width(2))),
                    )
                    .map_err(|e| plot_err(path, e))?;
                entries.push(LegendEntry {
                    label: format!(
                        "trained {} (line: tested at K'; open circles: solved, δ = 0.5 and 0.1)",
                        crate::table_markdown::depth_label(t)
                    ),
                    look: l,
                });
            }
            Ok(entries)
        },
    )
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> ReproError {
    ReproError::io(path, std::io::Error::other(e.to_string()))
}

/// The drawing surface of every plot here: answer NLL (y) against a continuous x.
type NllChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Marker shapes, so that series drawn on top of each other (solvers that agree) stay
/// distinguishable in print and for readers who do not tell the colours apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
}

/// How one series is drawn: colour, marker and line pattern.
#[derive(Clone, Copy, Debug)]
struct Look {
    color: RGBColor,
    marker: Option<Marker>,
    dashed: bool,
}

/// The looks of a plot's series in order: colour, marker and dash pattern all change from one
/// to the next.
fn look(i: usize) -> Look {
    const COLORS: [RGBColor; 6] = [
        RGBColor(200, 30, 30),
        RGBColor(30, 70, 200),
        RGBColor(20, 140, 60),
        RGBColor(150, 40, 160),
        RGBColor(230, 140, 0),
        RGBColor(0, 150, 170),
    ];
    const MARKERS: [Marker; 4] = [
        Marker::Circle,
        Marker::Triangle,
        Marker::Square,
        Marker::Cross,
    ];
    Look {
        color: COLORS[i % COLORS.len()],
        marker: Some(MARKERS[i % MARKERS.len()]),
        dashed: i % 2 == 1,
    }
}

/// The tuned dense model's look: a plain black line.
const DENSE_LOOK: Look = Look {
    color: BLACK,
    marker: None,
    dashed: false,
};

/// One legend line: the series' look and its label.
struct LegendEntry {
    label: String,
    look: Look,
}

/// Width in pixels of the legend column right of the plot, outside the data.
const LEGEND_WIDTH: u32 = 250;

/// One SVG of answer NLL, in the frame every plot shares (white, captioned, the same margins):
/// `draw` configures the axes' mesh, draws the series and returns their legend entries, which
/// go in a column right of the plotting area so that no legend covers data.
fn nll_plot(
    path: &Path,
    size: (u32, u32),
    caption: &str,
    (x, y): (Range<f64>, Range<f64>),
    draw: impl FnOnce(&mut NllChart<'_, '_>) -> Result<Vec<LegendEntry>, ReproError>,
) -> Result<(), ReproError> {
    let root = SVGBackend::new(path, (size.0 + LEGEND_WIDTH, size.1)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let root = root
        .titled(caption, ("sans-serif", 18))
        .map_err(|e| plot_err(path, e))?;
    let (plot_area, legend_area) = root.split_horizontally(size.0);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(|e| plot_err(path, e))?;
    let entries = draw(&mut chart)?;
    draw_legend(&legend_area, &entries, path)?;
    root.present().map_err(|e| plot_err(path, e))
}

/// The legend column: a note on the bars, then one line sample, marker and label per entry.
fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    entries: &[LegendEntry],
    path: &Path,
) -> Result<(), ReproError> {
    let font = ("sans-serif", 13).into_font();
    let mut y = 24;
    area.draw(&Text::new(
        "bars: 95% intervals",
        (8, y - 6),
        font.clone().color(&BLACK.mix(0.7)),
    ))
    .map_err(|e| plot_err(path, e))?;
    for e in entries {
        y += 22;
        let style = e.look.color.stroke_width(2);
        if e.look.dashed {
            area.draw(&DashedPathElement::new(vec![(8, y), (40, y)], 6, 4, style))
        } else {
            area.draw(&PathElement::new(vec![(8, y), (40, y)], style))
        }
        .map_err(|err| plot_err(path, err))?;
        if let Some(m) = e.look.marker {
            let at = EmptyElement::at((24, y));
            let fill = e.look.color.filled();
            match m {
                Marker::Circle => area.draw(&(at + Circle::new((0, 0), 4, fill))),
                Marker::Triangle => area.draw(&(at + TriangleMarker::new((0, 0), 5, fill))),
                Marker::Square => area.draw(&(at + Rectangle::new([(-4, -4), (4, 4)], fill))),
                Marker::Cross => {
                    area.draw(&(at + Cross::new((0, 0), 4, e.look.color.stroke_width(2))))
                }
            }
            .map_err(|err| plot_err(path, err))?;
        }
        for (k, line) in wrap(&e.label, LEGEND_CHARS).iter().enumerate() {
            if k > 0 {
                y += 15;
            }
            area.draw(&Text::new(line.clone(), (48, y - 7), font.clone()))
                .map_err(|err| plot_err(path, err))?;
        }
    }
    Ok(())
}

/// Characters of a legend line that fit [`LEGEND_WIDTH`] at the legend's font size.
const LEGEND_CHARS: usize = 30;

/// `text` broken at spaces into lines of at most `width` characters (a longer word keeps its
/// own line).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = vec![];
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(l) if l.chars().count() + 1 + word.chars().count() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// The y axis of answer NLL: every interval (and the dense line, when there is one) inside it,
/// with a 5% margin; the legend is outside, so no room is kept for it.
fn nll_axis<'a>(nll: impl Iterator<Item = &'a Interval>, dense_nll: Option<f64>) -> Range<f64> {
    let ys: Vec<f64> = nll.flat_map(|i| [i.lo, i.hi]).chain(dense_nll).collect();
    let (y0, y1) = bounds(&ys);
    y0..y1
}

/// The tuned dense model's answer NLL as a black line across the whole x axis.
fn draw_dense_line(
    chart: &mut NllChart<'_, '_>,
    (x0, x1): (f64, f64),
    dense_nll: f64,
    path: &Path,
) -> Result<LegendEntry, ReproError> {
    chart
        .draw_series(LineSeries::new(
            vec![(x0, dense_nll), (x1, dense_nll)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| plot_err(path, e))?;
    Ok(LegendEntry {
        label: format!("LoRA-tuned dense ({dense_nll:.3})"),
        look: DENSE_LOOK,
    })
}

/// Integer tick labels only (whole layers, whole doublings): other positions get none.
fn integer_label(x: &f64) -> String {
    if (x - x.round()).abs() < 1e-6 {
        format!("{:.0}", x)
    } else {
        String::new()
    }
}

/// Compute (fixed-point block evaluations per token) vs answer NLL, one line per solver
/// through its tolerances, each point labelled with its δ.
pub fn plot_solvers(rows: &[SolverRow], dense_nll: f64, path: &Path) -> Result<(), ReproError> {
    let xs: Vec<f64> = rows.iter().map(|r| r.block_evals_per_token).collect();
    let (x0, x1) = bounds(&xs);
    let y = nll_axis(rows.iter().map(|r| &r.answer_nll), Some(dense_nll));
    nll_plot(
        path,
        (720, 440),
        "Solver ablation: compute vs quality",
        (x0..x1, y),
        |chart| {
            chart
                .configure_mesh()
                .x_desc("fixed-point block evaluations per token (count)")
                .y_desc("answer NLL (nats/token)")
                .draw()
                .map_err(|e| plot_err(path, e))?;
            let mut ms: Vec<usize> = rows.iter().map(|r| r.m).collect();
            ms.sort_unstable();
            ms.dedup();
            let mut entries = vec![];
            let series = ms
                .iter()
                .flat_map(|&m| SOLVERS.iter().map(move |&solver| (m, solver)));
            for (i, (m, solver)) in series.enumerate() {
                let mut pts: Vec<(f64, &Interval, f64)> = rows
                    .iter()
                    .filter(|r| r.solver == solver && r.m == m)
                    .map(|r| (r.block_evals_per_token, &r.answer_nll, r.tol))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let l = look(i);
                let est: Vec<(f64, &Interval)> = pts.iter().map(|p| (p.0, p.1)).collect();
                draw_estimates(chart, &est, l, path)?;
                // δ beside each point, staggered per series so coinciding points stay legible.
                let font = ("sans-serif", 11).into_font().color(&l.color);
                let lift = -16 - 12 * (i % SOLVERS.len()) as i32;
                chart
                    .draw_series(pts.iter().map(|(x, e, tol)| {
                        EmptyElement::at((*x, e.value))
                            + Text::new(format!("δ={tol}"), (6, lift), font.clone())
                    }))
                    .map_err(|e| plot_err(path, e))?;
                entries.push(LegendEntry {
                    label: format!("{solver}, M = {m} (points: δ, per-token residual)"),
                    look: l,
                });
            }
            entries.push(draw_dense_line(chart, (x0, x1), dense_nll, path)?);
            Ok(entries)
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
        |chart| {
            chart
                .configure_mesh()
                .x_labels(m1 - m0 + 2)
                .x_label_formatter(&integer_label)
                .x_desc("replaced layers M (count)")
                .y_desc("answer NLL (nats/token)")
                .draw()
                .map_err(|e| plot_err(path, e))?;
            let mut methods: Vec<String> = rows.iter().map(|r| r.method.clone()).collect();
            methods.sort();
            methods.dedup();
            let mut entries = vec![];
            for (i, method) in methods.iter().enumerate() {
                let pts: Vec<(f64, &Interval)> = rows
                    .iter()
                    .filter(|r| &r.method == method)
                    .map(|r| (r.m as f64, &r.answer_nll))
                    .collect();
                draw_estimates(chart, &pts, look(i), path)?;
                entries.push(LegendEntry {
                    label: method.clone(),
                    look: look(i),
                });
            }
            entries.push(draw_dense_line(chart, (x0, x1), dense_nll, path)?);
            Ok(entries)
        },
    )
}

/// One line through the estimates in `look`, each point with its 95% interval as an error bar
/// and the look's marker.
fn draw_estimates(
    chart: &mut NllChart<'_, '_>,
    pts: &[(f64, &Interval)],
    look: Look,
    path: &Path,
) -> Result<(), ReproError> {
    let c = look.color;
    let line: Vec<(f64, f64)> = pts.iter().map(|(x, e)| (*x, e.value)).collect();
    if look.dashed {
        chart
            .draw_series(DashedLineSeries::new(line, 8, 5, c.stroke_width(2)))
            .map_err(|e| plot_err(path, e))?;
    } else {
        chart
            .draw_series(LineSeries::new(line, c.stroke_width(2)))
            .map_err(|e| plot_err(path, e))?;
    }
    chart
        .draw_series(
            pts.iter()
                .map(|(x, e)| ErrorBar::new_vertical(*x, e.lo, e.value, e.hi, c.filled(), 8)),
        )
        .map_err(|e| plot_err(path, e))?;
    let at = |x: f64, e: &Interval| EmptyElement::at((x, e.value));
    let fill = c.filled();
    match look.marker {
        None => Ok(()),
        Some(Marker::Circle) => chart
            .draw_series(
                pts.iter()
                    .map(|(x, e)| at(*x, e) + Circle::new((0, 0), 4, fill)),
            )
            .map(|_| ()),
        Some(Marker::Triangle) => chart
            .draw_series(
                pts.iter()
                    .map(|(x, e)| at(*x, e) + TriangleMarker::new((0, 0), 5, fill)),
            )
            .map(|_| ()),
        Some(Marker::Square) => chart
            .draw_series(
                pts.iter()
                    .map(|(x, e)| at(*x, e) + Rectangle::new([(-4, -4), (4, 4)], fill)),
            )
            .map(|_| ()),
        Some(Marker::Cross) => chart
            .draw_series(
                pts.iter()
                    .map(|(x, e)| at(*x, e) + Cross::new((0, 0), 4, c.stroke_width(2))),
            )
            .map(|_| ()),
    }
    .map_err(|e| plot_err(path, e))
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

/// Where to prune against fully trained windows: the fully trained ELMs' validation NLL by start
/// and the enumeration's short candidates (each point with its 95% interval), GPPO's final
/// probabilities as bars on an axis of their own fitted to their range, and each selector's
/// choice as a vertical line.
pub fn plot_fully_trained(
    f: &FullyTrained,
    w: &WhereToPrune,
    path: &Path,
) -> Result<(), ReproError> {
    const WIDTH: u32 = 820;
    let k = w.num_layers + 1 - w.num_replaced;
    let (x0, x1) = (-0.5, k as f64 - 0.5);
    // The enumeration's estimates (a point where it recorded no interval).
    let enum_iv: Vec<Interval> = w
        .enum_nll
        .iter()
        .enumerate()
        .map(|(i, &(_, v))| {
            let (lo, hi) = w.enum_interval(i).unwrap_or((v, v));
            Interval { value: v, lo, hi }
        })
        .collect();
    let ys: Vec<f64> = f
        .starts
        .iter()
        .map(|r| &r.validation_nll)
        .chain(&enum_iv)
        .flat_map(|i| [i.lo, i.hi])
        .collect();
    let (y0, y1) = bounds(&ys);
    let probs = w.gppo_probs.clone().unwrap_or_default();
    let pmax = probs.iter().copied().fold(0.0, f64::max).max(1e-6);
    let root = SVGBackend::new(path, (WIDTH + LEGEND_WIDTH, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let root = root
        .titled(
            &format!(
                "Where to prune (M = {}): fully trained windows vs the enumeration",
                w.num_replaced
            ),
            ("sans-serif", 18),
        )
        .map_err(|e| plot_err(path, e))?;
    let (plot_area, legend_area) = root.split_horizontally(WIDTH);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .right_y_label_area_size(if probs.is_empty() { 0 } else { 60 })
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| plot_err(path, e))?
        .set_secondary_coord(x0..x1, 0.0..pmax * 1.1);
    chart
        .configure_mesh()
        .x_labels(k.min(32) + 1)
        .x_label_formatter(&integer_label)
        .x_desc("first replaced layer l (window [l, l+M)), layer index")
        .y_desc("validation answer NLL (nats/token)")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    let mut entries = vec![];
    if !probs.is_empty() {
        chart
            .configure_secondary_axes()
            .y_desc("GPPO probability of the start")
            .draw()
            .map_err(|e| plot_err(path, e))?;
        let col = RGBColor(200, 60, 0);
        chart
            .draw_secondary_series(probs.iter().enumerate().map(|(s, &p)| {
                Rectangle::new(
                    [(s as f64 - 0.3, 0.0), (s as f64 + 0.3, p)],
                    col.mix(0.3).filled(),
                )
            }))
            .map_err(|e| plot_err(path, e))?;
        entries.push(LegendEntry {
            label: "GPPO's final probability (right axis, bars)".into(),
            look: Look {
                color: col,
                marker: Some(Marker::Square),
                dashed: false,
            },
        });
    }
    let mut trained: Vec<&TrainedStart> = f.starts.iter().collect();
    trained.sort_by_key(|r| r.start);
    let pts: Vec<(f64, &Interval)> = trained
        .iter()
        .map(|r| (r.start as f64, &r.validation_nll))
        .collect();
    draw_estimates(&mut chart, &pts, look(1), path)?;
    entries.push(LegendEntry {
        label: "ELM fully trained (main budget)".into(),
        look: look(1),
    });
    let enum_pts: Vec<(f64, &Interval)> = w
        .enum_nll
        .iter()
        .zip(&enum_iv)
        .map(|(&(s, _), iv)| (s as f64, iv))
        .collect();
    draw_estimates(&mut chart, &enum_pts, look(0), path)?;
    entries.push(LegendEntry {
        label: "enumeration's short candidates".into(),
        look: look(0),
    });
    for (i, p) in f.placements.iter().enumerate() {
        let l = look(i + 2);
        let x = p.choice as f64 + 0.06 * (i as f64 - 2.0);
        chart
            .draw_series(DashedLineSeries::new(
                [(x, y0), (x, y1)],
                6,
                4,
                l.color.stroke_width(1),
            ))
            .map_err(|e| plot_err(path, e))?;
        entries.push(LegendEntry {
            label: format!("{} → {} (rank {})", p.method, p.choice, p.rank),
            look: Look {
                marker: None,
                dashed: true,
                ..l
            },
        });
    }
    draw_legend(&legend_area, &entries, path)?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Answer NLL against `x` (training tokens or compute seconds) on a log-2 axis, one line per
/// model. The axis counts doublings from the smallest x of the plot, and its ticks sit on whole
/// doublings, so points measured at doubling budgets lie exactly on the ticks.
pub fn plot_curves(
    c: &Curves,
    x_of: fn(&CurvePoint) -> f64,
    x_desc: &str,
    path: &Path,
) -> Result<(), ReproError> {
    let base = c
        .points
        .iter()
        .map(|p| x_of(p).max(1.0))
        .fold(f64::INFINITY, f64::min);
    let base = if base.is_finite() { base } else { 1.0 };
    let doublings = |p: &CurvePoint| (x_of(p).max(1.0) / base).log2();
    let xs: Vec<f64> = c.points.iter().map(doublings).collect();
    let top = xs.iter().cloned().fold(0.0, f64::max);
    // Half a doubling past either end; whole doublings labelled.
    let (x0, x1) = (-0.5, top.ceil() + 0.5);
    let y = nll_axis(c.points.iter().map(|p| &p.answer_nll), None);
    let label = move |x: &f64| {
        if (x - x.round()).abs() < 1e-6 {
            count(base * x.exp2())
        } else {
            String::new()
        }
    };
    nll_plot(
        path,
        (760, 480),
        &format!("Learning curves: answer NLL vs {x_desc}"),
        (x0..x1, y),
        |chart| {
            chart
                .configure_mesh()
                .x_labels(top.ceil() as usize + 2)
                .x_label_formatter(&label)
                .x_desc(format!("{x_desc} (log-2 axis: one tick per doubling)"))
                .y_desc("answer NLL (nats/token)")
                .draw()
                .map_err(|e| plot_err(path, e))?;
            let mut names: Vec<&str> = vec![];
            for p in &c.points {
                if !names.contains(&p.series.as_str()) {
                    names.push(&p.series);
                }
            }
            let mut entries = vec![];
            for (i, name) in names.iter().enumerate() {
                let mut pts: Vec<(f64, &Interval)> = c
                    .points
                    .iter()
                    .filter(|p| p.series == *name)
                    .map(|p| (doublings(p), &p.answer_nll))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                draw_estimates(chart, &pts, look(i), path)?;
                entries.push(LegendEntry {
                    label: name.to_string(),
                    look: look(i),
                });
            }
            Ok(entries)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legend_labels_wrap_at_spaces() {
        assert_eq!(wrap("a bb ccc dddd", 6), vec!["a bb", "ccc", "dddd"]);
        assert_eq!(
            wrap("averyveryverylongword x", 5),
            vec!["averyveryverylongword", "x"]
        );
        assert!(wrap("", 5).is_empty());
    }

    #[test]
    fn bounds_pad_and_handle_single_values() {
        let (lo, hi) = bounds(&[1.0, 3.0]);
        assert!(lo < 1.0 && hi > 3.0);
        let (lo, hi) = bounds(&[2.0]);
        assert!(lo < 2.0 && hi > 2.0);
    }
}
