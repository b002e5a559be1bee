//! Batched, matrix-free solvers of linear systems `A x = b`, one independent system per row of a
//! `[B, D]` batch: restarted GMRES(m), BiCGStab, a truncated Neumann series and any fixed-point
//! solver on `x = b + (I − A) x`. Written for the adjoint of implicit layers, `(I − Jᵀ) u = g`,
//! where `A` is only available as products (one vector-Jacobian product per application), so
//! every method but one touches `A` only through a [`LinearOperator`]'s products `A v`. CG on the
//! normal equations (CGNR) also needs `Aᵀ v`: an operator offers it through
//! [`LinearOperator::apply_transpose`] ([`MatrixOperator`], [`FnOperatorPair`]).
//!
//! ## Per-row stopping
//! Each row runs its own method state. Every batched operator call applies `A` to one vector per
//! row still active (which vector depends on where that row is in its method); a row that stops
//! is frozen (it is passed as inactive and its input row is zero), so a row's result does not
//! depend on the other rows of the batch when the operator acts on rows independently.
//! With `r = b − A x`, the stop test of [`StopCriteria`] reads
//!
//! * `abs = ‖r‖₂`, `rel = ‖r‖₂ / (‖b‖₂ + rel_eps)`: **Converged** when `abs ≤ abs_tol` or
//!   `rel ≤ rel_tol` (a zero residual always converges); **NonFinite** on NaN/∞;
//!   **Diverged** when `abs > divergence_factor · ‖r₀‖`; **MaxIter** after `max_iter`
//!   operator applications for the row (or when a Neumann series used all its `terms`).
//!
//! A row is Converged only on its *true* residual `b − A x`: when a method's recursive estimate
//! (GMRES's Givens residual, BiCGStab's recurrence, the next Neumann term) first meets the
//! tolerance, one more application checks it, and a row whose true residual falls short restarts
//! from there. A row stopped for any other reason reports its last estimate. Applications are
//! counted per row ([`RowOutcome::iterations`]); [`RowOutcome::restarts`] counts cycles after
//! the first (GMRES restarts, BiCGStab restarts after a breakdown or a failed check).
//!
//! The fixed-point variant runs the [`FixedPointSolver`](crate::FixedPointSolver) of its
//! [`SolverConfig`] with that solver's own stop semantics (its relative residual divides by
//! `‖f(x)‖` rather than `‖b‖`). States may be `f32` or `f64`; the Krylov methods keep their
//! vectors and scalars in f64 and round only the vectors handed to the operator.

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use crate::config::{SolverConfig, StopCriteria, BUILTIN_SOLVERS};
use crate::error::{bytes_of, check_alloc, MapError, Result, SolverError};
use crate::{FnMap, RowOutcome, RowStatus, SolverFloat};

/// A batched linear operator `x ↦ A x`, applied row by row (each row its own system).
pub trait LinearOperator<T: SolverFloat> {
    /// Row width D.
    fn dim(&self) -> usize;
    /// `out[b] = A x[b]` for every row b with `active[b]`; other rows may be left untouched.
    /// x, out: `[B, D]`. The error is the operator's own, boxed: the solve returns it unchanged
    /// inside [`SolverError::Map`].
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError>;
    /// Whether [`LinearOperator::apply_transpose`] is offered (CGNR needs it).
    fn has_transpose(&self) -> bool {
        false
    }
    /// `out[b] = Aᵀ x[b]` for every active row; only where [`LinearOperator::has_transpose`].
    fn apply_transpose(
        &mut self,
        _x: ArrayView2<T>,
        _active: &[bool],
        _out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        Err(SolverError::InvalidArgument("this operator offers no products with Aᵀ".into()).into())
    }
}

/// A [`LinearOperator`] from a closure over the whole batch: `f(x [B, D], active [B], out [B, D])`.
pub struct FnOperator<F> {
    dim: usize,
    f: F,
}

impl<F> FnOperator<F> {
    /// Wraps `f` as an operator on rows of width `dim`.
    pub fn new(dim: usize, f: F) -> Self {
        FnOperator { dim, f }
    }
}

impl<T, F> LinearOperator<T> for FnOperator<F>
where
    T: SolverFloat,
    F: FnMut(ArrayView2<T>, &[bool], ArrayViewMut2<T>) -> Result<(), MapError>,
{
    fn dim(&self) -> usize {
        self.dim
    }
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        (self.f)(x, active, out)
    }
}

/// A [`LinearOperator`] with products by `A` and by `Aᵀ`, from two closures of
/// [`FnOperator`]'s form: what CGNR needs.
pub struct FnOperatorPair<F, G> {
    dim: usize,
    f: F,
    ft: G,
}

