//! What every solve shares, whatever the solver: when a row stops ([`StopCriteria`], passed
//! with each solve) and what a solve reports besides the state ([`OutputOptions`], part of each
//! built-in solver's config).

use crate::error::{Result, SolverError};

/// When a row stops; shared by every solver and passed with each solve (semantics documented in
/// the [crate docs](crate)). Defaults: `rel_tol` 1e-6, at most 1000 evaluations.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct StopCriteria {
    /// Converged when `‖f(z)−z‖₂ ≤ abs_tol`; 0 disables the test.
    pub abs_tol: f64,
    /// Converged when `‖f(z)−z‖₂ / (‖f(z)‖₂ + rel_eps) ≤ rel_tol`; 0 disables the test.
    pub rel_tol: f64,
    /// Guards the relative residual's denominator.
    pub rel_eps: f64,
    /// Maximum map evaluations per row (≥ 1).
    pub max_iter: usize,
    /// Diverged when the residual exceeds this factor times the row's first residual.
    pub divergence_factor: f64,
}

impl Default for StopCriteria {
    fn default() -> Self {
        StopCriteria {
            abs_tol: 0.0,
            rel_tol: 1e-6,
            rel_eps: 1e-12,
            max_iter: 1000,
            divergence_factor: 1e8,
        }
    }
}

impl StopCriteria {
    /// Stop on the absolute residual `‖f(z)−z‖₂ ≤ abs_tol` or after `max_iter` evaluations.
    pub fn absolute(abs_tol: f64, max_iter: usize) -> Self {
        StopCriteria {
            abs_tol,
            rel_tol: 0.0,
            max_iter,
            ..StopCriteria::default()
        }
    }
    /// Stop on the relative residual `≤ rel_tol` or after `max_iter` evaluations.
    pub fn relative(rel_tol: f64, max_iter: usize) -> Self {
        StopCriteria {
            abs_tol: 0.0,
            rel_tol,
            max_iter,
            ..StopCriteria::default()
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
