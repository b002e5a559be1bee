//! The per-row driver every method but the fixed-point one runs on: a [`RowMethod`] advances
//! one row one operator application at a time, [`run_rows`] batches the applications, applies
//! the stop test of [`StopCriteria`] per row and checks a converging row's true residual.

use ndarray::{Array2, ArrayView2};

use crate::error::{bytes_of, check_alloc, Result};
use crate::linear::operator::LinearOperator;
use crate::options::StopCriteria;
use crate::{RowOutcome, RowStatus, SolverFloat};

/// Result of a batched linear solve.
#[derive(Clone, Debug)]
pub struct LinearSolution<T> {
    /// `[B, D]`: each row's final iterate (its status says whether it converged).
    pub x: Array2<T>,
    /// One outcome per row; `iterations` are the row's operator applications.
    pub rows: Vec<RowOutcome>,
    /// Batched operator calls (each applies `A` to every active row).
    pub applications: usize,
}

impl<T> LinearSolution<T> {
    /// True when every row converged.
    pub fn all_converged(&self) -> bool {
        self.rows.iter().all(|r| r.status == RowStatus::Converged)
    }
    /// Largest per-row operator application count.
    pub fn max_iterations(&self) -> usize {
        self.rows.iter().map(|r| r.iterations).max().unwrap_or(0)
    }
}

/// What a method's step left behind, with the residual estimate of the row's current `x`.
pub(super) enum Advance {
    /// `inp` holds the next vector to apply `A` to.
    Next(f64),
    /// The cycle ended (x updated): check the true residual, then restart.
    Restart(f64),
    /// The method can add nothing more (Neumann's terms are used up; x updated).
    Exhausted(f64),
}

