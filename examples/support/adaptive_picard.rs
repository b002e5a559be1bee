//! A fixed-point solver written outside the library, on its public extension points only:
//! Picard iteration whose damping adapts per row, `z ← z + β_b (f(z) − z)`, with β_b grown by
//! `grow` after every step that lowered the row's residual and cut by `shrink` after every step
//! that raised it (within `[beta_min, 1]`). The engine (`RuleSolver`, `SolveWorkspace`) brings
//! per-row stopping, freezing, best-iterate tracking, traces and observers.
//!
//! Used by `examples/custom_solver.rs`, `examples/deq_classifier.rs --solver adaptive-picard`
//! and `tests/custom_solver.rs`.

use elm::solver::{IterationRule, OutputOptions, RuleSolver, SolverFloat, StepEvent};
use ndarray::{ArrayView1, ArrayViewMut1};

/// Residual-driven damped Picard.
#[derive(Clone, Debug)]
pub struct AdaptivePicard {
    /// Damping every row starts from.
    pub beta0: f64,
    /// Lower bound of the damping.
    pub beta_min: f64,
    /// Factor after a step that lowered the residual (≥ 1).
    pub grow: f64,
    /// Factor after a step that raised it (in (0, 1)).
    pub shrink: f64,
    pub output: OutputOptions,
}

impl Default for AdaptivePicard {
    fn default() -> Self {
        AdaptivePicard {
            beta0: 0.5,
            beta_min: 0.05,
            grow: 1.2,
            shrink: 0.5,
            output: OutputOptions::default(),
        }
    }
}

/// Per-row damping and last residual.
pub struct Rule {
    cfg: AdaptivePicard,
    beta: Vec<f64>,
    last: Vec<f64>,
}

impl<T: SolverFloat> IterationRule<T> for Rule {
    fn init(&mut self, batch: usize, _dim: usize) {
        self.beta.clear();
        self.beta.resize(batch, self.cfg.beta0);
        self.last.clear();
        self.last.resize(batch, f64::INFINITY);
    }
    fn step(
        &mut self,
        row: usize,
        mut z: ArrayViewMut1<T>,
        fz: ArrayView1<T>,
        residual: f64,
    ) -> StepEvent {
        let c = &self.cfg;
        let beta = &mut self.beta[row];
        let event = if residual <= self.last[row] {
            *beta = (*beta * c.grow).min(1.0);
            StepEvent::Normal
        } else {
            *beta = (*beta * c.shrink).max(c.beta_min);
            StepEvent::Backtrack
        };
        self.last[row] = residual;
        let b = T::narrow(*beta);
        z.zip_mut_with(&fz, |zi, &fi| *zi = *zi + b * (fi - *zi));
        event
    }
}

/// The engine's [`RuleSolver`] gives it `FixedPointSolver`: repeated solves (one per decoded
/// token) reuse the workspace and the rule's buffers.
impl RuleSolver for AdaptivePicard {
    type Rule<T: SolverFloat> = Rule;
    fn name(&self) -> &'static str {
        "adaptive-picard"
    }
    fn validate(&self) -> elm::solver::Result<()> {
        let bad = |field: &str, msg: &str| Err(elm::solver::SolverError::config(field, msg));
        if !(self.beta_min > 0.0 && self.beta_min <= self.beta0 && self.beta0 <= 1.0) {
            return bad("beta0", "need 0 < beta_min <= beta0 <= 1");
        }
        if !(self.grow >= 1.0 && self.grow.is_finite()) {
            return bad("grow", "must be finite and >= 1");
        }
        if !(self.shrink > 0.0 && self.shrink < 1.0) {
            return bad("shrink", "must be in (0, 1)");
        }
        Ok(())
    }
    fn output(&self) -> &OutputOptions {
        &self.output
    }
    fn rule<T: SolverFloat>(&self) -> Rule {
        Rule {
            cfg: self.clone(),
            beta: Vec::new(),
            last: Vec::new(),
        }
    }
    fn configure<T: SolverFloat>(&self, rule: &mut Rule) {
        rule.cfg = self.clone();
    }
}
