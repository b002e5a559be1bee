//! Restarted GMRES(m): Arnoldi with modified Gram–Schmidt and Givens rotations.

use crate::error::bytes_of;
use crate::linear::driver::{axpy, dot, norm, Advance, RowMethod};

/// Restarted GMRES; per row: the Arnoldi basis, the rotated Hessenberg matrix, the Givens
/// rotations and the rotated right-hand side.
pub(super) struct Gmres {
    m: usize,
    dim: usize,
    /// `[B, m+1, D]`.
    v: Vec<f64>,
    /// `[B, m, m+1]`: column j of the rotated Hessenberg matrix (upper triangle R after rotation).
    h: Vec<f64>,
    /// `[B, m]`.
    cs: Vec<f64>,
    sn: Vec<f64>,
    /// `[B, m+1]`: rotated `β e₁`; `|γ[j]|` is the residual after j steps.
    gamma: Vec<f64>,
    /// Arnoldi steps taken in the current cycle, per row.
    j: Vec<usize>,
}

impl Gmres {
    pub(super) fn new(m: usize) -> Self {
        Gmres {
            m,
            dim: 0,
            v: vec![],
            h: vec![],
            cs: vec![],
            sn: vec![],
            gamma: vec![],
            j: vec![],
        }
    }
}

/// `(c, s, r)` with `[c s; −s c]·[a; b] = [r; 0]`.
fn givens(a: f64, b: f64) -> (f64, f64, f64) {
    if b == 0.0 {
        (1.0, 0.0, a)
    } else if b.abs() > a.abs() {
        let t = a / b;
        let s = 1.0 / (1.0 + t * t).sqrt();
        let c = s * t;
        (c, s, c * a + s * b)
    } else {
        let t = b / a;
        let c = 1.0 / (1.0 + t * t).sqrt();
        let s = c * t;
        (c, s, c * a + s * b)
    }
}

impl RowMethod for Gmres {
    fn state_bytes(&self, batch: usize, dim: usize) -> (&'static str, u128) {
        let m = self.m;
        let per_row = bytes_of(8, &[m + 1, dim])
            .saturating_add(bytes_of(8, &[m, m + 1]))
            .saturating_add(bytes_of(8, &[3 * m + 1]));
        ("restart", per_row.saturating_mul(batch as u128))
    }
    fn init(&mut self, batch: usize, dim: usize) {
        let m = self.m;
        self.dim = dim;
        self.v = vec![0.0; batch * (m + 1) * dim];
        self.h = vec![0.0; batch * m * (m + 1)];
        self.cs = vec![0.0; batch * m];
        self.sn = vec![0.0; batch * m];
        self.gamma = vec![0.0; batch * (m + 1)];
        self.j = vec![0; batch];
    }
    fn restart(&mut self, row: usize, r: &[f64], rn: f64, _x: &mut [f64], inp: &mut [f64]) -> bool {
        let (m, d) = (self.m, self.dim);
        let v0 = &mut self.v[row * (m + 1) * d..][..d];
        for (vi, &ri) in v0.iter_mut().zip(r) {
            *vi = ri / rn;
        }
        inp.copy_from_slice(v0);
        let g = &mut self.gamma[row * (m + 1)..][..m + 1];
        g.fill(0.0);
        g[0] = rn;
        self.j[row] = 0;
        true
    }
    fn advance(&mut self, row: usize, w: &mut [f64], x: &mut [f64], inp: &mut [f64]) -> Advance {
        let (m, d) = (self.m, self.dim);
        let j = self.j[row];
        let v = &mut self.v[row * (m + 1) * d..][..(m + 1) * d];
        let col = &mut self.h[row * m * (m + 1) + j * (m + 1)..][..m + 1];
        // Modified Gram–Schmidt against v_0..v_j.
        for i in 0..=j {
            let vi = &v[i * d..(i + 1) * d];
            let hij = dot(w, vi);
            col[i] = hij;
            axpy(w, -hij, vi);
        }
        let hn = norm(w);
        col[j + 1] = hn;
        let cs = &mut self.cs[row * m..][..m];
        let sn = &mut self.sn[row * m..][..m];
        for i in 0..j {
            let (a, b) = (col[i], col[i + 1]);
            col[i] = cs[i] * a + sn[i] * b;
            col[i + 1] = -sn[i] * a + cs[i] * b;
        }
        let (c, s, r) = givens(col[j], col[j + 1]);
        col[j] = r;
        col[j + 1] = 0.0;
        cs[j] = c;
        sn[j] = s;
        let g = &mut self.gamma[row * (m + 1)..][..m + 1];
        g[j + 1] = -s * g[j];
        g[j] *= c;
        let estimate = g[j + 1].abs();
        self.j[row] = j + 1;
        // A zero (or non-finite) h_{j+1,j}: the Krylov space holds the solution (or is lost).
        if hn == 0.0 || !hn.is_finite() || j + 1 == m {
            self.finish(row, x);
            return Advance::Restart(estimate);
        }
        let next = &mut v[(j + 1) * d..(j + 2) * d];
        for (ni, &wi) in next.iter_mut().zip(w.iter()) {
            *ni = wi / hn;
        }
        inp.copy_from_slice(next);
        Advance::Next(estimate)
    }
    fn finish(&mut self, row: usize, x: &mut [f64]) {
        let (m, d) = (self.m, self.dim);
        let k = std::mem::replace(&mut self.j[row], 0);
        if k == 0 {
            return;
        }
        let h = &self.h[row * m * (m + 1)..][..m * (m + 1)];
        let g = &self.gamma[row * (m + 1)..][..m + 1];
        // R y = γ[..k], R[i][l] = column l, entry i.
        let mut y = vec![0.0f64; k];
        for i in (0..k).rev() {
            let s: f64 = (i + 1..k).map(|l| h[l * (m + 1) + i] * y[l]).sum();
            y[i] = (g[i] - s) / h[i * (m + 1) + i];
        }
        let v = &self.v[row * (m + 1) * d..][..(m + 1) * d];
        for (i, &yi) in y.iter().enumerate() {
            axpy(x, yi, &v[i * d..(i + 1) * d]);
        }
    }
}
