//! Anderson acceleration (type II, Walker & Ni 2011) with per-row history.
//!
//! With residuals `g_k = f(z_k) − z_k` and the last `m` differences `ΔZ = [z_{i+1} − z_i]`,
//! `ΔG = [g_{i+1} − g_i]` of one row, each step solves the ridge least-squares problem
//! `γ = argmin ‖g_k − ΔG γ‖² + λ s ‖γ‖²` (s = mean diagonal of `ΔGᵀΔG`) and mixes
//! `z_{k+1} = z_k − ΔZ γ + β (g_k − ΔG γ)`.
//! The first step (no history yet) is a damped Picard step, so mixing starts at the 2nd map
//! evaluation. The Gram matrix `ΔGᵀΔG` is kept in f64 and updated incrementally (one new
//! row/column per step, `m` dot products of length D); the `m × m` system is solved by Cholesky in
//! f64. When Cholesky fails or the estimated condition number exceeds `max_condition`, that row's
//! history is dropped (restart) and a Picard step is taken.
//!
//! **Safeguard** (`safeguard: true`, off by default): an accelerated point is kept only when its
//! residual is at most `safeguard_factor` times the residual of the last accepted point;
//! otherwise the map evaluation it cost is written off, the history is dropped and the plain
//! (damped) step from the last accepted point is taken instead. This is the residual test of
//! the safeguarded, globally convergent Anderson variants (Zhang, O'Donoghue & Boyd, "Globally
//! convergent type-I Anderson acceleration for nonsmooth fixed-point iterations", SIAM J. Optim.
//! 30(4), 2020, Alg. 3, with the bound held constant; Peng et al., "Anderson acceleration for
//! geometry optimization and physics simulation", ACM TOG 37(4), 2018, which falls back to the
//! plain step when the merit increases): with a contractive map the accepted residuals never
//! grow. What it does **not** do is choose a branch: near a fold both the plain and the
//! safeguarded Anderson can reach a fixed point that repels the plain iteration (the
//! Chandrasekhar H-equation at c = 0.9999 in `tests/anderson.rs`), with residuals that shrink all
//! the way; `OutputOptions::spectral_radius_iters` tells such a point (ρ ≥ 1) from one on the
//! start's branch.

use ndarray::{ArrayView1, ArrayViewMut1};

use super::engine::{IterationRule, RuleSolver, StepEvent};
use super::kernels::dot2_f64;
use super::{cast, SolverFloat};
use crate::error::{Result, SolverError};
use crate::options::{check_beta, OutputOptions};

/// Anderson acceleration (type II) with per-row history.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct AndersonConfig {
    /// History length ≥ 1 (number of residual differences kept).
    pub history: usize,
    /// Ridge λ ≥ 0, relative to the mean diagonal of the Gram matrix.
    pub lambda: f64,
    /// Mixing β ∈ (0, 1].
    pub beta: f64,
    /// Restart a row's history when the estimated condition number of its (ridged) Gram matrix
    /// exceeds this.
    pub max_condition: f64,
    /// Keep an accelerated point only when its residual is at most `safeguard_factor` × the
    /// last accepted point's, else take the plain step from that point (see the module doc).
    pub safeguard: bool,
    /// The safeguard's bound on the residual ratio (> 0; 1 = the residual may not grow).
    pub safeguard_factor: f64,
    pub output: OutputOptions,
}

impl Default for AndersonConfig {
    fn default() -> Self {
        AndersonConfig {
            history: 5,
            lambda: 1e-10,
            beta: 1.0,
            max_condition: 1e12,
            safeguard: false,
            safeguard_factor: 1.0,
            output: OutputOptions::default(),
        }
    }
}

impl AndersonConfig {
    pub fn validate(&self) -> Result<()> {
        check_beta("beta", self.beta)?;
        if self.history == 0 {
            return Err(SolverError::config("history", "must be >= 1"));
        }
        if !(self.lambda.is_finite() && self.lambda >= 0.0) {
            return Err(SolverError::config(
                "lambda",
                format!("must be finite and >= 0, got {}", self.lambda),
            ));
        }
        if self.max_condition.is_nan() || self.max_condition <= 1.0 {
            return Err(SolverError::config("max_condition", "must be > 1"));
        }
        if !(self.safeguard_factor.is_finite() && self.safeguard_factor > 0.0) {
            return Err(SolverError::config(
                "safeguard_factor",
                format!("must be finite and > 0, got {}", self.safeguard_factor),
            ));
        }
        Ok(())
    }
}

