//! [`LinearSolverConfig`]: which method solves a batched linear system, and the one list of the
//! built-in methods ([`LinearSolverKind::ALL`]) that names, defaults and [`BUILTIN_LINEAR_SOLVERS`]
//! are read from.

use ndarray::{ArrayView2, ArrayViewMut2};

use crate::config::{SolverConfig, SolverKind, BUILTIN_SOLVERS};
use crate::error::{MapError, Result, SolverError};
use crate::kinds::builtin_kinds;
use crate::linear::bicgstab::BiCgStab;
use crate::linear::cgnr::solve_cgnr;
use crate::linear::driver::{run_rows, LinearSolution};
use crate::linear::gmres::Gmres;
use crate::linear::neumann::Neumann;
use crate::linear::operator::LinearOperator;
use crate::options::ResidualNorm;
use crate::options::StopCriteria;
use crate::{FnMap, SolverFloat};

/// Default GMRES restart length.
pub const DEFAULT_GMRES_RESTART: usize = 30;
/// Default number of Neumann terms.
pub const DEFAULT_NEUMANN_TERMS: usize = 100;

builtin_kinds! {
    /// The built-in linear (Krylov / series) methods, in the order [`BUILTIN_LINEAR_SOLVERS`]
    /// lists them. A new method is its own file in `linear/` (a `RowMethod` run by the driver)
    /// and its `mod` line in `linear/mod.rs`, a line here, a variant of [`LinearSolverConfig`],
    /// and their arms in the exhaustive matches here and in the JSON mirror (the compiler lists
    /// the missing ones).
    pub enum LinearSolverKind {
        Gmres => "gmres",
        BiCgStab => "bicgstab",
        Neumann => "neumann",
        Cgnr => "cgnr",
    }
    unknown: |name: &str| SolverError::config("kind", unknown_kind(name));
}

impl LinearSolverKind {
    /// The method with its default settings.
    pub fn default_config(self) -> LinearSolverConfig {
        match self {
            LinearSolverKind::Gmres => LinearSolverConfig::gmres(DEFAULT_GMRES_RESTART),
            LinearSolverKind::BiCgStab => LinearSolverConfig::bicgstab(),
            LinearSolverKind::Neumann => LinearSolverConfig::neumann(DEFAULT_NEUMANN_TERMS),
            LinearSolverKind::Cgnr => LinearSolverConfig::cgnr(),
        }
    }
}

/// The built-in linear (Krylov / series) methods by name ([`LinearSolverKind::NAMES`]);
/// [`LinearSolverConfig::by_name`] also accepts the fixed-point solvers of [`BUILTIN_SOLVERS`].
pub const BUILTIN_LINEAR_SOLVERS: [&str; LinearSolverKind::ALL.len()] = LinearSolverKind::NAMES;

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
        if let Ok(kind) = name.parse::<LinearSolverKind>() {
            return Ok(kind.default_config());
        }
        match name.parse::<SolverKind>() {
            Ok(kind) => Ok(Self::FixedPoint(kind.default_config())),
            Err(_) => Err(SolverError::config("kind", unknown_kind(name))),
        }
    }
    /// The built-in linear method; `None` for the fixed-point variant.
    pub fn kind(&self) -> Option<LinearSolverKind> {
        match self {
            LinearSolverConfig::Gmres { .. } => Some(LinearSolverKind::Gmres),
            LinearSolverConfig::BiCgStab => Some(LinearSolverKind::BiCgStab),
            LinearSolverConfig::Neumann { .. } => Some(LinearSolverKind::Neumann),
            LinearSolverConfig::Cgnr => Some(LinearSolverKind::Cgnr),
            LinearSolverConfig::FixedPoint(_) => None,
        }
    }
    /// `gmres`, `bicgstab`, `neumann`, `cgnr`, or the fixed-point solver's name.
    pub fn name(&self) -> &'static str {
        match self {
            LinearSolverConfig::Gmres { .. } => LinearSolverKind::Gmres.name(),
            LinearSolverConfig::BiCgStab => LinearSolverKind::BiCgStab.name(),
            LinearSolverConfig::Neumann { .. } => LinearSolverKind::Neumann.name(),
            LinearSolverConfig::Cgnr => LinearSolverKind::Cgnr.name(),
            LinearSolverConfig::FixedPoint(c) => c.name(),
        }
    }
    /// The fixed-point solver, for the fixed-point variant.
    pub fn fixed_point(&self) -> Option<&SolverConfig> {
        match self {
            LinearSolverConfig::FixedPoint(c) => Some(c),
            LinearSolverConfig::Gmres { .. }
            | LinearSolverConfig::BiCgStab
            | LinearSolverConfig::Neumann { .. }
            | LinearSolverConfig::Cgnr => None,
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
        if stop.norm != ResidualNorm::L2 && !matches!(self, LinearSolverConfig::FixedPoint(_)) {
            // Krylov methods minimise (and estimate) the 2-norm of the residual.
            return Err(SolverError::config(
                "stop.norm",
                format!(
                    "{} measures residuals in the 2-norm (norm \"l2\"); only a fixed-point \
                     solver on x = b + (I − A) x takes norm \"max\"",
                    self.name()
                ),
            ));
        }
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

pub(super) fn unknown_kind(kind: &str) -> String {
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
