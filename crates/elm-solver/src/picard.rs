//! Damped Picard iteration `z ← (1−β) z + β f(z)`.

use ndarray::{ArrayView1, ArrayViewMut1};

use super::engine::{IterationRule, RuleSolver, StepEvent};
use super::{cast, SolverFloat};
use crate::error::Result;
use crate::options::{check_beta, OutputOptions};

/// Damped Picard iteration `z ← (1−β) z + β f(z)`.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default, deny_unknown_fields))]
pub struct PicardConfig {
    /// Damping β ∈ (0, 1]; 1 = plain iteration.
    pub beta: f64,
    pub output: OutputOptions,
}

impl Default for PicardConfig {
    fn default() -> Self {
        PicardConfig {
            beta: 1.0,
            output: OutputOptions::default(),
        }
    }
}

impl PicardConfig {
    pub fn validate(&self) -> Result<()> {
        check_beta("beta", self.beta)
    }
}

/// Damped Picard solver. Converges whenever `f` is a contraction (for β = 1) or, for β < 1,
/// whenever the eigenvalues of `1 − β + β J` lie inside the unit disc.
#[derive(Clone, Debug)]
pub struct Picard {
    pub config: PicardConfig,
}

impl Picard {
    pub fn new(config: PicardConfig) -> Self {
        Picard { config }
    }
}

pub struct PicardRule<T> {
    beta: T,
}

impl<T: SolverFloat> IterationRule<T> for PicardRule<T> {
    fn init(&mut self, _batch: usize, _dim: usize) {}
    fn step(
        &mut self,
        _row: usize,
        mut z: ArrayViewMut1<T>,
        fz: ArrayView1<T>,
        _residual: f64,
    ) -> StepEvent {
        let beta = self.beta;
        z.zip_mut_with(&fz, |zi, &fi| *zi = *zi + beta * (fi - *zi));
        StepEvent::Normal
    }
}

impl RuleSolver for Picard {
    type Rule<T: SolverFloat> = PicardRule<T>;
    fn name(&self) -> &'static str {
        "picard"
    }
    fn validate(&self) -> Result<()> {
        self.config.validate()
    }
    fn output(&self) -> &OutputOptions {
        &self.config.output
    }
    fn rule<T: SolverFloat>(&self) -> PicardRule<T> {
        PicardRule {
            beta: cast::<T>(self.config.beta),
        }
    }
    fn configure<T: SolverFloat>(&self, rule: &mut PicardRule<T>) {
        rule.beta = cast::<T>(self.config.beta);
    }
}
