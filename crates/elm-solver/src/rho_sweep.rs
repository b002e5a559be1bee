//! When does acceleration pay? Every solver on the canonical linear problem `z = A z + b`
//! (symmetric `A`, eigenvalues spread evenly over `[−ρ, ρ]`) swept over the spectral radius ρ,
//! counting the map evaluations each needs to reach a relative tolerance.
//!
//! Picard's error contracts by ρ per evaluation, so it needs about `ln(tol) / ln(ρ)`
//! evaluations: few when ρ is small, and there is then little for Anderson or Broyden to save.
//! On a linear map Anderson(m) behaves like restarted GMRES and its advantage grows as ρ → 1.

use crate::config::SolverConfig;
use crate::error::{Result, SolverError};
use crate::options::StopCriteria;
use crate::problems::LinearProblem;
use crate::RowStatus;

/// What to sweep.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct RhoSweepConfig {
    /// Spectral radii, each in `[0, 1)`.
    pub rhos: Vec<f64>,
    /// Relative residual tolerances (`‖f(z) − z‖ / ‖f(z)‖`), each > 0.
    pub rel_tols: Vec<f64>,
    /// Map evaluations allowed per row.
    pub max_iter: usize,
    /// Dimension of `z` and rows per batch (independent right-hand sides).
    pub dim: usize,
    pub batch: usize,
    pub seed: u64,
}

impl Default for RhoSweepConfig {
    fn default() -> Self {
        RhoSweepConfig {
            rhos: vec![
                0.2, 0.29, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995,
            ],
            rel_tols: vec![1e-2, 1e-4, 1e-6],
            max_iter: 10_000,
            dim: 100,
            batch: 8,
            seed: 0,
        }
    }
}

/// One solver at one (ρ, tolerance).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RhoSweepRow {
    pub rho: f64,
    pub rel_tol: f64,
    pub solver: String,
    /// Mean over the batch's rows of the map evaluations to converge (or `max_iter`).
    pub mean_evaluations: f64,
    /// Rows that reached the tolerance.
    pub rows_converged: usize,
    pub rows: usize,
    /// `1 − evaluations / Picard's evaluations` at the same (ρ, tolerance): the fraction of
    /// map evaluations the solver saves (negative: it costs more).
    pub saving_vs_picard: f64,
}

impl RhoSweepConfig {
    /// Checks value ranges; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.rhos.is_empty() || self.rel_tols.is_empty() {
            return Err(SolverError::config(
                "rhos",
                "need at least one ρ and one tolerance",
            ));
        }
        if let Some(r) = self
            .rhos
            .iter()
            .find(|r| !(r.is_finite() && (0.0..1.0).contains(*r)))
        {
            return Err(SolverError::config(
                "rhos",
                format!("{r}: ρ must be in [0, 1) for Picard to converge"),
            ));
        }
        if let Some(t) = self.rel_tols.iter().find(|t| !(t.is_finite() && **t > 0.0)) {
            return Err(SolverError::config("rel_tols", format!("{t}: must be > 0")));
        }
        crate::error::check_max_iter("max_iter", self.max_iter)?;
        if self.dim == 0 || self.batch == 0 {
            return Err(SolverError::config("dim", "dim and batch must be >= 1"));
        }
        Ok(())
    }
}

/// Runs every solver of `solvers` (Picard among them, the baseline of `saving_vs_picard`) at
/// every (ρ, tolerance) of `cfg`, on the same problem instance per ρ.
pub fn rho_sweep(cfg: &RhoSweepConfig, solvers: &[SolverConfig]) -> Result<Vec<RhoSweepRow>> {
    cfg.validate()?;
    if !solvers.iter().any(|s| s.name() == "picard") {
        return Err(SolverError::config(
            "solvers",
            "the sweep needs picard: savings are measured against it",
        ));
    }
    let mut out = Vec::new();
    for &rho in &cfg.rhos {
        let mut problem = LinearProblem::new(cfg.dim, rho, cfg.batch, cfg.seed)?;
        let z0 = ndarray::Array2::<f64>::zeros((cfg.batch, cfg.dim));
        for &rel_tol in &cfg.rel_tols {
            let stop = StopCriteria::relative(rel_tol, cfg.max_iter);
            let mut rows = Vec::new();
            for solver in solvers {
                let sol = solver
                    .build::<f64>()
                    .solve(&mut problem, z0.view(), &stop)?;
                let converged = sol
                    .rows
                    .iter()
                    .filter(|r| r.status == RowStatus::Converged)
                    .count();
                let mean = sol.rows.iter().map(|r| r.iterations as f64).sum::<f64>()
                    / sol.rows.len() as f64;
                rows.push(RhoSweepRow {
                    rho,
                    rel_tol,
                    solver: solver.name().to_string(),
                    mean_evaluations: mean,
                    rows_converged: converged,
                    rows: sol.rows.len(),
                    saving_vs_picard: 0.0,
                });
            }
            let picard = rows
                .iter()
                .find(|r| r.solver == "picard")
                .map(|r| r.mean_evaluations)
                .unwrap_or(f64::NAN);
            for r in &mut rows {
                r.saving_vs_picard = 1.0 - r.mean_evaluations / picard;
            }
            out.extend(rows);
        }
    }
    Ok(out)
}