impl<F, G> FnOperatorPair<F, G> {
    /// `f` applies `A`, `ft` applies `Aᵀ`, on rows of width `dim`.
    pub fn new(dim: usize, f: F, ft: G) -> Self {
        FnOperatorPair { dim, f, ft }
    }
}

impl<T, F, G> LinearOperator<T> for FnOperatorPair<F, G>
where
    T: SolverFloat,
    F: FnMut(ArrayView2<T>, &[bool], ArrayViewMut2<T>) -> Result<(), MapError>,
    G: FnMut(ArrayView2<T>, &[bool], ArrayViewMut2<T>) -> Result<(), MapError>,
{
    fn dim(&self) -> usize {
        self.dim
    }
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        (self.f)(x, active, out)
    }
    fn has_transpose(&self) -> bool {
        true
    }
    fn apply_transpose(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        (self.ft)(x, active, out)
    }
}

/// A dense `A [D, D]` applied to each active row (`out[b] = A x[b]`, f64 sums, no BLAS, so a
/// row's product never depends on the batch around it).
pub struct MatrixOperator<T> {
    a: Array2<T>,
}

impl<T: SolverFloat> MatrixOperator<T> {
    /// Refuses a non-square or empty `a`.
    pub fn new(a: Array2<T>) -> Result<Self> {
        if a.nrows() != a.ncols() || a.nrows() == 0 {
            return Err(SolverError::shape(
                "MatrixOperator",
                format!("A must be square and non-empty, got {:?}", a.dim()),
            ));
        }
        Ok(MatrixOperator { a })
    }
}

impl<T: SolverFloat> LinearOperator<T> for MatrixOperator<T> {
    fn dim(&self) -> usize {
        self.a.nrows()
    }
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        self.product(false, x, active, out)
    }
    fn has_transpose(&self) -> bool {
        true
    }
    fn apply_transpose(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        self.product(true, x, active, out)
    }
}

impl<T: SolverFloat> MatrixOperator<T> {
    /// `out[b] = A x[b]`, or `Aᵀ x[b]` when `transpose`, for the active rows.
    fn product(
        &self,
        transpose: bool,
        x: ArrayView2<T>,
        active: &[bool],
        mut out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        let a = if transpose { self.a.t() } else { self.a.view() };
        let d = self.a.nrows();
        if x.ncols() != d || out.dim() != x.dim() || active.len() != x.nrows() {
            return Err(SolverError::shape(
                "MatrixOperator",
                format!("x {:?}, out {:?} for A [{d}, {d}]", x.dim(), out.dim()),
            )
            .into());
        }
        for (b, _) in active.iter().enumerate().filter(|(_, &a)| a) {
            let xr = x.row(b);
            for i in 0..d {
                let s: f64 = a
                    .row(i)
                    .iter()
                    .zip(xr.iter())
                    .map(|(&aik, &xk)| aik.widen() * xk.widen())
                    .sum();
                out[[b, i]] = T::narrow(s);
            }
        }
        Ok(())
    }
}

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

/// The built-in linear (Krylov / series) methods by name; [`LinearSolverConfig::by_name`] also
/// accepts the fixed-point solvers of [`BUILTIN_SOLVERS`].
pub const BUILTIN_LINEAR_SOLVERS: [&str; 4] = ["gmres", "bicgstab", "neumann", "cgnr"];

/// Default GMRES restart length.
pub const DEFAULT_GMRES_RESTART: usize = 30;
/// Default number of Neumann terms.
pub const DEFAULT_NEUMANN_TERMS: usize = 100;

