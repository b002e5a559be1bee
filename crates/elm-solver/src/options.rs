//! What every solve shares, whatever the solver: when a row stops ([`StopCriteria`], passed
//! with each solve) and what a solve reports besides the state ([`OutputOptions`], part of each
//! built-in solver's config).

use crate::error::{Result, SolverError};

/// How a row's residual `f(z) − z` is measured (and the `f(z)` of the relative residual).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum ResidualNorm {
    /// `‖v‖₂`, the DEQ literature's and TorchDEQ's choice (the paper's δ is a 2-norm).
    #[default]
    L2,
    /// `max_i |v_i|`, SciPy's `scipy.optimize.root` (`f_tol`) and optimistix's default.
    Max,
}

impl ResidualNorm {
    /// The name, as in the JSON form and the Python package (`"l2"`, `"max"`).
    pub fn name(self) -> &'static str {
        match self {
            ResidualNorm::L2 => "l2",
            ResidualNorm::Max => "max",
        }
    }
}

/// How the absolute and the relative test combine when both are enabled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Combine {
    /// Converged when either enabled test holds (TorchDEQ's single tolerance, this crate's
    /// historical rule).
    #[default]
    Any,
    /// Converged only when every enabled test holds (SciPy's `root` combines its `f_tol`,
    /// `f_rtol`, `x_tol`, `x_rtol` this way).
    All,
}

impl Combine {
    /// The name, as in the JSON form and the Python package (`"any"`, `"all"`).
    pub fn name(self) -> &'static str {
        match self {
            Combine::Any => "any",
            Combine::All => "all",
        }
    }
}

/// The relative tolerance used when a caller names neither tolerance.
pub const DEFAULT_REL_TOL: f64 = 1e-6;

/// When a row stops; shared by every solver and passed with each solve (semantics documented in
/// the [crate docs](crate)). Defaults: `rel_tol` 1e-6 in the 2-norm, at most 1000 evaluations.
///
/// **A tolerance a caller names is the one used**: in the JSON form (and through
/// [`StopCriteria::named`], which the Python package calls) naming only `abs_tol` switches the
/// default `rel_tol` off, and naming only `rel_tol` leaves `abs_tol` off; naming neither keeps
/// the default `rel_tol`. (Struct-update syntax, `StopCriteria { abs_tol, ..default() }`, keeps
/// the default `rel_tol` active: use [`StopCriteria::absolute`] or [`StopCriteria::named`].)
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "StopCriteriaJson"))]
pub struct StopCriteria {
    /// Converged when `‖f(z)−z‖ ≤ abs_tol`; 0 disables the test.
    pub abs_tol: f64,
    /// Converged when `‖f(z)−z‖ / (‖f(z)‖ + rel_eps) ≤ rel_tol`; 0 disables the test.
    pub rel_tol: f64,
    /// Guards the relative residual's denominator.
    pub rel_eps: f64,
    /// Maximum map evaluations per row (≥ 1).
    pub max_iter: usize,
    /// Diverged when the residual exceeds this factor times the row's first residual (`inf`:
    /// never; the residual itself is computed without overflow, so a growing row ends as
    /// `NonFinite` only when `f(z)` itself overflows).
    pub divergence_factor: f64,
    /// The norm of every residual: the tests, the reported residuals, Anderson's safeguard.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "is_default"))]
    pub norm: ResidualNorm,
    /// How `abs_tol` and `rel_tol` combine when both are enabled.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "is_default"))]
    pub combine: Combine,
}

#[cfg(feature = "serde")]
fn is_default<X: Default + PartialEq>(x: &X) -> bool {
    *x == X::default()
}

impl Default for StopCriteria {
    fn default() -> Self {
        StopCriteria {
            abs_tol: 0.0,
            rel_tol: DEFAULT_REL_TOL,
            rel_eps: 1e-12,
            max_iter: 1000,
            divergence_factor: 1e8,
            norm: ResidualNorm::L2,
            combine: Combine::Any,
        }
    }
}

/// The JSON form of [`StopCriteria`]: every field optional, so that which tolerances were
/// named can be told apart from their defaults (see [`StopCriteria::named`]).
#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StopCriteriaJson {
    abs_tol: Option<f64>,
    rel_tol: Option<f64>,
    rel_eps: Option<f64>,
    max_iter: Option<usize>,
    divergence_factor: Option<f64>,
    norm: Option<ResidualNorm>,
    combine: Option<Combine>,
}

