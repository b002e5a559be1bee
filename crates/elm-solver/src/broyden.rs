//! "Good" Broyden on `g(z) = f(z) − z = 0` with a limited-memory inverse Jacobian.
//!
//! `H ≈ (∂g/∂z)⁻¹` is kept as `H = −β I + Σ_j u_j v_jᵀ` with at most `L` pairs per row; when the
//! memory is full the row restarts from `H = −β I`, so memory is `2·L·D` per row whatever
//! `max_iter` is.
//! Step: `z ← z − H g`. After each accepted step, with `s = z_new − z_old`, `y = g_new − g_old`,
//! the good-Broyden inverse update (Sherman–Morrison form) appends
//! `u = (s − H y) / (sᵀ H y)`, `v = Hᵀ s`.
//! Backtracking (optional): when the new residual exceeds `backtrack_growth ×` the last accepted
//! one, the step is halved (no Jacobian update) up to `max_backtracks` times; each halving costs
//! one map evaluation. If it still grows, the point is accepted and the memory cleared.

use ndarray::{ArrayView1, ArrayViewMut1};

use super::engine::{IterationRule, RuleSolver, StepEvent};
use super::kernels::{dot2_mixed, dot_mixed};
use super::{cast, SolverFloat};
use crate::error::{Result, SolverError};
use crate::options::{check_beta, OutputOptions};

/// "Good" Broyden with a limited-memory inverse Jacobian.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct BroydenConfig {
    /// Memory L ≥ 1: rank-one updates kept (oldest overwritten first).
    pub memory: usize,
    /// Initial inverse Jacobian of `g(z) = f(z) − z` is `−β·I`, so the first step is a damped
    /// Picard step.
    pub beta: f64,
    /// Halve the step (up to `max_backtracks` times) when the residual grows by more than
    /// `backtrack_growth`×. Off by default: Broyden's residual is not monotone, and measured on
    /// the canonical problems backtracking with growth 1 cost up to 100× more evaluations.
    pub backtrack: bool,
    pub backtrack_growth: f64,
    pub max_backtracks: usize,
    pub output: OutputOptions,
}

impl Default for BroydenConfig {
    fn default() -> Self {
        BroydenConfig {
            memory: 10,
            beta: 1.0,
            backtrack: false,
            backtrack_growth: 10.0,
            max_backtracks: 4,
            output: OutputOptions::default(),
        }
    }
}

impl BroydenConfig {
    pub fn validate(&self) -> Result<()> {
        check_beta("beta", self.beta)?;
        if self.memory == 0 {
            return Err(SolverError::config("memory", "must be >= 1"));
        }
        if !(self.backtrack_growth.is_finite() && self.backtrack_growth >= 1.0) {
            return Err(SolverError::config(
                "backtrack_growth",
                "must be finite and >= 1",
            ));
        }
        Ok(())
    }
}

/// Limited-memory good-Broyden solver.
#[derive(Clone, Debug)]
pub struct Broyden {
    pub config: BroydenConfig,
}

impl Broyden {
    pub fn new(config: BroydenConfig) -> Self {
        Broyden { config }
    }
}

pub struct BroydenRule<T> {
    cfg: BroydenConfig,
    beta: f64,
    dim: usize,
    /// `[B, L, D]` low-rank factors of H.
    u: Vec<T>,
    v: Vec<T>,
    /// `[B, D]` last accepted iterate and its residual.
    z_prev: Vec<T>,
    g_prev: Vec<T>,
    res_prev: Vec<f64>,
    has_prev: Vec<bool>,
    backtracks: Vec<usize>,
    count: Vec<usize>,
    head: Vec<usize>,
    /// Scratch `[D]` (f64 for accuracy of the small-memory products) and `[L]`.
    g: Vec<f64>,
    s: Vec<f64>,
    y: Vec<f64>,
    hy: Vec<f64>,
    hts: Vec<f64>,
    hg: Vec<f64>,
    coef: Vec<f64>,
}

impl<T: SolverFloat> BroydenRule<T> {
    /// Settings of `cfg`, no buffers yet (`init` sizes them).
    fn new(cfg: &BroydenConfig) -> Self {
        BroydenRule {
            cfg: cfg.clone(),
            beta: cfg.beta,
            dim: 0,
            u: Vec::new(),
            v: Vec::new(),
            z_prev: Vec::new(),
            g_prev: Vec::new(),
            res_prev: Vec::new(),
            has_prev: Vec::new(),
            backtracks: Vec::new(),
            count: Vec::new(),
            head: Vec::new(),
            g: Vec::new(),
            s: Vec::new(),
            y: Vec::new(),
            hy: Vec::new(),
            hts: Vec::new(),
            hg: Vec::new(),
            coef: Vec::new(),
        }
    }