/// Anderson-accelerated fixed-point solver.
#[derive(Clone, Debug)]
pub struct Anderson {
    pub config: AndersonConfig,
}

impl Anderson {
    pub fn new(config: AndersonConfig) -> Self {
        Anderson { config }
    }
}

/// Per-batch buffers, allocated once in `init`.
pub struct AndersonRule<T> {
    m: usize,
    lambda: f64,
    beta: T,
    max_condition: f64,
    /// `safeguard_factor` when the safeguard is on.
    safeguard: Option<f64>,
    dim: usize,
    /// `[B, m, D]` mixing directions `w_j = Δz_j + β Δg_j`.
    w: Vec<T>,
    /// `[B, m, D]` history of residual differences.
    dg: Vec<T>,
    /// `[B, m, m]` Gram matrix of `dg` (f64).
    gram: Vec<f64>,
    /// `[B, D]` previous iterate and residual.
    z_prev: Vec<T>,
    g_prev: Vec<T>,
    has_prev: Vec<bool>,
    /// `[B]` residual of the last accepted point (the anchor `z_prev`), and whether the point
    /// being evaluated came from an accelerated step (only those can be rejected).
    anchor_res: Vec<f64>,
    pending: Vec<bool>,
    count: Vec<usize>,
    head: Vec<usize>,
    /// Scratch: current residual `[D]`, system `[m, m]`, rhs/γ `[m]`.
    g: Vec<T>,
    chol: Vec<f64>,
    gamma: Vec<f64>,
}

impl<T: SolverFloat> AndersonRule<T> {
    fn new(cfg: &AndersonConfig) -> Self {
        AndersonRule {
            m: cfg.history,
            lambda: cfg.lambda,
            beta: cast(cfg.beta),
            max_condition: cfg.max_condition,
            safeguard: cfg.safeguard.then_some(cfg.safeguard_factor),
            dim: 0,
            w: Vec::new(),
            dg: Vec::new(),
            gram: Vec::new(),
            z_prev: Vec::new(),
            g_prev: Vec::new(),
            has_prev: Vec::new(),
            anchor_res: Vec::new(),
            pending: Vec::new(),
            count: Vec::new(),
            head: Vec::new(),
            g: Vec::new(),
            chol: Vec::new(),
            gamma: Vec::new(),
        }
    }

    /// Solves `(G + λ s I) γ = rhs` for the first `n` history slots of `row` into `self.gamma`.
    /// Returns false when the system is singular or too ill-conditioned.
    fn solve_small(&mut self, row: usize, n: usize) -> bool {
        let m = self.m;
        let gram = &self.gram[row * m * m..(row + 1) * m * m];
        let mean_diag = (0..n).map(|i| gram[i * m + i]).sum::<f64>() / n as f64;
        if !(mean_diag > 0.0 && mean_diag.is_finite()) {
            return false;
        }
        let ridge = self.lambda * mean_diag;
        // Cholesky A = L Lᵀ, L stored in the lower triangle of `chol` (row-major n×n).
        let a = &mut self.chol;
        for i in 0..n {
            for j in 0..=i {
                let mut s = gram[i * m + j] + if i == j { ridge } else { 0.0 };
                for k in 0..j {
                    s -= a[i * n + k] * a[j * n + k];
                }
                if i == j {
                    if s.is_nan() || s <= 0.0 {
                        return false;
                    }
                    a[i * n + i] = s.sqrt();
                } else {
                    a[i * n + j] = s / a[j * n + j];
                }
            }
        }
        // cond(A) ≥ (max L_ii / min L_ii)²: a cheap lower bound used as the conditioning check.
        let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
        for i in 0..n {
            lo = lo.min(a[i * n + i]);
            hi = hi.max(a[i * n + i]);
        }
        if (hi / lo).powi(2) > self.max_condition {
            return false;
        }
        // Forward then backward substitution, in place in gamma (holding rhs on entry).
        let x = &mut self.gamma;
        for i in 0..n {
            let mut s = x[i];
            for k in 0..i {
                s -= a[i * n + k] * x[k];
            }
            x[i] = s / a[i * n + i];
        }
        for i in (0..n).rev() {
            let mut s = x[i];
            for k in i + 1..n {
                s -= a[k * n + i] * x[k];
            }
            x[i] = s / a[i * n + i];
        }
        x[..n].iter().all(|v| v.is_finite())
    }
}

