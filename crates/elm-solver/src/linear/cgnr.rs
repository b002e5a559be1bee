//! CGNR: conjugate gradients on the normal equations `AᵀA x = Aᵀb`, checked on the true
//! residual `b − A x`.

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use crate::error::{bytes_of, check_alloc, MapError, Result, SolverError};
use crate::linear::driver::{
    axpy, dot, meets_tolerance, norm, relative_residual, row_outcome, run_rows, Advance,
    LinearSolution, RowMethod,
};
use crate::linear::operator::LinearOperator;
use crate::options::StopCriteria;
use crate::{RowStatus, SolverFloat};

/// Unpreconditioned conjugate gradients for a symmetric positive definite operator (here
/// `AᵀA`); per row `r, p` and `rᵀr`.
#[derive(Default)]
struct Cg {
    dim: usize,
    r: Vec<f64>,
    p: Vec<f64>,
    rr: Vec<f64>,
}

impl RowMethod for Cg {
    fn state_bytes(&self, batch: usize, dim: usize) -> (&'static str, u128) {
        ("cgnr", bytes_of(8, &[batch, dim, 2]))
    }
    fn init(&mut self, batch: usize, dim: usize) {
        self.dim = dim;
        self.r = vec![0.0; batch * dim];
        self.p = vec![0.0; batch * dim];
        self.rr = vec![0.0; batch];
    }
    fn restart(&mut self, row: usize, r: &[f64], rn: f64, _x: &mut [f64], inp: &mut [f64]) -> bool {
        let span = row * self.dim..(row + 1) * self.dim;
        self.r[span.clone()].copy_from_slice(r);
        self.p[span].copy_from_slice(r);
        inp.copy_from_slice(r);
        self.rr[row] = rn * rn;
        true
    }
    fn advance(&mut self, row: usize, ainp: &mut [f64], x: &mut [f64], inp: &mut [f64]) -> Advance {
        let span = row * self.dim..(row + 1) * self.dim;
        let (r, p) = (&mut self.r[span.clone()], &mut self.p[span]);
        let pap = dot(p, ainp);
        if !pap.is_finite() {
            return Advance::Restart(f64::NAN);
        }
        if pap <= 0.0 {
            // Not positive definite along p (rounding at convergence): restart from the truth.
            return Advance::Restart(norm(r));
        }
        let alpha = self.rr[row] / pap;
        axpy(x, alpha, p);
        axpy(r, -alpha, ainp);
        let rr = dot(r, r);
        let beta = rr / self.rr[row];
        self.rr[row] = rr;
        for (pi, &ri) in p.iter_mut().zip(r.iter()) {
            *pi = ri + beta * *pi;
        }
        inp.copy_from_slice(p);
        Advance::Next(rr.sqrt())
    }
    fn finish(&mut self, _row: usize, _x: &mut [f64]) {}
}

/// `x ↦ Aᵀ(A x)` of an operator with both products.
struct NormalOperator<'a, T: SolverFloat> {
    op: &'a mut dyn LinearOperator<T>,
    ax: Array2<T>,
}

impl<T: SolverFloat> LinearOperator<T> for NormalOperator<'_, T> {
    fn dim(&self) -> usize {
        self.op.dim()
    }
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        self.ax.fill(T::zero());
        self.op.apply(x, active, self.ax.view_mut())?;
        self.op.apply_transpose(self.ax.view(), active, out)
    }
}

