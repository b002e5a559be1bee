//! The shared iteration skeleton: init → (evaluate → terminate? → step)* → report.
//!
//! Every solver is an [`IterationRule`] (how to move one row given `z` and `f(z)`); the loop,
//! per-row stopping, freezing, best-iterate tracking, traces, observers and the spectral-radius
//! estimate live here once.

use ndarray::{Array2, ArrayView1, ArrayView2, ArrayViewMut1};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::{
    cast, FixedPointMap, FixedPointSolver, IterationInfo, NoObserver, Observer, RowOutcome,
    RowStatus, Solution, SolverFloat,
};
use crate::error::{Result, SolverError};
use crate::options::{OutputOptions, ResidualNorm, StopCriteria};

/// What a step did besides moving the row; counted into the row's [`RowOutcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEvent {
    /// The rule's own update.
    Normal,
    /// History dropped, plain (damped) step taken instead.
    Restart,
    /// Step halved back towards the last accepted point.
    Backtrack,
    /// The point just evaluated (an accelerated step) failed the safeguard: the plain step from
    /// the last accepted point is taken instead (Anderson's `safeguard`).
    Rejected,
}

/// How a solver moves one row. State is per row; the driver calls `step` only for rows that are
/// still active, after they passed the stop test.
pub trait IterationRule<T: SolverFloat> {
    /// Allocates all per-row buffers for a batch of `batch` rows of width `dim` (called once per
    /// solve, so `step` never allocates).
    fn init(&mut self, batch: usize, dim: usize);
    /// What [`IterationRule::init`] will allocate for `batch` rows of width `dim`: the config
    /// field that scales it and its bytes (saturating), checked against the memory budget first.
    fn state_bytes(&self, _batch: usize, _dim: usize) -> (&'static str, u128) {
        ("solver", 0)
    }
    /// Overwrites `z` (the point where `fz = f(z)` was evaluated, `residual = ‖fz − z‖₂`) with the
    /// next iterate of row `row`. `z`, `fz`: `[D]`, contiguous.
    fn step(
        &mut self,
        row: usize,
        z: ArrayViewMut1<T>,
        fz: ArrayView1<T>,
        residual: f64,
    ) -> StepEvent;
}

/// A fixed-point solver that is one [`IterationRule`] run by this engine: what it states (its
/// name, config check, output options, how to make its rule and bring a kept one up to date)
/// gives it [`FixedPointSolver`] for every state type, with `solve_observed` in fresh buffers
/// and `solve_in` reusing the workspace and the rule kept there by the previous solve. The
/// built-in solvers are written this way; so may a solver of the user's.
///
/// The trait is not generic over the state type (its rule is), so that no other crate can
/// implement it for a type of this one and a solver that implements [`FixedPointSolver`] by
/// hand keeps doing so.
pub trait RuleSolver {
    /// The per-row state and update for states of type `T`; kept in a [`SolveWorkspace`]
    /// between solves.
    type Rule<T: SolverFloat>: IterationRule<T> + Send + 'static;
    /// Short name ([`FixedPointSolver::name`]).
    fn name(&self) -> &'static str;
    /// Checks the config's value ranges; called before every solve.
    fn validate(&self) -> Result<()>;
    /// What a solve returns besides the state.
    fn output(&self) -> &OutputOptions;
    /// A new rule with this solver's settings (no buffers yet: `init` allocates them).
    fn rule<T: SolverFloat>(&self) -> Self::Rule<T>;
    /// Takes this solver's settings into a rule kept from an earlier solve, keeping its buffers
    /// (`init` resizes them), so that repeated solves of one shape allocate nothing.
    fn configure<T: SolverFloat>(&self, rule: &mut Self::Rule<T>);
}

impl<T: SolverFloat, S: RuleSolver> FixedPointSolver<T> for S {
    fn name(&self) -> &'static str {
        RuleSolver::name(self)
    }
    fn solve_observed(
        &self,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        stop: &StopCriteria,
        observer: &mut dyn Observer<T>,
    ) -> Result<Solution<T>> {
        self.validate()?;
        run_fixed_point(
            &mut self.rule::<T>(),
            stop,
            self.output(),
            map,
            z0,
            observer,
        )
    }
    fn solve_in(
        &self,
        ws: &mut SolveWorkspace<T>,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        stop: &StopCriteria,
    ) -> Result<()> {
        self.validate()?;
        ws.run_with_rule(
            || self.rule::<T>(),
            |r| self.configure::<T>(r),
            stop,
            self.output(),
            map,
            z0,
            &mut NoObserver,
        )
    }
}