impl<T: SolverFloat> IterationRule<T> for AndersonRule<T> {
    fn state_bytes(&self, batch: usize, dim: usize) -> (&'static str, u128) {
        use crate::error::bytes_of;
        let t = std::mem::size_of::<T>();
        let bytes = bytes_of(2 * t, &[batch, self.m, dim])
            .saturating_add(bytes_of(8, &[batch, self.m, self.m]));
        ("history", bytes)
    }
    fn init(&mut self, batch: usize, dim: usize) {
        use super::engine::refill;
        let m = self.m;
        self.dim = dim;
        refill(&mut self.w, batch * m * dim, T::zero());
        refill(&mut self.dg, batch * m * dim, T::zero());
        refill(&mut self.gram, batch * m * m, 0.0);
        refill(&mut self.z_prev, batch * dim, T::zero());
        refill(&mut self.g_prev, batch * dim, T::zero());
        refill(&mut self.has_prev, batch, false);
        refill(&mut self.anchor_res, batch, f64::INFINITY);
        refill(&mut self.pending, batch, false);
        refill(&mut self.count, batch, 0);
        refill(&mut self.head, batch, 0);
        refill(&mut self.g, dim, T::zero());
        refill(&mut self.chol, m * m, 0.0);
        refill(&mut self.gamma, m, 0.0);
    }

    fn step(
        &mut self,
        row: usize,
        mut z: ArrayViewMut1<T>,
        fz: ArrayView1<T>,
        residual: f64,
    ) -> StepEvent {
        let z = z.as_slice_mut().expect("solver rows are contiguous");
        let fz = fz.as_slice().expect("solver rows are contiguous");
        if let Some(factor) = self.safeguard {
            let accelerated = std::mem::replace(&mut self.pending[row], false);
            if accelerated && residual > factor * self.anchor_res[row] {
                self.reject(row, z);
                return StepEvent::Rejected;
            }
            self.anchor_res[row] = residual;
        }
        #[cfg(target_arch = "x86_64")]
        if super::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { self.step_avx2(row, z, fz) };
        }
        self.step_impl(row, z, fz)
    }
}

