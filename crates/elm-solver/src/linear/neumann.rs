//! The truncated Neumann series `x = Σ_{k<terms} (I − A)^k b`.

use crate::linear::driver::{axpy, norm, Advance, RowMethod};

/// `x = x₀ + Σ_k (I − A)^k r₀`; the newest term `t` lives in the driver's input row and is also
/// the residual of `x` before it is added.
pub(super) struct Neumann {
    max_terms: usize,
    terms: Vec<usize>,
    /// The input row (a term) has not been added to x yet: add it when the row goes on.
    pending: Vec<bool>,
}

impl Neumann {
    pub(super) fn new(max_terms: usize) -> Self {
        Neumann {
            max_terms,
            terms: vec![],
            pending: vec![],
        }
    }
}

impl RowMethod for Neumann {
    fn state_bytes(&self, _batch: usize, _dim: usize) -> (&'static str, u128) {
        ("terms", 0)
    }
    fn init(&mut self, batch: usize, _dim: usize) {
        self.terms = vec![0; batch];
        self.pending = vec![false; batch];
    }
    fn restart(&mut self, row: usize, r: &[f64], _rn: f64, x: &mut [f64], inp: &mut [f64]) -> bool {
        if self.terms[row] >= self.max_terms {
            return false;
        }
        axpy(x, 1.0, r);
        self.terms[row] += 1;
        self.pending[row] = false;
        inp.copy_from_slice(r);
        true
    }
    fn advance(&mut self, row: usize, ainp: &mut [f64], x: &mut [f64], inp: &mut [f64]) -> Advance {
        if std::mem::replace(&mut self.pending[row], false) {
            axpy(x, 1.0, inp);
            self.terms[row] += 1;
        }
        // Next term (I − A) t: the residual of x as it now stands.
        for (ti, &ai) in inp.iter_mut().zip(ainp.iter()) {
            *ti -= ai;
        }
        let e = norm(inp);
        if self.terms[row] >= self.max_terms {
            return Advance::Exhausted(e);
        }
        self.pending[row] = true;
        Advance::Next(e)
    }
    fn finish(&mut self, row: usize, _x: &mut [f64]) {
        self.pending[row] = false;
    }
}
