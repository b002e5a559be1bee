//! Generic, batched fixed-point solvers: find `z*` with `z* = f(z*)` for each row of a `[B, D]` batch.
//!
//! Nothing here knows about models. A problem is a [`FixedPointMap`]: it evaluates `f` on the rows of
//! a `[B, D]` state that are still *active*. A solver ([`FixedPointSolver`]) iterates one map
//! evaluation per iteration and decides, per row, when to stop:
//!
//! * [`Picard`]: damped iteration `z ← (1−β) z + β f(z)`.
//! * [`Anderson`]: type-II Anderson acceleration with history `m`, ridge `λ` and mixing `β`.
//! * [`Broyden`]: "good" Broyden with a limited-memory (`L` pairs) inverse-Jacobian and optional
//!   backtracking when the residual grows.
//!
//! ## Stop criteria (shared by every solver)
//!
//! With residual `g(z) = f(z) − z`, after each map evaluation every active row computes, in f64
//! and without overflow or underflow (rescaled by the row's largest entry when a plain sum of
//! squares would leave f64's range),
//!
//! * `abs = ‖f(z) − z‖` and `rel = ‖f(z) − z‖ / (‖f(z)‖ + rel_eps)`, in the 2-norm
//!   ([`ResidualNorm::L2`], default) or the max-norm ([`ResidualNorm::Max`], SciPy's).
//!
//! The row is **Converged** when the enabled tests hold — `abs ≤ abs_tol` (if `abs_tol > 0`),
//! `rel ≤ rel_tol` (if `rel_tol > 0`) — either of them ([`Combine::Any`], default) or both
//! ([`Combine::All`]); **NonFinite** when `f(z)` or `z` contains NaN/∞; **Diverged** when `abs`
//! exceeds `divergence_factor · max(abs₀, 1e-30)` (`abs₀` = first residual) or f64's range;
//! **MaxIter** when it has used `max_iter` map evaluations. Only the tolerances a caller names
//! are used ([`StopCriteria::named`], the JSON form): naming `abs_tol` alone switches the
//! default `rel_tol` off. A row that stops is *frozen*: its state never changes again and
//! the map sees it as inactive. One bad row never fails the batch. See [`StopCriteria`], which is
//! passed with every solve (a solver config describes the algorithm only).
//!
//! The returned state per row is the iterate with the lowest residual (`return_best`, default) or
//! the last evaluated iterate; both are points at which `f` was evaluated, so the reported residual
//! belongs to the returned state.
//!
//! ## Precision
//! States may be `f32` or `f64` ([`SolverFloat`]). Residual norms, Anderson's Gram matrix and least
//! squares, and Broyden's inner products are accumulated in `f64`.
//!
//! ## Solve your own fixed point in a few lines
//! ```
//! use elm_solver::{FixedPointSolver, RowFnMap, RowStatus, SolverConfig, StopCriteria};
//! use ndarray::Array2;
//!
//! // z = cos(z), four independent scalar systems solved as one batch.
//! let mut map = RowFnMap::new(1, |z: ndarray::ArrayView1<f64>, mut out: ndarray::ArrayViewMut1<f64>| {
//!     out[0] = z[0].cos();
//! });
//! let solver = SolverConfig::anderson().build::<f64>();
//! let stop = StopCriteria::default(); // rel. residual ≤ 1e-6, ≤ 1000 evaluations
//! let sol = solver.solve(&mut map, Array2::zeros((4, 1)).view(), &stop).unwrap();
//! assert!(sol.rows.iter().all(|r| r.status == RowStatus::Converged));
//! assert!((sol.z[[0, 0]] - 0.739_085_133_215_160_6).abs() < 1e-5);
//! ```
//!
//! Canonical test problems (linear contraction, tanh layer, `cos z = z`, Poisson/Jacobi) live in
//! [`problems`].
//!
//! ## Linear systems
//! [`LinearSolverConfig`] solves batched, matrix-free systems `A x = b` (GMRES(m), BiCGStab, a
//! truncated Neumann series, or any fixed-point solver on `x = b + (I − A) x`) with the same
//! per-row stopping and [`RowOutcome`]s; `A` is a [`LinearOperator`] (e.g. `I − Jᵀ` applied by
//! vector-Jacobian products, the adjoint of an implicit layer).

// Numeric kernels index several equally long slices in lockstep; explicit indices read clearer.
#![allow(clippy::needless_range_loop)]

/// True when the CPU has AVX2 (cached by std). Hot kernels are `#[inline(always)]` bodies with a
/// `#[target_feature(enable = "avx2")]` twin chosen at run time: the crate is built for baseline
/// x86-64, where f64 vectors are only 2 wide. No FMA is enabled, so both builds round identically.
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

// With `lapack`, ndarray-linalg (and through it the system OpenBLAS) is linked into every binary
// of the crate, tests included: ndarray's `blas` feature, switched on by a workspace that uses
// it, then finds its symbols.
#[cfg(feature = "lapack")]
use ndarray_linalg as _;