/// How a batched linear system `A x = b` is solved. JSON form: `{"kind": "gmres", "restart": 30}`,
/// `{"kind": "bicgstab"}`, `{"kind": "neumann", "terms": 100}`, `{"kind": "cgnr"}`, or any [`SolverConfig`]'s own
/// form (`{"kind": "anderson", "history": 5}`), which is the fixed-point variant, so a config
/// that names a fixed-point solver reads and writes exactly as a [`SolverConfig`] does.
///
/// CGNR needs products with `Aᵀ` as well as `A`; for the adjoint of an implicit layer,
/// `A = I − Jᵀ`, that is a Jacobian-vector product `J v`, which the reverse-mode tape does not
/// offer: the implicit rule supplies it by central differences of the layer (see `elm::grad`).
#[derive(Clone, Debug, PartialEq)]
pub enum LinearSolverConfig {
    /// Restarted GMRES(m): Arnoldi with modified Gram–Schmidt, Givens rotations; `restart`
    /// vectors (≥ 1) per cycle. Its residual never grows; memory `(restart + 1)·D` per row.
    Gmres { restart: usize },
    /// BiCGStab (van der Vorst): two applications per iteration, memory `4·D` per row; restarts
    /// on breakdown. Cheapest memory of the Krylov methods, residual not monotone.
    BiCgStab,
    /// Truncated Neumann series `x = Σ_{k<terms} (I − A)^k b` (from `x₀ = 0`): converges when
    /// `ρ(I − A) < 1`, as slowly as the fixed-point iteration; a row that uses all `terms`
    /// (≥ 1) without meeting the tolerance stops as MaxIter (truncated).
    Neumann { terms: usize },
    /// A fixed-point solver on `x = b + (I − A) x` (one application per map evaluation).
    FixedPoint(SolverConfig),
    /// Conjugate gradients on the normal equations `AᵀA x = Aᵀb` (CGNR): the residual of the
    /// normal system never grows, at two products per iteration (`A` and `Aᵀ`) and a condition
    /// number squared; needs an operator with [`LinearOperator::apply_transpose`]. Rows are
    /// Converged only on the true residual `b − A x`.
    Cgnr,
}

impl From<SolverConfig> for LinearSolverConfig {
    fn from(c: SolverConfig) -> Self {
        LinearSolverConfig::FixedPoint(c)
    }
}

impl LinearSolverConfig {
    /// GMRES restarted every `restart` applications.
    pub fn gmres(restart: usize) -> Self {
        LinearSolverConfig::Gmres { restart }
    }
    /// BiCGStab.
    pub fn bicgstab() -> Self {
        LinearSolverConfig::BiCgStab
    }
    /// The Neumann series truncated after `terms` terms.
    pub fn neumann(terms: usize) -> Self {
        LinearSolverConfig::Neumann { terms }
    }
    /// CG on the normal equations.
    pub fn cgnr() -> Self {
        LinearSolverConfig::Cgnr
    }
    /// Default config of `name`: one of [`BUILTIN_LINEAR_SOLVERS`] or [`BUILTIN_SOLVERS`].
    pub fn by_name(name: &str) -> Result<Self> {
        match name {
            "gmres" => Ok(Self::gmres(DEFAULT_GMRES_RESTART)),
            "bicgstab" => Ok(Self::bicgstab()),
            "neumann" => Ok(Self::neumann(DEFAULT_NEUMANN_TERMS)),
            "cgnr" => Ok(Self::cgnr()),
            other if BUILTIN_SOLVERS.contains(&other) => {
                Ok(Self::FixedPoint(SolverConfig::by_name(other)?))
            }
            other => Err(SolverError::config("kind", unknown_kind(other))),
        }
    }
    /// `gmres`, `bicgstab`, `neumann`, or the fixed-point solver's name.
    pub fn name(&self) -> &'static str {
        match self {
            LinearSolverConfig::Gmres { .. } => "gmres",
            LinearSolverConfig::BiCgStab => "bicgstab",
            LinearSolverConfig::Neumann { .. } => "neumann",
            LinearSolverConfig::Cgnr => "cgnr",
            LinearSolverConfig::FixedPoint(c) => c.name(),
        }
    }
    /// The fixed-point solver, for the fixed-point variant.
    pub fn fixed_point(&self) -> Option<&SolverConfig> {
        match self {
            LinearSolverConfig::FixedPoint(c) => Some(c),
            _ => None,
        }
    }
    /// Checks value ranges; errors name the field.
    pub fn validate(&self) -> Result<()> {
        match self {
            LinearSolverConfig::Gmres { restart } => {
                if *restart == 0 {
                    return Err(SolverError::config("restart", "must be >= 1"));
                }
                Ok(())
            }
            LinearSolverConfig::BiCgStab | LinearSolverConfig::Cgnr => Ok(()),
            LinearSolverConfig::Neumann { terms } => crate::error::check_max_iter("terms", *terms),
            LinearSolverConfig::FixedPoint(c) => c.validate(),
        }
    }

    /// Solves `A x = b` for every row of `b [B, D]` from `x0 [B, D]` until each row meets `stop`
    /// (see the module docs). A row of `x0` that is all zero starts from `r = b` without an
    /// application. Shapes and configs are checked first; the operator's own error comes back
    /// unchanged in [`SolverError::Map`].
    pub fn solve<T: SolverFloat>(
        &self,
        op: &mut dyn LinearOperator<T>,
        b: ArrayView2<T>,
        x0: ArrayView2<T>,
        stop: &StopCriteria,
    ) -> Result<LinearSolution<T>> {
        self.validate()?;
        stop.validate()?;
        let (batch, dim) = b.dim();
        if x0.dim() != b.dim() || op.dim() != dim {
            return Err(SolverError::shape(
                "linear solve",
                format!(
                    "b is {:?}, x0 is {:?}, the operator has dim {}",
                    b.dim(),
                    x0.dim(),
                    op.dim()
                ),
            ));
        }
        match self {
            LinearSolverConfig::Gmres { restart } => {
                run_rows(&mut Gmres::new(*restart), op, b, x0, stop, None)
            }
            LinearSolverConfig::BiCgStab => {
                run_rows(&mut BiCgStab::default(), op, b, x0, stop, None)
            }
            LinearSolverConfig::Neumann { terms } => {
                run_rows(&mut Neumann::new(*terms), op, b, x0, stop, None)
            }
            LinearSolverConfig::Cgnr => solve_cgnr(op, b, x0, stop),
            LinearSolverConfig::FixedPoint(c) => {
                // f(x) = b + x − A x: its residual f(x) − x is the system's b − A x.
                let mut map = FnMap::new(
                    dim,
                    |x: ArrayView2<T>,
                     active: &[bool],
                     mut out: ArrayViewMut2<T>|
                     -> Result<(), MapError> {
                        op.apply(x, active, out.view_mut())?;
                        for (r, _) in active.iter().enumerate().filter(|(_, &a)| a) {
                            for i in 0..dim {
                                out[[r, i]] = b[[r, i]] + x[[r, i]] - out[[r, i]];
                            }
                        }
                        Ok(())
                    },
                );
                let sol = c.build::<T>().solve(&mut map, x0, stop)?;
                debug_assert_eq!(sol.rows.len(), batch);
                Ok(LinearSolution {
                    x: sol.z,
                    rows: sol.rows,
                    applications: sol.map_evals,
                })
            }
        }
    }
}

