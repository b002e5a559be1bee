//! Tables 8 and 9 (`long`; `smoke` in CI): learning curves and seeds. Every point is a model
//! trained from scratch with its own warm-up + cosine schedule over its own number of steps (the
//! schedule depends on the total, so a longer budget cannot continue a shorter run), evaluated
//! on the main table's held-out problems; the main budget's points are the main table's own
//! stages. The compressed models start, as in table 1, from the LoRA-tuned dense model; the
//! dense curve is that LoRA run itself at each budget.

use elm::eval::stats::{least_squares_line, spread};
use elm::eval::task::MetricReport;
use elm::lora::LoraReport;

use crate::error::ReproError;
use crate::fill_tables::{paired_delta, Dense, Main};
use crate::rows::{
    CurvePoint, CurveTrend, Curves, Interval, SeedRow, SeedSummary, Seeds, PAPER_PROBLEMS,
};
use crate::runs::{self, Ctx, Metrics, OwnCompute, Subject, Variant};
use crate::scale::Budget;
use crate::stage::Done;

/// One method trained at every budget (or every seed).
#[derive(Clone, Debug, PartialEq)]
enum Series {
    /// The ELM with its window's first layer.
    Elm(usize),
    /// A training-free baseline (`elm prune --method`) with the LoRA healing fine-tune.
    Healed(String),
    /// LLM-Streamline (one layer, one application) at the study's window.
    Streamline,
    /// The LoRA-tuned dense model (the reference of every retention figure).
    Dense,
}

impl Series {
    fn name(&self, m: usize) -> String {
        match self {
            Series::Elm(start) => format!("ELM (layers {start}–{})", start + m - 1),
            Series::Healed(method) => format!("{method} + LoRA healing"),
            Series::Streamline => "LLM-Streamline".into(),
            Series::Dense => "dense, LoRA-tuned".into(),
        }
    }
}

/// One trained model of a curve or of the seeds table: its answer NLL items and its cost.
struct Point {
    tokens: usize,
    compute_seconds: f64,
    nll: MetricReport,
}

/// Trains (or reads from the cache) and evaluates `series` with the main budget's shape,
/// `steps` steps and `seed`.
fn train_point(
    ctx: &mut Ctx<'_>,
    dense: &Dense,
    series: &Series,
    steps: usize,
    seed: u64,
) -> Result<Point, ReproError> {
    let l = ctx.limits.clone();
    let what = series.name(l.m);
    let (main, lora) = (
        l.main.with_steps(steps).with_seed(seed),
        l.lora.with_steps(steps).with_seed(seed),
    );
    let trained = |ctx: &mut Ctx<'_>, v: &Variant, b: &Budget| -> Result<Point, ReproError> {
        let t = runs::train(ctx, v, b, None)?;
        let run = runs::eval(ctx, &Subject::elm(&t, "anderson", 0.5), "gsm8k-nll")?;
        Ok(Point {
            tokens: b.max_tokens(),
            compute_seconds: t.value.compute_seconds(),
            nll: run.value.metric("answer_nll", &what)?.clone(),
        })
    };
    // A LoRA stage's merged model (`before`: the compute spent before it, e.g. pruning).
    let tuned =
        |ctx: &mut Ctx<'_>, run: &Done<LoraReport>, before: f64| -> Result<Point, ReproError> {
            let eval = runs::eval(ctx, &Subject::tuned(run), "gsm8k-nll")?;
            Ok(Point {
                tokens: lora.max_tokens(),
                compute_seconds: before + run.value.compute_seconds(),
                nll: eval.value.metric("answer_nll", &what)?.clone(),
            })
        };
    match series {
        Series::Elm(start) => trained(ctx, &Variant::elm(*start, l.m), &main),
        Series::Streamline => trained(ctx, &Variant::streamline(l.start, l.m), &main),
        Series::Healed(method) => {
            let p = runs::prune(ctx, method, l.m)?;
            let h = runs::heal(ctx, &p, &lora)?;
            tuned(ctx, &h, p.value.report.seconds)
        }
        Series::Dense if steps == l.lora.steps && seed == l.lora.seed => Ok(Point {
            tokens: l.lora.max_tokens(),
            compute_seconds: dense.tuned.value.compute_seconds(),
            nll: dense.nll.value.metric("answer_nll", &what)?.clone(),
        }),
        Series::Dense => {
            let t = runs::lora(ctx, &dense.untuned_model, &dense.untuned_id, &lora)?;
            tuned(ctx, &t, 0.0)
        }
    }
}

