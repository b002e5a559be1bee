//! [`SolverSummary`]: what an evaluation or a generation reports of its fixed-point solves.

use serde::{Deserialize, Serialize};

use crate::equilibrium::infer::FpStat;

/// Fixed-point statistics over decode tokens.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SolverSummary {
    pub tokens: usize,
    /// Mean fixed-point block evaluations per decoded token (incl. the commit evaluation).
    pub mean_iterations: f64,
    pub max_iterations: usize,
    /// Mean decoder-block evaluations per decoded token: kept dense layers + fixed-point ones.
    pub layer_evals_per_token: f64,
    pub mean_residual: f64,
    /// Fraction of tokens whose solve converged within `max_iter`.
    pub converged_frac: f64,
}

impl SolverSummary {
    /// Summarises `stats` for a model with `kept` dense layers.
    pub fn from_stats(stats: &[FpStat], kept: usize) -> Self {
        if stats.is_empty() {
            return SolverSummary {
                layer_evals_per_token: kept as f64,
                ..Default::default()
            };
        }
        let n = stats.len() as f64;
        let mean_it = stats.iter().map(|s| s.iterations as f64).sum::<f64>() / n;
        SolverSummary {
            tokens: stats.len(),
            mean_iterations: mean_it,
            max_iterations: stats.iter().map(|s| s.iterations).max().unwrap_or(0),
            layer_evals_per_token: kept as f64 + mean_it,
            mean_residual: stats.iter().map(|s| s.residual).sum::<f64>() / n,
            converged_frac: stats
                .iter()
                .filter(|s| s.status == crate::solver::RowStatus::Converged)
                .count() as f64
                / n,
        }
    }
}