/// Every buffer of a batched solve, kept between solves so that a caller that solves once per
/// token (an ELM decode session) allocates nothing after its first solve of a given shape:
/// vectors are cleared and refilled within their capacity, matrices kept while the shape holds,
/// and the solver's own per-row state (its [`IterationRule`]) kept in the slot it last used.
/// The result of the last solve is read from it ([`SolveWorkspace::z`], [`SolveWorkspace::rows`]).
pub struct SolveWorkspace<T> {
    z: Array2<T>,
    fz: Array2<T>,
    best_z: Array2<T>,
    best_res: Vec<f64>,
    best_rel: Vec<f64>,
    res: Vec<f64>,
    rel: Vec<f64>,
    first_res: Vec<f64>,
    iterations: Vec<usize>,
    restarts: Vec<usize>,
    backtracks: Vec<usize>,
    rejections: Vec<usize>,
    status: Vec<Option<RowStatus>>,
    active: Vec<bool>,
    traces: Vec<Vec<f64>>,
    spectral: Vec<Option<f64>>,
    rows: Vec<RowOutcome>,
    map_evals: usize,
    spectral_map_evals: usize,
    /// Largest rule state already checked against the memory budget (the check reads
    /// /proc/meminfo, which a solve per token must not do each time).
    checked_bytes: u128,
    /// The iteration rule of the solver that last used this workspace.
    rule: Option<Box<dyn std::any::Any + Send>>,
}

impl<T: SolverFloat> Default for SolveWorkspace<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// `v` as `n` copies of `x`, within its capacity when it suffices.
pub(crate) fn refill<X: Clone>(v: &mut Vec<X>, n: usize, x: X) {
    v.clear();
    v.resize(n, x);
}

/// `a` as a `[rows, cols]` matrix; reallocated only when the shape changes (contents are
/// overwritten by the caller).
fn reshape<T: SolverFloat>(a: &mut Array2<T>, rows: usize, cols: usize) {
    if a.dim() != (rows, cols) {
        *a = Array2::zeros((rows, cols));
    }
}

impl<T: SolverFloat> SolveWorkspace<T> {
    pub fn new() -> Self {
        SolveWorkspace {
            z: Array2::zeros((0, 0)),
            fz: Array2::zeros((0, 0)),
            best_z: Array2::zeros((0, 0)),
            best_res: vec![],
            best_rel: vec![],
            res: vec![],
            rel: vec![],
            first_res: vec![],
            iterations: vec![],
            restarts: vec![],
            backtracks: vec![],
            rejections: vec![],
            status: vec![],
            active: vec![],
            traces: vec![],
            spectral: vec![],
            rows: vec![],
            map_evals: 0,
            spectral_map_evals: 0,
            checked_bytes: 0,
            rule: None,
        }
    }