#[cfg(feature = "serde")]
impl TryFrom<StopCriteriaJson> for StopCriteria {
    type Error = String;
    fn try_from(j: StopCriteriaJson) -> std::result::Result<Self, String> {
        let d = StopCriteria::named(j.abs_tol, j.rel_tol);
        Ok(StopCriteria {
            rel_eps: j.rel_eps.unwrap_or(d.rel_eps),
            max_iter: j.max_iter.unwrap_or(d.max_iter),
            divergence_factor: j.divergence_factor.unwrap_or(d.divergence_factor),
            norm: j.norm.unwrap_or(d.norm),
            combine: j.combine.unwrap_or(d.combine),
            ..d
        })
    }
}

impl StopCriteria {
    /// The defaults with the tolerances a caller named: only `abs_tol` named → `rel_tol` off;
    /// only `rel_tol` named → `abs_tol` off; neither → `rel_tol` = [`DEFAULT_REL_TOL`]; both →
    /// both (combined by [`StopCriteria::combine`]).
    pub fn named(abs_tol: Option<f64>, rel_tol: Option<f64>) -> Self {
        let (abs_tol, rel_tol) = match (abs_tol, rel_tol) {
            (None, None) => (0.0, DEFAULT_REL_TOL),
            (a, r) => (a.unwrap_or(0.0), r.unwrap_or(0.0)),
        };
        StopCriteria {
            abs_tol,
            rel_tol,
            ..StopCriteria::default()
        }
    }
    /// Stop on the absolute residual `‖f(z)−z‖₂ ≤ abs_tol` or after `max_iter` evaluations.
    pub fn absolute(abs_tol: f64, max_iter: usize) -> Self {
        StopCriteria {
            max_iter,
            ..StopCriteria::named(Some(abs_tol), None)
        }
    }
    /// Stop on the relative residual `≤ rel_tol` or after `max_iter` evaluations.
    pub fn relative(rel_tol: f64, max_iter: usize) -> Self {
        StopCriteria {
            max_iter,
            ..StopCriteria::named(None, Some(rel_tol))
        }
    }
    /// Whether a residual `abs` (relative: `rel`) meets the enabled tolerances, combined by
    /// [`StopCriteria::combine`]. With no tolerance enabled nothing does (the row runs to
    /// `max_iter`: a fixed number of iterations); otherwise a zero residual always does.
    pub fn met(&self, abs: f64, rel: f64) -> bool {
        let tests = [
            (self.abs_tol > 0.0).then_some(abs <= self.abs_tol),
            (self.rel_tol > 0.0).then_some(rel <= self.rel_tol),
        ];
        let mut enabled = tests.iter().flatten().peekable();
        if enabled.peek().is_none() {
            return false;
        }
        if abs == 0.0 {
            return true;
        }
        match self.combine {
            Combine::Any => enabled.any(|&ok| ok),
            Combine::All => enabled.all(|&ok| ok),
        }
    }
    /// Checks value ranges; errors name the offending field.
    pub fn validate(&self) -> Result<()> {
        let nonneg = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(SolverError::config(
                    format!("stop.{name}"),
                    format!("must be finite and >= 0, got {v}"),
                ))
            }
        };
        nonneg("abs_tol", self.abs_tol)?;
        nonneg("rel_tol", self.rel_tol)?;
        nonneg("rel_eps", self.rel_eps)?;
        crate::error::check_max_iter("stop.max_iter", self.max_iter)?;
        if self.divergence_factor.is_nan() || self.divergence_factor <= 1.0 {
            return Err(SolverError::config(
                "stop.divergence_factor",
                format!("must be > 1 (or inf), got {}", self.divergence_factor),
            ));
        }
        Ok(())
    }
}

/// What a solve returns besides the state.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct OutputOptions {
    /// Return each row's lowest-residual iterate (true) or its last evaluated iterate (false).
    pub return_best: bool,
    /// Record each row's absolute residual after every map evaluation.
    pub trace: bool,
    /// Power-iteration steps for the per-row spectral radius of `∂f/∂z` at the solution; 0 = off.
    /// Costs `1 + spectral_radius_iters` extra batched map evaluations.
    pub spectral_radius_iters: usize,
    /// Seed of the random start vector of the power iteration.
    pub seed: u64,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions {
            return_best: true,
            trace: false,
            spectral_radius_iters: 0,
            seed: 0,
        }
    }
}

/// Checks a damping / mixing `beta` in (0, 1] (every built-in solver has one).
pub(crate) fn check_beta(field: &str, beta: f64) -> Result<()> {
    if beta > 0.0 && beta <= 1.0 {
        Ok(())
    } else {
        Err(SolverError::config(
            field,
            format!("must be in (0, 1], got {beta}"),
        ))
    }
}
