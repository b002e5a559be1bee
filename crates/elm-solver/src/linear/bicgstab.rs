//! Unpreconditioned BiCGStab (van der Vorst), restarted on breakdown.

use crate::error::bytes_of;
use crate::linear::driver::{axpy, dot, norm, Advance, RowMethod};

/// Unpreconditioned BiCGStab; per row `r, r̂, p, v` and the scalars of the recurrence. `s`
/// lives in the driver's input row between the two applications of an iteration.
#[derive(Default)]
pub(super) struct BiCgStab {
    dim: usize,
    /// `[B, D]` each.
    r: Vec<f64>,
    rhat: Vec<f64>,
    p: Vec<f64>,
    v: Vec<f64>,
    rho: Vec<f64>,
    alpha: Vec<f64>,
    /// True when the pending application is `A p` (false: `A s`).
    at_p: Vec<bool>,
    /// `x += α p` not yet applied.
    pending: Vec<bool>,
}

impl RowMethod for BiCgStab {
    fn state_bytes(&self, batch: usize, dim: usize) -> (&'static str, u128) {
        ("bicgstab", bytes_of(8, &[batch, dim, 4]))
    }
    fn init(&mut self, batch: usize, dim: usize) {
        self.dim = dim;
        self.r = vec![0.0; batch * dim];
        self.rhat = vec![0.0; batch * dim];
        self.p = vec![0.0; batch * dim];
        self.v = vec![0.0; batch * dim];
        self.rho = vec![0.0; batch];
        self.alpha = vec![0.0; batch];
        self.at_p = vec![true; batch];
        self.pending = vec![false; batch];
    }
    fn restart(&mut self, row: usize, r: &[f64], rn: f64, _x: &mut [f64], inp: &mut [f64]) -> bool {
        let span = row * self.dim..(row + 1) * self.dim;
        self.r[span.clone()].copy_from_slice(r);
        self.rhat[span.clone()].copy_from_slice(r);
        self.p[span].copy_from_slice(r);
        inp.copy_from_slice(r);
        self.rho[row] = rn * rn;
        self.at_p[row] = true;
        self.pending[row] = false;
        true
    }
    fn advance(&mut self, row: usize, ainp: &mut [f64], x: &mut [f64], inp: &mut [f64]) -> Advance {
        let span = row * self.dim..(row + 1) * self.dim;
        let (r, rhat) = (&mut self.r[span.clone()], &self.rhat[span.clone()]);
        let (p, v) = (&mut self.p[span.clone()], &mut self.v[span]);
        if self.at_p[row] {
            // ainp = v = A p; s = r − α v goes to inp.
            v.copy_from_slice(ainp);
            let sigma = dot(rhat, v);
            if !sigma.is_finite() {
                return Advance::Restart(f64::NAN);
            }
            if sigma == 0.0 {
                // Breakdown: x unchanged; restart with r̂ = the true residual.
                return Advance::Restart(norm(r));
            }
            let alpha = self.rho[row] / sigma;
            self.alpha[row] = alpha;
            for i in 0..inp.len() {
                inp[i] = r[i] - alpha * v[i];
            }
            self.pending[row] = true;
            self.at_p[row] = false;
            return Advance::Next(norm(inp));
        }
        // ainp = t = A s, inp = s.
        let alpha = self.alpha[row];
        axpy(x, alpha, p);
        self.pending[row] = false;
        let (t, s) = (&*ainp, &*inp);
        let tt = dot(t, t);
        if tt == 0.0 || !tt.is_finite() {
            r.copy_from_slice(s);
            return Advance::Restart(if tt.is_finite() { norm(s) } else { f64::NAN });
        }
        let omega = dot(t, s) / tt;
        axpy(x, omega, s);
        for i in 0..r.len() {
            r[i] = s[i] - omega * t[i];
        }
        let rn = norm(r);
        let rho_new = dot(rhat, r);
        if omega == 0.0 || rho_new == 0.0 || !rho_new.is_finite() {
            return Advance::Restart(rn);
        }
        let beta = (rho_new / self.rho[row]) * (alpha / omega);
        for i in 0..p.len() {
            p[i] = r[i] + beta * (p[i] - omega * v[i]);
        }
        self.rho[row] = rho_new;
        inp.copy_from_slice(p);
        self.at_p[row] = true;
        Advance::Next(rn)
    }
    fn finish(&mut self, row: usize, x: &mut [f64]) {
        if std::mem::replace(&mut self.pending[row], false) {
            let span = row * self.dim..(row + 1) * self.dim;
            axpy(x, self.alpha[row], &self.p[span]);
        }
        self.at_p[row] = true;
    }
}