/// One row's method, advanced one operator application at a time. All vectors are f64 rows of
/// width D; `inp` on entry to [`RowMethod::advance`] holds the vector whose product is `ainp`.
pub(super) trait RowMethod {
    /// Bytes `init` allocates for `batch` rows of width `dim`, and the config field scaling it.
    fn state_bytes(&self, batch: usize, dim: usize) -> (&'static str, u128);
    fn init(&mut self, batch: usize, dim: usize);
    /// Starts a cycle of row `row` from the true residual `r` (`‖r‖ = rn > 0`) of `x`, writing
    /// the first vector to apply into `inp`; false when the method cannot go on.
    fn restart(&mut self, row: usize, r: &[f64], rn: f64, x: &mut [f64], inp: &mut [f64]) -> bool;
    /// Consumes `ainp = A·inp` (may be overwritten) of row `row`.
    fn advance(&mut self, row: usize, ainp: &mut [f64], x: &mut [f64], inp: &mut [f64]) -> Advance;
    /// Commits any update of `x` still pending (the row stops or checks its true residual).
    fn finish(&mut self, row: usize, x: &mut [f64]);
}

pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(super) fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

/// `y += s·x`.
pub(super) fn axpy(y: &mut [f64], s: f64, x: &[f64]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += s * xi;
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    /// The pending application is `A x` (true residual check).
    Verify,
    /// The pending application is the method's own vector.
    Method,
}

/// Per-row bookkeeping of the driver.
struct Rows {
    apps: Vec<usize>,
    phase: Vec<Phase>,
    first_res: Vec<f64>,
    res: Vec<f64>,
    rel: Vec<f64>,
    bnorm: Vec<f64>,
    /// Cycles started (restarts + 1).
    cycles: Vec<usize>,
    status: Vec<Option<RowStatus>>,
    active: Vec<bool>,
}

/// `‖r‖ / (‖b‖ + rel_eps)`: the relative residual of the linear stop test.
pub(super) fn relative_residual(rn: f64, bnorm: f64, stop: &StopCriteria) -> f64 {
    rn / (bnorm + stop.rel_eps)
}

/// What a row of a linear solve reports: no trace, spectral radius or backtracks (fixed-point
/// notions); `iterations` are its operator applications.
pub(super) fn row_outcome(
    status: RowStatus,
    iterations: usize,
    residual: f64,
    rel_residual: f64,
    restarts: usize,
) -> RowOutcome {
    RowOutcome {
        status,
        iterations,
        residual,
        rel_residual,
        trace: None,
        spectral_radius: None,
        restarts,
        backtracks: 0,
        rejections: 0,
    }
}

/// Whether a residual of norm `rn` against a right-hand side of norm `bnorm` meets `stop`'s
/// absolute or relative tolerance (a zero residual always does).
pub(super) fn meets_tolerance(rn: f64, bnorm: f64, stop: &StopCriteria) -> bool {
    rn == 0.0 || stop.met(rn, relative_residual(rn, bnorm, stop))
}

impl Rows {
    fn converged(&self, row: usize, rn: f64, stop: &StopCriteria) -> bool {
        meets_tolerance(rn, self.bnorm[row], stop)
    }
    fn diverged(&self, row: usize, rn: f64, stop: &StopCriteria) -> bool {
        rn > stop.divergence_factor * self.first_res[row].max(1e-30)
    }
    fn record(&mut self, row: usize, rn: f64, stop: &StopCriteria) {
        self.res[row] = rn;
        self.rel[row] = relative_residual(rn, self.bnorm[row], stop);
    }
    fn stop(&mut self, row: usize, status: RowStatus, inp: &mut [f64]) {
        self.status[row] = Some(status);
        self.active[row] = false;
        inp.fill(0.0);
    }
}

/// Runs `method` on every row of `b` from `x0`; see the `linear` module docs for the protocol.
/// Rows marked in `frozen` are left as they are (reported Converged, no application).
pub(super) fn run_rows<T: SolverFloat>(
    method: &mut dyn RowMethod,
    op: &mut dyn LinearOperator<T>,
    b: ArrayView2<T>,
    x0: ArrayView2<T>,
    stop: &StopCriteria,
    frozen: Option<&[bool]>,
) -> Result<LinearSolution<T>> {
    let (batch, dim) = b.dim();
    let (field, bytes) = method.state_bytes(batch, dim);
    let own = bytes_of(8, &[batch, dim, 3])
        .saturating_add(bytes_of(std::mem::size_of::<T>(), &[batch, dim, 2]));
    check_alloc(field, bytes.saturating_add(own))?;
    method.init(batch, dim);

    let bw: Vec<f64> = b.iter().map(|v| v.widen()).collect();
    let mut x: Vec<f64> = x0.iter().map(|v| v.widen()).collect();
    let mut inp = vec![0.0f64; batch * dim];
    let mut inp_t = Array2::<T>::zeros((batch, dim));
    let mut out_t = Array2::<T>::zeros((batch, dim));
    let mut w = vec![0.0f64; dim];
    let mut rows = Rows {
        apps: vec![0; batch],
        phase: vec![Phase::Verify; batch],
        first_res: vec![f64::NAN; batch],
        res: vec![f64::NAN; batch],
        rel: vec![f64::NAN; batch],
        bnorm: (0..batch)
            .map(|r| norm(&bw[r * dim..(r + 1) * dim]))
            .collect(),
        cycles: vec![0; batch],
        status: vec![None; batch],
        active: vec![true; batch],
    };

    // The true residual r = b − A x of a row is known: stop, or start a cycle.
    let on_residual = |row: usize,
                       r: &mut [f64],
                       x: &mut [f64],
                       inp: &mut [f64],
                       rows: &mut Rows,
                       method: &mut dyn RowMethod| {
        let rn = norm(r);
        rows.record(row, rn, stop);
        if rows.first_res[row].is_nan() && rn.is_finite() {
            rows.first_res[row] = rn;
        }
        let verdict = if !rn.is_finite() || x.iter().any(|v| !v.is_finite()) {
            Some(RowStatus::NonFinite)
        } else if rows.converged(row, rn, stop) {
            Some(RowStatus::Converged)
        } else if rows.diverged(row, rn, stop) {
            Some(RowStatus::Diverged)
        } else if rows.apps[row] >= stop.max_iter {
            Some(RowStatus::MaxIter)
        } else {
            None
        };
        match verdict {
            Some(s) => rows.stop(row, s, inp),
            None => {
                rows.cycles[row] += 1;
                if method.restart(row, r, rn, x, inp) {
                    rows.phase[row] = Phase::Method;
                } else {
                    rows.stop(row, RowStatus::MaxIter, inp);
                }
            }
        }
    };

    for row in 0..batch {
        let span = row * dim..(row + 1) * dim;
        if frozen.is_some_and(|f| f[row]) {
            rows.stop(row, RowStatus::Converged, &mut inp[span]);
        } else if x[span.clone()].iter().all(|&v| v == 0.0) {
            w.copy_from_slice(&bw[span.clone()]);
            on_residual(
                row,
                &mut w,
                &mut x[span.clone()],
                &mut inp[span],
                &mut rows,
                method,
            );
        } else {
            inp[span.clone()].copy_from_slice(&x[span]);
        }
    }

    let mut applications = 0usize;
    while rows.active.iter().any(|&a| a) {
        // Frozen rows' inputs are zero: an operator that works on the whole batch anyway (a
        // tape's VJP) then spends nothing meaningful on them.
        for (o, &v) in inp_t.iter_mut().zip(&inp) {
            *o = T::narrow(v);
        }
        op.apply(inp_t.view(), &rows.active, out_t.view_mut())?;
        applications += 1;
        for row in 0..batch {
            if !rows.active[row] {
                continue;
            }
            rows.apps[row] += 1;
            let span = row * dim..(row + 1) * dim;
            for i in 0..dim {
                w[i] = out_t[[row, i]].widen();
            }
            let (xr, ir) = (&mut x[span.clone()], &mut inp[span.clone()]);
            if rows.phase[row] == Phase::Verify {
                for (wi, &bi) in w.iter_mut().zip(&bw[span]) {
                    *wi = bi - *wi;
                }
                on_residual(row, &mut w, xr, ir, &mut rows, method);
                continue;
            }
            let verify = |rows: &mut Rows, xr: &mut [f64], ir: &mut [f64]| {
                rows.phase[row] = Phase::Verify;
                ir.copy_from_slice(xr);
            };
            let out_of_budget = rows.apps[row] >= stop.max_iter;
            match method.advance(row, &mut w, xr, ir) {
                Advance::Next(e) => {
                    rows.record(row, e, stop);
                    if !e.is_finite() {
                        method.finish(row, xr);
                        rows.stop(row, RowStatus::NonFinite, ir);
                    } else if rows.converged(row, e, stop) && !out_of_budget {
                        method.finish(row, xr);
                        verify(&mut rows, xr, ir);
                    } else if rows.diverged(row, e, stop) {
                        method.finish(row, xr);
                        rows.stop(row, RowStatus::Diverged, ir);
                    } else if out_of_budget {
                        method.finish(row, xr);
                        rows.stop(row, RowStatus::MaxIter, ir);
                    }
                }
                Advance::Restart(e) => {
                    rows.record(row, e, stop);
                    if !e.is_finite() {
                        rows.stop(row, RowStatus::NonFinite, ir);
                    } else if rows.diverged(row, e, stop) {
                        rows.stop(row, RowStatus::Diverged, ir);
                    } else if out_of_budget {
                        rows.stop(row, RowStatus::MaxIter, ir);
                    } else {
                        verify(&mut rows, xr, ir);
                    }
                }
                Advance::Exhausted(e) => {
                    rows.record(row, e, stop);
                    if !e.is_finite() {
                        rows.stop(row, RowStatus::NonFinite, ir);
                    } else if rows.converged(row, e, stop) && !out_of_budget {
                        verify(&mut rows, xr, ir);
                    } else if rows.diverged(row, e, stop) {
                        rows.stop(row, RowStatus::Diverged, ir);
                    } else {
                        rows.stop(row, RowStatus::MaxIter, ir);
                    }
                }
            }
        }
    }

    let mut xs = Array2::<T>::zeros((batch, dim));
    for (o, &v) in xs.iter_mut().zip(&x) {
        *o = T::narrow(v);
    }
    let outcomes = (0..batch)
        .map(|r| {
            row_outcome(
                rows.status[r].unwrap_or(RowStatus::MaxIter),
                rows.apps[r],
                rows.res[r],
                rows.rel[r],
                rows.cycles[r].saturating_sub(1),
            )
        })
        .collect();
    Ok(LinearSolution {
        x: xs,
        rows: outcomes,
        applications,
    })
}