fn unknown_kind(kind: &str) -> String {
    format!(
        "unknown linear solver `{kind}` (expected {}|{})",
        BUILTIN_LINEAR_SOLVERS.join("|"),
        BUILTIN_SOLVERS.join("|")
    )
}

/// A built-in linear or fixed-point method by name with its default config.
impl std::str::FromStr for LinearSolverConfig {
    type Err = SolverError;
    fn from_str(name: &str) -> Result<Self> {
        LinearSolverConfig::by_name(name)
    }
}

#[cfg(feature = "serde")]
mod json {
    //! Serde: the Krylov kinds through a tagged mirror (unknown keys rejected), every other
    //! kind as the [`SolverConfig`] it is.
    use super::*;
    use serde::de::Error as _;
    use serde::{Deserialize, Serialize};

    fn default_restart() -> usize {
        DEFAULT_GMRES_RESTART
    }
    fn default_terms() -> usize {
        DEFAULT_NEUMANN_TERMS
    }

    /// `Bicgstab {}` is a struct variant so that `deny_unknown_fields` also rejects keys there.
    #[derive(Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
    enum Krylov {
        Gmres {
            #[serde(default = "default_restart")]
            restart: usize,
        },
        Bicgstab {},
        Neumann {
            #[serde(default = "default_terms")]
            terms: usize,
        },
        Cgnr {},
    }