    /// `[B, D]`: the last solve's returned iterate per row (see [`OutputOptions::return_best`]).
    pub fn z(&self) -> ArrayView2<'_, T> {
        self.z.view()
    }

    /// The last solve's outcome per row.
    pub fn rows(&self) -> &[RowOutcome] {
        &self.rows
    }

    /// Batched map calls of the last solve's iteration.
    pub fn map_evals(&self) -> usize {
        self.map_evals
    }

    /// The last solve as an owned [`Solution`] (copies `z` and the row outcomes).
    pub fn to_solution(&self) -> Solution<T> {
        Solution {
            z: self.z.clone(),
            rows: self.rows.clone(),
            map_evals: self.map_evals,
            spectral_map_evals: self.spectral_map_evals,
        }
    }

    /// Stores a solution computed elsewhere as this workspace's result.
    pub fn set_solution(&mut self, s: Solution<T>) {
        self.z = s.z;
        self.rows = s.rows;
        self.map_evals = s.map_evals;
        self.spectral_map_evals = s.spectral_map_evals;
    }

    /// Runs `rule` of type `R` (the one kept from the previous solve, or `make()` when the
    /// previous solve used another rule) with `configure` applied first, on `map` from `z0`.
    #[allow(clippy::too_many_arguments)] // `run`'s inputs plus how to make and set the rule
    pub fn run_with_rule<R>(
        &mut self,
        make: impl FnOnce() -> R,
        configure: impl FnOnce(&mut R),
        stop: &StopCriteria,
        output: &OutputOptions,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        observer: &mut dyn Observer<T>,
    ) -> Result<()>
    where
        R: IterationRule<T> + Send + 'static,
    {
        let mut slot = self.rule.take();
        if !slot.as_ref().is_some_and(|r| r.is::<R>()) {
            slot = Some(Box::new(make()));
        }
        let rule = slot
            .as_mut()
            .and_then(|r| r.downcast_mut::<R>())
            .expect("the slot holds an R: set just above");
        configure(rule);
        let result = self.run(rule, stop, output, map, z0, observer);
        self.rule = slot;
        result
    }

    /// Runs `rule` on `map` from `z0 [B, D]` until every row stops (see the [crate docs](crate) for
    /// the stop criteria); the result stays in the workspace.
    pub fn run(
        &mut self,
        rule: &mut dyn IterationRule<T>,
        stop: &StopCriteria,
        output: &OutputOptions,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        observer: &mut dyn Observer<T>,
    ) -> Result<()> {
        stop.validate()?;
        let (batch, dim) = z0.dim();
        if dim != map.dim() {
            return Err(SolverError::shape(
                "fixed-point solve",
                format!("z0 is [{batch}, {dim}] but the map has dim {}", map.dim()),
            ));
        }
        // Standard-layout buffers: rows are contiguous slices for the rules.
        reshape(&mut self.z, batch, dim);
        self.z.assign(&z0);
        reshape(&mut self.fz, batch, dim);
        if output.return_best {
            reshape(&mut self.best_z, batch, dim);
            self.best_z.assign(&z0);
        }
        refill(&mut self.best_res, batch, f64::INFINITY);
        refill(&mut self.best_rel, batch, f64::NAN);
        refill(&mut self.res, batch, f64::NAN);
        refill(&mut self.rel, batch, f64::NAN);
        refill(&mut self.first_res, batch, f64::NAN);
        refill(&mut self.iterations, batch, 0);
        refill(&mut self.restarts, batch, 0);
        refill(&mut self.backtracks, batch, 0);
        refill(&mut self.rejections, batch, 0);
        refill(&mut self.status, batch, None);
        refill(&mut self.active, batch, true);
        refill(&mut self.spectral, batch, None);
        self.traces.clear();
        if output.trace {
            self.traces
                .resize_with(batch, || Vec::with_capacity(stop.max_iter.min(4096)));
        }
        let (field, bytes) = rule.state_bytes(batch, dim);
        if bytes > self.checked_bytes {
            crate::error::check_alloc(field, bytes)?;
            self.checked_bytes = bytes;
        }
        rule.init(batch, dim);

        let SolveWorkspace {
            z,
            fz,
            best_z,
            best_res,
            best_rel,
            res,
            rel,
            first_res,
            iterations,
            restarts,
            backtracks,
            rejections,
            status,
            active,
            traces,
            spectral,
            rows,
            ..
        } = self;
        let mut map_evals = 0usize;
        let mut n_active = batch;
        while n_active > 0 {
            map.eval(z.view(), active, fz.view_mut())?;
            map_evals += 1;
            for b in 0..batch {
                if !active[b] {
                    continue;
                }
                iterations[b] += 1;
                let (abs, rel_b) = residual_norms(z.row(b), fz.row(b), stop.rel_eps, stop.norm);
                res[b] = abs;
                rel[b] = rel_b;
                if output.trace {
                    traces[b].push(abs);
                }
                let verdict = if abs.is_nan() || rel_b.is_nan() {
                    Some(RowStatus::NonFinite)
                } else {
                    if first_res[b].is_nan() {
                        first_res[b] = abs;
                    }
                    if output.return_best && abs < best_res[b] {
                        best_res[b] = abs;
                        best_rel[b] = rel_b;
                        best_z.row_mut(b).assign(&z.row(b));
                    }
                    if stop.met(abs, rel_b) {
                        Some(RowStatus::Converged)
                    } else if abs.is_infinite()
                        || abs > stop.divergence_factor * first_res[b].max(1e-30)
                    {
                        Some(RowStatus::Diverged)
                    } else if iterations[b] >= stop.max_iter {
                        Some(RowStatus::MaxIter)
                    } else {
                        None
                    }
                };
                match verdict {
                    Some(s) => {
                        // Freeze: z keeps the last evaluated iterate, the map sees the row inactive.
                        status[b] = Some(s);
                        active[b] = false;
                        n_active -= 1;
                    }
                    None => match rule.step(b, z.row_mut(b), fz.row(b), abs) {
                        StepEvent::Normal => {}
                        StepEvent::Restart => restarts[b] += 1,
                        StepEvent::Backtrack => backtracks[b] += 1,
                        StepEvent::Rejected => rejections[b] += 1,
                    },
                }
            }
            observer.observe(&IterationInfo {
                map_evals,
                z: z.view(),
                residuals: res,
                rel_residuals: rel,
                active,
            });
        }

        if output.return_best {
            for b in 0..batch {
                if best_res[b].is_finite() {
                    z.row_mut(b).assign(&best_z.row(b));
                    res[b] = best_res[b];
                    rel[b] = best_rel[b];
                }
            }
        }

        let mut spectral_map_evals = 0;
        if output.spectral_radius_iters > 0 {
            let eligible: Vec<bool> = (0..batch).map(|b| res[b].is_finite()).collect();
            spectral_map_evals = estimate_spectral_radius(
                map,
                z.view(),
                &eligible,
                output.spectral_radius_iters,
                output.seed,
                spectral,
            )?;
        }

        rows.clear();
        rows.extend((0..batch).map(|b| RowOutcome {
            status: status[b].unwrap_or(RowStatus::MaxIter),
            iterations: iterations[b],
            residual: res[b],
            rel_residual: rel[b],
            trace: if output.trace {
                Some(std::mem::take(&mut traces[b]))
            } else {
                None
            },
            spectral_radius: spectral[b],
            restarts: restarts[b],
            backtracks: backtracks[b],
            rejections: rejections[b],
        }));
        self.map_evals = map_evals;
        self.spectral_map_evals = spectral_map_evals;
        Ok(())
    }

    /// Moves the last solve out as a [`Solution`] (the workspace keeps empty buffers).
    fn into_solution(self) -> Solution<T> {
        Solution {
            z: self.z,
            rows: self.rows,
            map_evals: self.map_evals,
            spectral_map_evals: self.spectral_map_evals,
        }
    }
}