/// The headline rows, reference first: the ELM every gap is measured against (the one at the
/// best healed baseline's window, where the methods meet on the same layers; else the study's
/// window at `start`), the best healed baseline, the tuned dense model. Table 9 trains these;
/// table 8 adds the other series after them.
fn headline_series(main: &Main, start: usize) -> Vec<Series> {
    let mut s = vec![Series::Elm(main.same_window_start.unwrap_or(start))];
    s.extend(
        main.healed_ranked
            .iter()
            .take(1)
            .cloned()
            .map(Series::Healed),
    );
    s.push(Series::Dense);
    s
}

/// Table 8's series: the headline rows, then the ELM at the study's window (when the reference
/// sits elsewhere), the other healed baselines (best first) and Streamline.
fn series(main: &Main, start: usize) -> Vec<Series> {
    let elm = main.same_window_start.unwrap_or(start);
    let mut s = headline_series(main, start);
    if elm != start {
        s.push(Series::Elm(start));
    }
    s.extend(
        main.healed_ranked
            .iter()
            .skip(1)
            .cloned()
            .map(Series::Healed),
    );
    s.push(Series::Streamline);
    s
}

/// A trained point and its answer NLL minus the reference ELM's at the same run.
type PairedPoint = (Point, Option<Interval>);

/// Every series of `all` trained at every `(steps, seed)` of its `runs_of(series)`, in that
/// order; each point with its answer NLL minus that of `all[0]` (the reference ELM, whose runs
/// hold every other series' runs) at the same run, paired over problems (`None` for the
/// reference's own points).
fn paired_runs(
    ctx: &mut Ctx<'_>,
    dense: &Dense,
    all: &[Series],
    runs_of: impl Fn(&Series) -> Vec<(usize, u64)>,
) -> Result<Vec<Vec<PairedPoint>>, ReproError> {
    let m = ctx.limits.m;
    let reference = all[0].name(m);
    let mut elm_items: Vec<((usize, u64), MetricReport)> = vec![];
    let mut out = vec![];
    for s in all {
        let name = s.name(m);
        let mut pts = vec![];
        for (steps, seed) in runs_of(s) {
            let p = train_point(ctx, dense, s, steps, seed)?;
            let minus_elm = if s == &all[0] {
                elm_items.push(((steps, seed), p.nll.clone()));
                None
            } else {
                let (_, e) = elm_items
                    .iter()
                    .find(|(run, _)| *run == (steps, seed))
                    .ok_or_else(|| {
                        ReproError::Setup(format!(
                            "{name}: no run of {reference} at {steps} steps, seed {seed}"
                        ))
                    })?;
                Some(paired_delta(
                    &p.nll,
                    e,
                    &format!("{name} vs {reference}, {steps} steps, seed {seed}"),
                )?)
            };
            pts.push((p, minus_elm));
        }
        out.push(pts);
    }
    Ok(out)
}

/// Table 8: every series at every budget of the scale's curve study, the headline series also
/// at its larger budgets.
pub fn curves(ctx: &mut Ctx<'_>, dense: &Dense, main: &Main) -> Result<Curves, ReproError> {
    let l = ctx.limits.clone();
    let study = l
        .curves
        .clone()
        .ok_or_else(|| ReproError::Setup("this scale has no learning curves".into()))?;
    let mut steps = study.steps.clone();
    steps.sort_unstable();
    let all = series(main, l.start);
    let headline = headline_series(main, l.start);
    let budgets_of = |s: &Series| {
        if headline.contains(s) {
            study.headline_budgets()
        } else {
            steps.clone()
        }
    };
    let reference = all[0].name(l.m);
    let runs_of = |s: &Series| budgets_of(s).into_iter().map(|n| (n, 0)).collect();
    let mut points = vec![];
    let mut trends = vec![];
    for (s, pts) in all.iter().zip(paired_runs(ctx, dense, &all, runs_of)?) {
        let name = s.name(l.m);
        let pts: Vec<CurvePoint> = pts
            .into_iter()
            .zip(budgets_of(s))
            .map(|((p, minus_elm), n)| CurvePoint {
                series: name.clone(),
                steps: n,
                tokens: p.tokens,
                compute_seconds: p.compute_seconds,
                answer_nll: (&p.nll.estimate).into(),
                minus_elm,
            })
            .collect();
        trends.push(trend(&name, &pts)?);
        points.extend(pts);
    }
    let largest = *study
        .headline_budgets()
        .last()
        .expect("a curve has budgets") as f64
        * l.main.batch_size as f64;
    Ok(Curves {
        reference,
        points,
        trends,
        doublings_to_paper: (PAPER_PROBLEMS / largest).log2(),
    })
}