    /// `hg = −β g` (H with empty memory).
    fn set_hg_initial(&mut self) {
        for (h, g) in self.hg.iter_mut().zip(&self.g) {
            *h = -self.beta * g;
        }
    }

    /// `hy = H y` and `hg = H g` in one sweep over the stored pairs.
    fn apply_h_to_y_and_g(&mut self, row: usize) {
        let (l, d, n) = (self.cfg.memory, self.dim, self.count[row]);
        let base = row * l * d;
        let beta = self.beta;
        let (y, g) = (&self.y[..d], &self.g[..d]);
        let (hy, hg) = (&mut self.hy[..d], &mut self.hg[..d]);
        for i in 0..d {
            hy[i] = -beta * y[i];
            hg[i] = -beta * g[i];
        }
        for j in 0..n {
            let vj = &self.v[base + j * d..base + (j + 1) * d];
            let (cy, cg) = dot2_mixed(vj, y, g);
            let uj = &self.u[base + j * d..base + (j + 1) * d];
            for i in 0..d {
                let x = uj[i].widen();
                hy[i] += cy * x;
                hg[i] += cg * x;
            }
        }
    }

    /// `hts = Hᵀ s = −β s + Σ_j v_j (u_j · s)` for `row`.
    fn apply_ht_to_s(&mut self, row: usize) {
        let (l, d, n) = (self.cfg.memory, self.dim, self.count[row]);
        let base = row * l * d;
        for j in 0..n {
            self.coef[j] = dot_mixed(&self.u[base + j * d..base + (j + 1) * d], &self.s);
        }
        let beta = self.beta;
        let (s, hts) = (&self.s[..d], &mut self.hts[..d]);
        for i in 0..d {
            hts[i] = -beta * s[i];
        }
        for j in 0..n {
            let c = self.coef[j];
            let vj = &self.v[base + j * d..base + (j + 1) * d];
            for i in 0..d {
                hts[i] += c * vj[i].widen();
            }
        }
    }
}

impl<T: SolverFloat> IterationRule<T> for BroydenRule<T> {
    fn state_bytes(&self, batch: usize, dim: usize) -> (&'static str, u128) {
        let t = std::mem::size_of::<T>();
        (
            "memory",
            crate::error::bytes_of(2 * t, &[batch, self.cfg.memory, dim]),
        )
    }
    fn init(&mut self, batch: usize, dim: usize) {
        use super::engine::refill;
        let l = self.cfg.memory;
        self.dim = dim;
        refill(&mut self.u, batch * l * dim, T::zero());
        refill(&mut self.v, batch * l * dim, T::zero());
        refill(&mut self.z_prev, batch * dim, T::zero());
        refill(&mut self.g_prev, batch * dim, T::zero());
        refill(&mut self.res_prev, batch, f64::INFINITY);
        refill(&mut self.has_prev, batch, false);
        refill(&mut self.backtracks, batch, 0);
        refill(&mut self.count, batch, 0);
        refill(&mut self.head, batch, 0);
        for buf in [
            &mut self.g,
            &mut self.s,
            &mut self.y,
            &mut self.hy,
            &mut self.hts,
            &mut self.hg,
        ] {
            refill(buf, dim, 0.0);
        }
        refill(&mut self.coef, l, 0.0);
    }

    fn step(
        &mut self,
        row: usize,
        mut z: ArrayViewMut1<T>,
        fz: ArrayView1<T>,
        res: f64,
    ) -> StepEvent {
        let z = z.as_slice_mut().expect("solver rows are contiguous");
        let fz = fz.as_slice().expect("solver rows are contiguous");
        #[cfg(target_arch = "x86_64")]
        if super::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { self.step_avx2(row, z, fz, res) };
        }
        self.step_impl(row, z, fz, res)
    }
}

impl<T: SolverFloat> BroydenRule<T> {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn step_avx2(&mut self, row: usize, z: &mut [T], fz: &[T], res: f64) -> StepEvent {
        self.step_impl(row, z, fz, res)
    }