/// CGNR: CG on `AᵀA x = Aᵀb` (each CG application is two products), then the true residual
/// `b − A x` of every row decides. A row whose true residual misses the tolerance (the normal
/// residual is smaller by up to `‖A⁻ᵀ‖`) runs CG again from its `x`, with the normal system's
/// tolerance 10× tighter each round (down to 1e-6 of the target), while its budget of
/// `stop.max_iter` products lasts.
pub(super) fn solve_cgnr<T: SolverFloat>(
    op: &mut dyn LinearOperator<T>,
    b: ArrayView2<T>,
    x0: ArrayView2<T>,
    stop: &StopCriteria,
) -> Result<LinearSolution<T>> {
    if !op.has_transpose() {
        return Err(SolverError::config(
            "kind",
            "cgnr needs products with Aᵀ, which this operator does not offer \
             (use gmres or bicgstab)",
        ));
    }
    let (batch, dim) = b.dim();
    check_alloc("cgnr", bytes_of(std::mem::size_of::<T>(), &[batch, dim, 4]))?;
    let all = vec![true; batch];
    let mut atb = Array2::<T>::zeros((batch, dim));
    op.apply_transpose(b, &all, atb.view_mut())?;
    let mut products = vec![1usize; batch];
    let mut calls = 1usize;
    let mut x = x0.to_owned();
    let mut inner = stop.clone();
    inner.abs_tol *= 0.1;
    inner.rel_tol *= 0.1;
    let bnorm: Vec<f64> = b
        .rows()
        .into_iter()
        .map(|r| r.iter().map(|v| v.widen().powi(2)).sum::<f64>().sqrt())
        .collect();
    let mut restarts = vec![0usize; batch];
    let mut outcome: Vec<Option<(RowStatus, f64)>> = vec![None; batch];
    let mut ax = Array2::<T>::zeros((batch, dim));
    // Rows whose verdict is final: later rounds leave them alone.
    let mut done = vec![false; batch];
    loop {
        let used = products.iter().copied().max().unwrap_or(0);
        // Two products per CG application, and one left for the true residual; rounds of at
        // most 2·D applications (CG's exact-arithmetic bound is D), so a recurrence that drifts
        // from the truth (rounding, an inexact Aᵀ) restarts from the true residual.
        let budget = (stop.max_iter.saturating_sub(used + 1) / 2).min(2 * dim.max(8));
        if budget > 0 {
            inner.max_iter = budget;
            let mut normal = NormalOperator {
                op: &mut *op,
                ax: Array2::<T>::zeros((batch, dim)),
            };
            let sol = run_rows(
                &mut Cg::default(),
                &mut normal,
                atb.view(),
                x.view(),
                &inner,
                Some(&done),
            )?;
            calls += 2 * sol.applications;
            for (p, row) in products.iter_mut().zip(&sol.rows) {
                *p += 2 * row.iterations;
            }
            x = sol.x;
        }
        // The true residual of every row.
        ax.fill(T::zero());
        let open: Vec<bool> = done.iter().map(|d| !d).collect();
        op.apply(x.view(), &open, ax.view_mut())?;
        calls += 1;
        let mut again = false;
        for row in 0..batch {
            if done[row] {
                continue;
            }
            products[row] += 1;
            let rn = b
                .row(row)
                .iter()
                .zip(ax.row(row))
                .map(|(&bi, &ai)| (bi.widen() - ai.widen()).powi(2))
                .sum::<f64>()
                .sqrt();
            let status = if !rn.is_finite() || x.row(row).iter().any(|v| !v.widen().is_finite()) {
                Some(RowStatus::NonFinite)
            } else if meets_tolerance(rn, bnorm[row], stop) {
                Some(RowStatus::Converged)
            } else if rn > stop.divergence_factor * bnorm[row].max(1e-30) {
                Some(RowStatus::Diverged)
            } else if products[row] + 2 >= stop.max_iter || budget == 0 {
                Some(RowStatus::MaxIter)
            } else {
                None
            };
            match status {
                Some(st) => {
                    outcome[row] = Some((st, rn));
                    done[row] = true;
                }
                None => {
                    outcome[row] = Some((RowStatus::MaxIter, rn));
                    restarts[row] += 1;
                    again = true;
                }
            }
        }
        if !again {
            break;
        }
        if inner.rel_tol > stop.rel_tol * 1e-6 || inner.abs_tol > stop.abs_tol * 1e-6 {
            inner.abs_tol *= 0.1;
            inner.rel_tol *= 0.1;
        }
    }
    let rows = (0..batch)
        .map(|row| {
            let (status, rn) = outcome[row].unwrap_or((RowStatus::MaxIter, f64::NAN));
            row_outcome(
                status,
                products[row],
                rn,
                relative_residual(rn, bnorm[row], stop),
                restarts[row],
            )
        })
        .collect();
    Ok(LinearSolution {
        x,
        rows,
        applications: calls,
    })
}