mod anderson;
pub mod benchmark;
mod broyden;
mod config;
mod engine;
pub mod error;
mod kernels;
mod kinds;
mod linalg;
mod linear;
mod options;
mod picard;
pub mod problems;
pub mod rho_sweep;

pub use anderson::{Anderson, AndersonConfig};
pub use broyden::{Broyden, BroydenConfig};
pub use config::{CustomSolver, SolverConfig, SolverKind, BUILTIN_SOLVERS};
pub use engine::{run_fixed_point, IterationRule, RuleSolver, SolveWorkspace, StepEvent};
pub use error::{MapError, Result, SolverError};
pub use linear::{
    FnOperator, FnOperatorPair, LinearOperator, LinearSolution, LinearSolverConfig,
    LinearSolverKind, MatrixOperator, BUILTIN_LINEAR_SOLVERS, DEFAULT_GMRES_RESTART,
    DEFAULT_NEUMANN_TERMS,
};
pub use options::{Combine, OutputOptions, ResidualNorm, StopCriteria, DEFAULT_REL_TOL};
pub use picard::{Picard, PicardConfig};

use std::fmt::Debug;

use ndarray::{Array2, ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2};

/// Scalar type of solver states: `f32` or `f64`.
pub trait SolverFloat:
    num_traits::Float
    + ndarray::LinalgScalar
    + ndarray::ScalarOperand
    + Send
    + Sync
    + Debug
    + std::fmt::Display
    + 'static
{
    /// Exact widening to f64 (a plain `as` cast, so hot loops vectorise).
    fn widen(self) -> f64;
    /// Rounding from f64.
    fn narrow(x: f64) -> Self;
    /// `solver` for states of this type.
    fn custom_solver(solver: &CustomSolver) -> Box<dyn FixedPointSolver<Self>>;
}
impl SolverFloat for f32 {
    #[inline(always)]
    fn widen(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn narrow(x: f64) -> Self {
        x as f32
    }
    fn custom_solver(solver: &CustomSolver) -> Box<dyn FixedPointSolver<Self>> {
        solver.for_f32()
    }
}
impl SolverFloat for f64 {
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
    #[inline(always)]
    fn narrow(x: f64) -> Self {
        x
    }
    fn custom_solver(solver: &CustomSolver) -> Box<dyn FixedPointSolver<Self>> {
        solver.for_f64()
    }
}

/// A batched map `f` whose fixed points are sought. Rows may be independent systems.
pub trait FixedPointMap<T: SolverFloat> {
    /// State width D.
    fn dim(&self) -> usize;
    /// `out[b] = f(z[b])` for every row b with `active[b]`; rows not active may be left untouched.
    /// z, out: `[B, D]`. The error is the map's own, boxed: the solve returns it unchanged inside
    /// [`SolverError::Map`].
    fn eval(
        &mut self,
        z: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError>;
}

/// A [`FixedPointMap`] from a closure over the whole batch: `f(z [B, D], active [B], out [B, D])`.
pub struct FnMap<F> {
    dim: usize,
    f: F,
}

impl<F> FnMap<F> {
    /// Wraps `f` as a map on states of width `dim`.
    pub fn new(dim: usize, f: F) -> Self {
        FnMap { dim, f }
    }
}

impl<T, F> FixedPointMap<T> for FnMap<F>
where
    T: SolverFloat,
    F: FnMut(ArrayView2<T>, &[bool], ArrayViewMut2<T>) -> Result<(), MapError>,
{
    fn dim(&self) -> usize {
        self.dim
    }
    fn eval(
        &mut self,
        z: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        (self.f)(z, active, out)
    }
}

/// A [`FixedPointMap`] from an infallible per-row closure `f(z_row [D], out_row [D])`, called only
/// on active rows.
pub struct RowFnMap<F> {
    dim: usize,
    f: F,
}

impl<F> RowFnMap<F> {
    /// Wraps the per-row `f` as a map on states of width `dim`.
    pub fn new(dim: usize, f: F) -> Self {
        RowFnMap { dim, f }
    }
}

impl<T, F> FixedPointMap<T> for RowFnMap<F>
where
    T: SolverFloat,
    F: FnMut(ArrayView1<T>, ArrayViewMut1<T>),
{
    fn dim(&self) -> usize {
        self.dim
    }
    fn eval(
        &mut self,
        z: ArrayView2<T>,
        active: &[bool],
        mut out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        for (b, &is_active) in active.iter().enumerate() {
            if is_active {
                (self.f)(z.row(b), out.row_mut(b));
            }
        }
        Ok(())
    }
}

/// Why a row stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum RowStatus {
    /// Reached `abs_tol` or `rel_tol`.
    Converged,
    /// Used `max_iter` map evaluations without converging.
    MaxIter,
    /// Residual grew beyond `divergence_factor` × the first residual.
    Diverged,
    /// `f(z)` produced NaN or ∞ for this row.
    NonFinite,
}

/// Outcome of one row of the batch.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RowOutcome {
    /// Why the row stopped.
    pub status: RowStatus,
    /// Map evaluations spent on this row (the first evaluation at `z0` counts).
    pub iterations: usize,
    /// `‖f(z) − z‖₂` at the returned state.
    pub residual: f64,
    /// `‖f(z) − z‖₂ / (‖f(z)‖₂ + rel_eps)` at the returned state.
    pub rel_residual: f64,
    /// Absolute residual after every map evaluation, when `OutputOptions::trace` is set.
    pub trace: Option<Vec<f64>>,
    /// Estimated spectral radius of `∂f/∂z` at the returned state, when requested.
    pub spectral_radius: Option<f64>,
    /// Steps at which the solver dropped its history and fell back to a plain (damped) step:
    /// Anderson's ill-conditioned least squares; Broyden's full memory, degenerate secant update
    /// or failed backtracking.
    #[cfg_attr(feature = "serde", serde(default))]
    pub restarts: usize,
    /// Broyden's step halvings (backtracking).
    #[cfg_attr(feature = "serde", serde(default))]
    pub backtracks: usize,
    /// Accelerated points refused by Anderson's safeguard (each cost one map evaluation).
    #[cfg_attr(feature = "serde", serde(default))]
    pub rejections: usize,
}