impl<T: SolverFloat> AndersonRule<T> {
    /// The safeguard refused the point just evaluated: back to the last accepted point
    /// (`z_prev`, residual `g_prev`), its plain step, and an empty history.
    fn reject(&mut self, row: usize, z: &mut [T]) {
        let d = self.dim;
        let (zp, gp) = (
            &self.z_prev[row * d..(row + 1) * d],
            &self.g_prev[row * d..(row + 1) * d],
        );
        for i in 0..d {
            z[i] = zp[i] + self.beta * gp[i];
        }
        self.count[row] = 0;
        self.head[row] = 0;
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn step_avx2(&mut self, row: usize, z: &mut [T], fz: &[T]) -> StepEvent {
        self.step_impl(row, z, fz)
    }

    /// One Anderson step of `row`; `z`, `fz`: `[D]`.
    #[inline(always)]
    fn step_impl(&mut self, row: usize, z: &mut [T], fz: &[T]) -> StepEvent {
        let (m, d) = (self.m, self.dim);
        let beta = self.beta;
        // Length-d reslices let the compiler drop bounds checks and vectorise the loops below.
        let (z, fz) = (&mut z[..d], &fz[..d]);
        let hist = row * m * d;
        let has_prev = self.has_prev[row];
        let slot = self.head[row];
        let off = hist + slot * d;
        {
            // One fused pass: residual, new history column, and the (z, g) anchor.
            let zp = &mut self.z_prev[row * d..(row + 1) * d];
            let gp = &mut self.g_prev[row * d..(row + 1) * d];
            let g = &mut self.g[..d];
            if has_prev {
                let dg = &mut self.dg[off..off + d];
                let w = &mut self.w[off..off + d];
                for i in 0..d {
                    let gi = fz[i] - z[i];
                    let dgi = gi - gp[i];
                    dg[i] = dgi;
                    w[i] = (z[i] - zp[i]) + beta * dgi;
                    g[i] = gi;
                    zp[i] = z[i];
                    gp[i] = gi;
                }
            } else {
                for i in 0..d {
                    let gi = fz[i] - z[i];
                    g[i] = gi;
                    zp[i] = z[i];
                    gp[i] = gi;
                }
            }
        }
        self.has_prev[row] = true;
        if has_prev {
            self.count[row] = (self.count[row] + 1).min(m);
            self.head[row] = (slot + 1) % m;
            // Incremental Gram update (only the new slot's row/column changes) fused with the
            // right-hand side ΔGᵀ g: one pass over each stored column.
            let gram = &mut self.gram[row * m * m..(row + 1) * m * m];
            let new = &self.dg[off..off + d];
            for j in 0..self.count[row] {
                let other = &self.dg[hist + j * d..hist + (j + 1) * d];
                let (vg, vr) = dot2_f64(other, new, &self.g);
                gram[slot * m + j] = vg;
                gram[j * m + slot] = vg;
                self.gamma[j] = vr;
            }
        }
        let n = self.count[row];
        if n > 0 {
            if self.solve_small(row, n) {
                // z ← z + β g − Σ_j γ_j w_j,  w_j = Δz_j + β Δg_j
                // Two columns per pass halves the read/write traffic on z.
                let g = &self.g[..d];
                for i in 0..d {
                    z[i] = z[i] + beta * g[i];
                }
                let mut j = 0;
                while j + 1 < n {
                    let (ga, gb): (T, T) = (cast(self.gamma[j]), cast(self.gamma[j + 1]));
                    let wa = &self.w[hist + j * d..hist + (j + 1) * d];
                    let wa = &wa[..d];
                    let wb = &self.w[hist + (j + 1) * d..hist + (j + 2) * d];
                    for i in 0..d {
                        z[i] = z[i] - (ga * wa[i] + gb * wb[i]);
                    }
                    j += 2;
                }
                if j < n {
                    let gj: T = cast(self.gamma[j]);
                    let wj = &self.w[hist + j * d..hist + (j + 1) * d];
                    for i in 0..d {
                        z[i] = z[i] - gj * wj[i];
                    }
                }
                self.pending[row] = self.safeguard.is_some();
                return StepEvent::Normal;
            }
            // Singular / ill-conditioned: restart this row's history, keep (z, g) as anchor.
            self.count[row] = 0;
            self.head[row] = 0;
            let g = &self.g[..d];
            for i in 0..d {
                z[i] = z[i] + beta * g[i];
            }
            return StepEvent::Restart;
        }
        // No history yet (first step, or the one after a restart): the Picard step is the rule.
        let g = &self.g[..d];
        for i in 0..d {
            z[i] = z[i] + beta * g[i];
        }
        StepEvent::Normal
    }
}

impl RuleSolver for Anderson {
    type Rule<T: SolverFloat> = AndersonRule<T>;
    fn name(&self) -> &'static str {
        "anderson"
    }
    fn validate(&self) -> Result<()> {
        self.config.validate()
    }
    fn output(&self) -> &OutputOptions {
        &self.config.output
    }
    fn rule<T: SolverFloat>(&self) -> AndersonRule<T> {
        AndersonRule::new(&self.config)
    }
    // The kept buffers are resized by `init`; only the settings are taken anew.
    fn configure<T: SolverFloat>(&self, rule: &mut AndersonRule<T>) {
        let fresh = AndersonRule::<T>::new(&self.config);
        (
            rule.m,
            rule.lambda,
            rule.beta,
            rule.max_condition,
            rule.safeguard,
        ) = (
            fresh.m,
            fresh.lambda,
            fresh.beta,
            fresh.max_condition,
            fresh.safeguard,
        );
    }
}