/// Runs `rule` on `map` from `z0 [B, D]` until every row stops, in fresh buffers (see
/// [`SolveWorkspace`] to reuse them across solves).
pub fn run_fixed_point<T: SolverFloat>(
    rule: &mut dyn IterationRule<T>,
    stop: &StopCriteria,
    output: &OutputOptions,
    map: &mut dyn FixedPointMap<T>,
    z0: ArrayView2<T>,
    observer: &mut dyn Observer<T>,
) -> Result<Solution<T>> {
    let mut ws = SolveWorkspace::new();
    ws.run(rule, stop, output, map, z0, observer)?;
    Ok(ws.into_solution())
}

/// Below this a sum of squares may have lost digits to underflow (and above `f64::MAX` it
/// overflowed): the row is measured again, scaled.
const TINY_SUM: f64 = 1e-280;

/// `(‖fz − z‖, ‖fz − z‖ / (‖fz‖ + eps))` in `norm`, accumulated in f64 without overflow or
/// underflow: the plain sums serve while they stay in range, else the row is measured again
/// scaled by its largest entry (as LAPACK's `dnrm2` does), so a finite row never reads as
/// non-finite and an overflowing `‖fz‖` never makes a relative residual 0. Returns NaN when `z`
/// or `fz` holds NaN or ∞; an absolute residual beyond f64's range (finite entries) is `inf`.
fn residual_norms<T: SolverFloat>(
    z: ArrayView1<T>,
    fz: ArrayView1<T>,
    eps: f64,
    norm: ResidualNorm,
) -> (f64, f64) {
    match norm {
        ResidualNorm::L2 => {
            let (r2, f2) = match (z.as_slice(), fz.as_slice()) {
                (Some(z), Some(fz)) => super::kernels::residual_sums(z, fz),
                _ => z
                    .iter()
                    .zip(fz.iter())
                    .fold((0.0, 0.0), |(r2, f2), (&zi, &fi)| {
                        let f = fi.widen();
                        let d = f - zi.widen();
                        (r2 + d * d, f2 + f * f)
                    }),
            };
            let in_range = |x: f64| x.is_finite() && (x >= TINY_SUM);
            if in_range(r2) && in_range(f2) {
                let abs = r2.sqrt();
                return (abs, abs / (f2.sqrt() + eps));
            }
            scaled_l2(z, fz, eps)
        }
        ResidualNorm::Max => {
            let (mut d, mut fmax) = (0.0f64, 0.0f64);
            for (&zi, &fi) in z.iter().zip(fz.iter()) {
                let (zw, fw) = (zi.widen(), fi.widen());
                if !(zw.is_finite() && fw.is_finite()) {
                    return (f64::NAN, f64::NAN);
                }
                d = d.max((fw - zw).abs());
                fmax = fmax.max(fw.abs());
            }
            if d == 0.0 {
                return (0.0, 0.0);
            }
            if d.is_infinite() {
                // f − z overflowed: the halves do not, and their ratio is the same.
                let half = z.iter().zip(fz.iter()).fold(0.0f64, |m, (&zi, &fi)| {
                    m.max((0.5 * fi.widen() - 0.5 * zi.widen()).abs())
                });
                return (f64::INFINITY, half / (0.5 * fmax + 0.5 * eps));
            }
            (d, d / (fmax + eps))
        }
    }
}