    /// One Broyden step of `row`; `z`, `fz`: `[D]`.
    #[inline(always)]
    fn step_impl(&mut self, row: usize, z: &mut [T], fz: &[T], res: f64) -> StepEvent {
        let (l, d) = (self.cfg.memory, self.dim);
        let mut event = StepEvent::Normal;
        let (z, fz) = (&mut z[..d], &fz[..d]);
        let r = row * d..(row + 1) * d;

        if self.has_prev[row] {
            let grew = res > self.cfg.backtrack_growth * self.res_prev[row];
            if self.cfg.backtrack && grew && self.backtracks[row] < self.cfg.max_backtracks {
                // Halve the step back towards the last accepted point; no Jacobian update.
                self.backtracks[row] += 1;
                let zp = &self.z_prev[r];
                let half: T = cast(0.5);
                for i in 0..d {
                    z[i] = zp[i] + half * (z[i] - zp[i]);
                }
                return StepEvent::Backtrack;
            }
            let gave_up = self.cfg.backtrack && grew;
            self.backtracks[row] = 0;
            for i in 0..d {
                let zi = z[i].widen();
                let gi = fz[i].widen() - zi;
                self.g[i] = gi;
                self.s[i] = zi - self.z_prev[r.start + i].widen();
                self.y[i] = gi - self.g_prev[r.start + i].widen();
            }
            if gave_up {
                // The model of the Jacobian failed: forget it.
                self.count[row] = 0;
                self.head[row] = 0;
                event = StepEvent::Restart;
            } else {
                if self.count[row] == l {
                    event = StepEvent::Restart;
                    // Memory full: restart from H = −βI (overwriting the oldest pair instead
                    // leaves an H no secant condition supports and diverges on hard problems).
                    self.count[row] = 0;
                    self.head[row] = 0;
                }
                self.apply_h_to_y_and_g(row);
                self.apply_ht_to_s(row);
                let denom = dot_mixed(&self.s, &self.hy);
                let s2 = dot_mixed(&self.s, &self.s);
                let hy2 = dot_mixed(&self.hy, &self.hy);
                if denom.is_finite() && denom.abs() > 1e-12 * (s2 * hy2).sqrt() && s2 > 0.0 {
                    let slot = self.head[row];
                    let off = row * l * d + slot * d;
                    for i in 0..d {
                        self.u[off + i] = cast((self.s[i] - self.hy[i]) / denom);
                        self.v[off + i] = cast(self.hts[i]);
                    }
                    self.head[row] = (slot + 1) % l;
                    self.count[row] = (self.count[row] + 1).min(l);
                    // H_new g = H g + u (vᵀ g): no extra sweep over the memory.
                    let c = dot_mixed(&self.hts, &self.g);
                    for i in 0..d {
                        self.hg[i] += (self.s[i] - self.hy[i]) / denom * c;
                    }
                } else {
                    self.count[row] = 0;
                    self.head[row] = 0;
                    self.set_hg_initial();
                    event = StepEvent::Restart;
                }
            }
            if gave_up {
                self.set_hg_initial();
            }
        } else {
            for i in 0..d {
                self.g[i] = fz[i].widen() - z[i].widen();
            }
            self.set_hg_initial();
        }
        // Accept the current point.
        self.z_prev[r.clone()].copy_from_slice(z);
        for i in 0..d {
            self.g_prev[r.start + i] = cast(self.g[i]);
        }
        self.res_prev[row] = res;
        self.has_prev[row] = true;
        // z ← z − H g
        for i in 0..d {
            z[i] = cast(z[i].widen() - self.hg[i]);
        }
        event
    }
}

impl RuleSolver for Broyden {
    type Rule<T: SolverFloat> = BroydenRule<T>;
    fn name(&self) -> &'static str {
        "broyden"
    }
    fn validate(&self) -> Result<()> {
        self.config.validate()
    }
    fn output(&self) -> &OutputOptions {
        &self.config.output
    }
    fn rule<T: SolverFloat>(&self) -> BroydenRule<T> {
        BroydenRule::new(&self.config)
    }
    // The kept buffers are resized by `init`; only the settings are taken anew.
    fn configure<T: SolverFloat>(&self, rule: &mut BroydenRule<T>) {
        rule.cfg.clone_from(&self.config);
        rule.beta = self.config.beta;
    }
}