    impl Serialize for LinearSolverConfig {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            match self {
                LinearSolverConfig::Gmres { restart } => {
                    Krylov::Gmres { restart: *restart }.serialize(s)
                }
                LinearSolverConfig::BiCgStab => Krylov::Bicgstab {}.serialize(s),
                LinearSolverConfig::Neumann { terms } => {
                    Krylov::Neumann { terms: *terms }.serialize(s)
                }
                LinearSolverConfig::Cgnr => Krylov::Cgnr {}.serialize(s),
                LinearSolverConfig::FixedPoint(c) => c.serialize(s),
            }
        }
    }

    impl<'de> Deserialize<'de> for LinearSolverConfig {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            let v = serde_json::Value::deserialize(d)?;
            let kind = v
                .get("kind")
                .and_then(|k| k.as_str())
                .ok_or_else(|| D::Error::custom("linear solver: missing string field `kind`"))?;
            if BUILTIN_LINEAR_SOLVERS.contains(&kind) {
                return match Krylov::deserialize(v).map_err(D::Error::custom)? {
                    Krylov::Gmres { restart } => Ok(LinearSolverConfig::Gmres { restart }),
                    Krylov::Bicgstab {} => Ok(LinearSolverConfig::BiCgStab),
                    Krylov::Neumann { terms } => Ok(LinearSolverConfig::Neumann { terms }),
                    Krylov::Cgnr {} => Ok(LinearSolverConfig::Cgnr),
                };
            }
            if !BUILTIN_SOLVERS.contains(&kind) && kind != "custom" {
                return Err(D::Error::custom(unknown_kind(kind)));
            }
            SolverConfig::deserialize(v)
                .map(LinearSolverConfig::FixedPoint)
                .map_err(D::Error::custom)
        }
    }

    impl LinearSolverConfig {
        /// Parses and validates a JSON config (unknown keys rejected).
        pub fn from_json(text: &str) -> Result<Self> {
            let cfg: LinearSolverConfig =
                serde_json::from_str(text).map_err(|e| SolverError::Json {
                    what: "linear solver config".into(),
                    msg: e.to_string(),
                })?;
            cfg.validate()?;
            Ok(cfg)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The per-row driver.

/// What a method's step left behind, with the residual estimate of the row's current `x`.
enum Advance {
    /// `inp` holds the next vector to apply `A` to.
    Next(f64),
    /// The cycle ended (x updated): check the true residual, then restart.
    Restart(f64),
    /// The method can add nothing more (Neumann's terms are used up; x updated).
    Exhausted(f64),
}

/// One row's method, advanced one operator application at a time. All vectors are f64 rows of
/// width D; `inp` on entry to [`RowMethod::advance`] holds the vector whose product is `ainp`.
trait RowMethod {
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

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

/// `y += s·x`.
fn axpy(y: &mut [f64], s: f64, x: &[f64]) {
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

/// Whether a residual of norm `rn` against a right-hand side of norm `bnorm` meets `stop`'s
/// absolute or relative tolerance (a zero residual always does).
fn meets_tolerance(rn: f64, bnorm: f64, stop: &StopCriteria) -> bool {
    let rel = rn / (bnorm + stop.rel_eps);
    rn == 0.0
        || (stop.abs_tol > 0.0 && rn <= stop.abs_tol)
        || (stop.rel_tol > 0.0 && rel <= stop.rel_tol)
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
        self.rel[row] = rn / (self.bnorm[row] + stop.rel_eps);
    }
    fn stop(&mut self, row: usize, status: RowStatus, inp: &mut [f64]) {
        self.status[row] = Some(status);
        self.active[row] = false;
        inp.fill(0.0);
    }
}

/// Runs `method` on every row of `b` from `x0`; see the module docs for the protocol.
/// Rows marked in `frozen` are left as they are (reported Converged, no application).
fn run_rows<T: SolverFloat>(
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
        .map(|r| RowOutcome {
            status: rows.status[r].unwrap_or(RowStatus::MaxIter),
            iterations: rows.apps[r],
            residual: rows.res[r],
            rel_residual: rows.rel[r],
            trace: None,
            spectral_radius: None,
            restarts: rows.cycles[r].saturating_sub(1),
            backtracks: 0,
        })
        .collect();
    Ok(LinearSolution {
        x: xs,
        rows: outcomes,
        applications,
    })
}

// ---------------------------------------------------------------------------------------------
// GMRES(m).

/// Restarted GMRES; per row: the Arnoldi basis, the rotated Hessenberg matrix, the Givens
/// rotations and the rotated right-hand side.
struct Gmres {
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
    fn new(m: usize) -> Self {
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

// ---------------------------------------------------------------------------------------------
// BiCGStab.

/// Unpreconditioned BiCGStab; per row `r, r̂, p, v` and the scalars of the recurrence. `s`
/// lives in the driver's input row between the two applications of an iteration.
#[derive(Default)]
struct BiCgStab {
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

// ---------------------------------------------------------------------------------------------
// Truncated Neumann series.

/// `x = x₀ + Σ_k (I − A)^k r₀`; the newest term `t` lives in the driver's input row and is also
/// the residual of `x` before it is added.
struct Neumann {
    max_terms: usize,
    terms: Vec<usize>,
    /// The input row (a term) has not been added to x yet: add it when the row goes on.
    pending: Vec<bool>,
}

impl Neumann {
    fn new(max_terms: usize) -> Self {
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

// ---------------------------------------------------------------------------------------------
// CG on the normal equations.

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
fn solve_cgnr<T: SolverFloat>(
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
            RowOutcome {
                status,
                iterations: products[row],
                residual: rn,
                rel_residual: rn / (bnorm[row] + stop.rel_eps),
                trace: None,
                spectral_radius: None,
                restarts: restarts[row],
                backtracks: 0,
            }
        })
        .collect();
    Ok(LinearSolution {
        x,
        rows,
        applications: calls,
    })
}