/// The 2-norm residuals of one row scaled by its largest entry (see [`residual_norms`]).
fn scaled_l2<T: SolverFloat>(z: ArrayView1<T>, fz: ArrayView1<T>, eps: f64) -> (f64, f64) {
    let mut scale = 0.0f64;
    for (&zi, &fi) in z.iter().zip(fz.iter()) {
        let (zw, fw) = (zi.widen(), fi.widen());
        if !(zw.is_finite() && fw.is_finite()) {
            return (f64::NAN, f64::NAN);
        }
        scale = scale.max(zw.abs()).max(fw.abs());
    }
    if scale == 0.0 {
        return (0.0, 0.0);
    }
    let (mut r2, mut f2) = (0.0f64, 0.0f64);
    for (&zi, &fi) in z.iter().zip(fz.iter()) {
        let f = fi.widen() / scale;
        let d = f - zi.widen() / scale;
        r2 += d * d;
        f2 += f * f;
    }
    if r2 == 0.0 {
        return (0.0, 0.0);
    }
    // abs may still exceed f64 (entries near f64::MAX): then it is inf, the ratio is not.
    (scale * r2.sqrt(), r2.sqrt() / (f2.sqrt() + eps / scale))
}

/// Per-row spectral radius of `J = ∂f/∂z` at `z` by power iteration on finite differences
/// `J v ≈ (f(z + ε v) − f(z)) / ε`: the estimate is the geometric mean of `‖J v_k‖` over the last
/// half of the steps (robust to ± or complex-pair dominant eigenvalues). Returns map evaluations.
fn estimate_spectral_radius<T: SolverFloat>(
    map: &mut dyn FixedPointMap<T>,
    z: ArrayView2<T>,
    eligible: &[bool],
    steps: usize,
    seed: u64,
    out: &mut [Option<f64>],
) -> Result<usize> {
    let (batch, dim) = z.dim();
    let mut active = eligible.to_vec();
    if !active.iter().any(|&a| a) {
        return Ok(0);
    }
    let mut f0 = Array2::<T>::zeros((batch, dim));
    map.eval(z, &active, f0.view_mut())?;
    let mut evals = 1;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut v = Array2::<f64>::zeros((batch, dim));
    for x in v.iter_mut() {
        *x = StandardNormal.sample(&mut rng);
    }
    for mut row in v.rows_mut() {
        let n = row.dot(&row).sqrt();
        row.mapv_inplace(|x| x / n);
    }
    // Forward differences: step ~ sqrt(machine eps) relative to the state's scale.
    let sqrt_eps = T::epsilon().to_f64().unwrap_or(1e-16).sqrt();
    let eps: Vec<f64> = (0..batch)
        .map(|b| {
            let zn = z
                .row(b)
                .iter()
                .map(|x| x.widen().powi(2))
                .sum::<f64>()
                .sqrt();
            sqrt_eps * (1.0 + zn)
        })
        .collect();
    let mut zp = Array2::<T>::zeros((batch, dim));
    let mut fp = Array2::<T>::zeros((batch, dim));
    let mut log_sum = vec![0.0f64; batch];
    let mut log_count = vec![0usize; batch];
    for k in 0..steps {
        for b in 0..batch {
            if active[b] {
                for i in 0..dim {
                    zp[[b, i]] = z[[b, i]] + cast::<T>(eps[b] * v[[b, i]]);
                }
            }
        }
        map.eval(zp.view(), &active, fp.view_mut())?;
        evals += 1;
        for b in 0..batch {
            if !active[b] {
                continue;
            }
            let mut n2 = 0.0;
            for i in 0..dim {
                // Divides by the intended step ε, not the step left after rounding z + ε v to T:
                // the O(ε_T/ε) relative error is far below the estimate's own accuracy.
                let w = (fp[[b, i]].widen() - f0[[b, i]].widen()) / eps[b];
                v[[b, i]] = w;
                n2 += w * w;
            }
            let n = n2.sqrt();
            if !n.is_finite() {
                active[b] = false;
                continue;
            }
            if n == 0.0 {
                out[b] = Some(0.0);
                active[b] = false;
                continue;
            }
            v.row_mut(b).mapv_inplace(|x| x / n);
            if k >= steps / 2 {
                log_sum[b] += n.ln();
                log_count[b] += 1;
            }
            out[b] = Some((log_sum[b] / log_count[b].max(1) as f64).exp());
        }
        if !active.iter().any(|&a| a) {
            break;
        }
    }
    Ok(evals)
}