/// The trend of one series (slopes per doubling of the budget, gap at both ends).
fn trend(name: &str, pts: &[CurvePoint]) -> Result<CurveTrend, ReproError> {
    let lib = |source| ReproError::Elm {
        what: format!("learning curve of {name}"),
        source,
    };
    let x: Vec<f64> = pts.iter().map(|p| (p.tokens as f64).log2()).collect();
    let y: Vec<f64> = pts.iter().map(|p| p.answer_nll.value).collect();
    let (_, slope) = least_squares_line(&x, &y).map_err(lib)?;
    let gaps: Option<Vec<Interval>> = pts.iter().map(|p| p.minus_elm).collect();
    let (first, last) = match &gaps {
        Some(g) => (g.first().copied(), g.last().copied()),
        None => (None, None),
    };
    let (mut gap_slope, mut last_segment) = (None, None);
    if let Some(g) = &gaps {
        let gy: Vec<f64> = g.iter().map(|i| i.value).collect();
        let (_, b) = least_squares_line(&x, &gy).map_err(lib)?;
        gap_slope = Some(b);
        // The last two budgets: the direction the gap last moved in, per doubling.
        let n = x.len();
        if n >= 2 && x[n - 1] > x[n - 2] {
            last_segment = Some((gy[n - 1] - gy[n - 2]) / (x[n - 1] - x[n - 2]));
        }
    }
    let verdict = match (first, last) {
        (Some(f), Some(l)) if f.value.signum() != l.value.signum() => "crosses",
        (Some(f), Some(l)) if l.value.abs() < f.value.abs() => "shrinks",
        (Some(_), Some(_)) => "grows",
        _ => "n/a",
    };
    Ok(CurveTrend {
        series: name.to_string(),
        slope_per_doubling: slope,
        gap_smallest: first,
        gap_largest: last,
        gap_slope_per_doubling: gap_slope,
        gap_last_segment_slope: last_segment,
        verdict: verdict.into(),
    })
}

/// Table 9: the headline rows (the reference ELM, the best healed baseline, the tuned dense
/// model) at every seed of the scale's curve study, main budget.
pub fn seeds(ctx: &mut Ctx<'_>, dense: &Dense, main: &Main) -> Result<Seeds, ReproError> {
    let l = ctx.limits.clone();
    let study = l
        .curves
        .clone()
        .ok_or_else(|| ReproError::Setup("this scale has no seeds table".into()))?;
    let all = headline_series(main, l.start);
    let reference = all[0].name(l.m);
    let runs: Vec<(usize, u64)> = study
        .seeds
        .iter()
        .map(|&seed| (l.main.steps, seed))
        .collect();
    let mut rows = vec![];
    let mut summaries = vec![];
    for (s, pts) in all
        .iter()
        .zip(paired_runs(ctx, dense, &all, |_| runs.clone())?)
    {
        let name = s.name(l.m);
        let (mut nll, mut gaps) = (vec![], vec![]);
        let mut sides = vec![];
        for ((p, minus_elm), &(_, seed)) in pts.into_iter().zip(&runs) {
            nll.push(p.nll.estimate.value);
            if let Some(g) = minus_elm {
                gaps.push(g.value);
                sides.push(if g.lo > 0.0 {
                    1
                } else if g.hi < 0.0 {
                    -1
                } else {
                    0
                });
            }
            rows.push(SeedRow {
                series: name.clone(),
                seed,
                answer_nll: (&p.nll.estimate).into(),
                minus_elm,
            });
        }
        let lib = |source| ReproError::Elm {
            what: format!("seeds of {name}"),
            source,
        };
        let verdict = if sides.is_empty() {
            "n/a"
        } else if sides.iter().all(|&x| x == 1) {
            "worse than the ELM at every seed"
        } else if sides.iter().all(|&x| x == -1) {
            "better than the ELM at every seed"
        } else {
            "not sure"
        };
        summaries.push(SeedSummary {
            series: name.clone(),
            answer_nll: spread(&nll).map_err(lib)?,
            minus_elm: if gaps.is_empty() {
                None
            } else {
                Some(spread(&gaps).map_err(lib)?)
            },
            verdict: verdict.into(),
        });
    }
    Ok(Seeds {
        reference,
        rows,
        summaries,
    })
}