/// Result of a batched solve.
#[derive(Clone, Debug)]
pub struct Solution<T> {
    /// `[B, D]`: best (lowest residual) or last iterate per row, per [`OutputOptions::return_best`].
    pub z: Array2<T>,
    /// One outcome per row.
    pub rows: Vec<RowOutcome>,
    /// Batched map calls made by the iteration (each call evaluates all active rows).
    pub map_evals: usize,
    /// Extra batched map calls spent on spectral-radius estimation (not in `map_evals`).
    pub spectral_map_evals: usize,
}

impl<T> Solution<T> {
    /// True when every row converged.
    pub fn all_converged(&self) -> bool {
        self.rows.iter().all(|r| r.status == RowStatus::Converged)
    }
    /// Largest per-row absolute residual.
    pub fn max_residual(&self) -> f64 {
        self.rows.iter().map(|r| r.residual).fold(0.0, f64::max)
    }
    /// Largest per-row iteration count.
    pub fn max_iterations(&self) -> usize {
        self.rows.iter().map(|r| r.iterations).max().unwrap_or(0)
    }
}

/// What an [`Observer`] sees after every batched map evaluation.
pub struct IterationInfo<'a, T> {
    /// Batched map evaluations so far (1 after the first).
    pub map_evals: usize,
    /// Current iterate `[B, D]` (after the update of this iteration).
    pub z: ArrayView2<'a, T>,
    /// Latest absolute residual per row (frozen rows keep their final value).
    pub residuals: &'a [f64],
    /// Latest relative residual per row.
    pub rel_residuals: &'a [f64],
    /// Rows still iterating.
    pub active: &'a [bool],
}

/// Sees every iteration of a solve (logging, plotting, tracing).
pub trait Observer<T> {
    /// Called once after each batched map evaluation and update.
    fn observe(&mut self, info: &IterationInfo<'_, T>);
}

impl<T, F: FnMut(&IterationInfo<'_, T>)> Observer<T> for F {
    fn observe(&mut self, info: &IterationInfo<'_, T>) {
        self(info)
    }
}

/// An observer that does nothing.
pub struct NoObserver;
impl<T> Observer<T> for NoObserver {
    fn observe(&mut self, _: &IterationInfo<'_, T>) {}
}

/// A batched fixed-point solver. It describes the algorithm only; when rows stop is given with
/// each solve, so one solver serves callers with different tolerances.
pub trait FixedPointSolver<T: SolverFloat> {
    /// Short name (`picard`, `anderson`, `broyden`).
    fn name(&self) -> &'static str;
    /// Solves `z = f(z)` from `z0 [B, D]` until every row meets `stop`, calling `observer` after
    /// every iteration.
    fn solve_observed(
        &self,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        stop: &StopCriteria,
        observer: &mut dyn Observer<T>,
    ) -> Result<Solution<T>>;
    /// Solves `z = f(z)` from `z0 [B, D]` until every row meets `stop`.
    fn solve(
        &self,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        stop: &StopCriteria,
    ) -> Result<Solution<T>> {
        self.solve_observed(map, z0, stop, &mut NoObserver)
    }
    /// Solves `z = f(z)` from `z0 [B, D]` until every row meets `stop`, reusing `ws`'s buffers
    /// (and this solver's per-row state kept there by the previous solve), so that repeated
    /// solves of one shape allocate nothing; the result is read from `ws`. The built-in solvers
    /// override it; the default solves in fresh buffers and stores the result in `ws`.
    fn solve_in(
        &self,
        ws: &mut SolveWorkspace<T>,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        stop: &StopCriteria,
    ) -> Result<()> {
        let solution = self.solve(map, z0, stop)?;
        ws.set_solution(solution);
        Ok(())
    }
}

#[inline]
pub(crate) fn cast<T: SolverFloat>(x: f64) -> T {
    T::narrow(x)
}
