//! Table 11, the train-K × test-K grid: is the equilibrium worth solving? At the headline
//! window and budget, the module trained as fixed loops of K applications and as the solved
//! ELM; each tested at fixed depths K' and solved at tolerances δ (the sizes:
//! [`GridSizes`]). Validation scores choose (the README's
//! matched-compute sentence reads only them), test scores report, each cell paired with the
//! solved ELM and with its own module tested as trained. Returns rows; never sees `Tables`.

use elm::eval::task::MetricReport;

use crate::error::ReproError;
use crate::fill_tables::paired_delta;
use crate::rows::{Grid, GridDepth, GridRow, Interval};
use crate::runs::{self, Ctx, Metrics, Problems, Subject, Variant};
use crate::scale::GridSizes;

/// Evaluation cap of a solved cell: 32, the deepest fixed depth of the full grid, so that a
/// tighter δ can use as many evaluations as the deepest loop (the study's 16 would cut δ = 0.1
/// off).
pub const SOLVED_MAX_ITER: usize = 32;

/// The subject of one cell: `trained` run at `tested`.
fn subject(trained: &crate::stage::Done<runs::Trained>, tested: GridDepth) -> Subject {
    match tested {
        GridDepth::Fixed(k) => Subject::elm(trained, "anderson", 0.5).at_depth(&k.to_string()),
        GridDepth::Solved { tol, max_iter } => Subject::elm(trained, "anderson", tol)
            .with_max_iter(max_iter)
            .at_depth("solved"),
    }
}

/// One scored cell before pairing.
struct Cell {
    trained: GridDepth,
    tested: GridDepth,
    validation_nll: f64,
    validation_evals: f64,
    test: MetricReport,
    test_evals: f64,
}

/// The grid at window `start` (M = the scale's), the main budget.
pub fn grid(ctx: &mut Ctx<'_>, start: usize, sizes: &GridSizes) -> Result<Grid, ReproError> {
    let l = ctx.limits;
    let solved = |tol| GridDepth::Solved {
        tol,
        max_iter: SOLVED_MAX_ITER,
    };
    let mut trainings = vec![(
        solved(0.5),
        runs::train(ctx, &Variant::elm(start, l.m), &l.main, None)?,
    )];
    for &k in &sizes.train_ks {
        let t = runs::train(ctx, &Variant::elm_fixed(start, l.m, k), &l.main, None)?;
        trainings.push((GridDepth::Fixed(k), t));
    }
    let tested: Vec<GridDepth> = sizes
        .test_ks
        .iter()
        .map(|&k| GridDepth::Fixed(k))
        .chain(sizes.test_tols.iter().map(|&t| solved(t)))
        .collect();
    let mut cells = vec![];
    let mut stage_keys: Vec<String> = trainings.iter().map(|(_, t)| t.key.clone()).collect();
    for (trained, t) in &trainings {
        for &at in &tested {
            let s = subject(t, at);
            let v = runs::validation_nll(ctx, &s)?;
            let run = runs::eval_on(ctx, &s, "gsm8k-nll", Problems::AblationTest)?;
            stage_keys.push(run.key.clone());
            stage_keys.push(v.key.clone());
            let what = format!("grid cell {trained:?} tested {at:?}");
            cells.push(Cell {
                trained: *trained,
                tested: at,
                validation_nll: v.mean,
                validation_evals: v.block_evals,
                test: run.value.metric("answer_nll", &what)?.clone(),
                test_evals: run.value.solver.mean_iterations,
            });
        }
    }
    // The ELM as trained and run by default: trained solved, tested solved at δ = 0.5.
    let reference = cells
        .iter()
        .find(|c| c.trained == solved(0.5) && c.tested == solved(0.5))
        .map(|c| c.test.clone())
        .ok_or_else(|| ReproError::Setup("grid: no solved ELM cell".into()))?;
    let mut rows = vec![];
    for c in &cells {
        // The same module tested as trained: its K, or solved at δ = 0.5 for the ELM.
        let as_trained = cells
            .iter()
            .find(|o| o.trained == c.trained && o.tested == c.trained)
            .filter(|o| o.tested != c.tested);
        let what = format!("grid cell {:?} tested {:?}", c.trained, c.tested);
        rows.push(GridRow {
            trained: c.trained,
            tested: c.tested,
            validation_nll: c.validation_nll,
            validation_evals: c.validation_evals,
            answer_nll: Interval::from(&c.test.estimate),
            block_evals_per_token: c.test_evals,
            minus_elm: paired_delta(&c.test, &reference, &what)?,
            minus_as_trained: match as_trained {
                Some(o) => Some(paired_delta(&c.test, &o.test, &what)?),
                None => None,
            },
        });
    }
    Ok(Grid {
        layers: (start, start + l.m - 1),
        validation_problems: l.validation_eval,
        test_problems: l.ablation_nll_eval.min(l.nll_eval),
        rows,
        stage_keys,
    })
}
