//! Damped Picard iteration `z ← (1−β) z + β f(z)`.

use ndarray::{ArrayView1, ArrayView2, ArrayViewMut1};

use super::engine::{run_fixed_point, IterationRule, SolveWorkspace, StepEvent};
use super::{
    cast, FixedPointMap, FixedPointSolver, Observer, PicardConfig, Solution, SolverFloat,
    StopCriteria,
};
use crate::error::Result;

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

struct PicardRule<T> {
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

impl<T: SolverFloat> FixedPointSolver<T> for Picard {
    fn name(&self) -> &'static str {
        "picard"
    }
    fn solve_observed(
        &self,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        stop: &StopCriteria,
        observer: &mut dyn Observer<T>,
    ) -> Result<Solution<T>> {
        self.config.validate()?;
        let mut rule = PicardRule {
            beta: cast::<T>(self.config.beta),
        };
        run_fixed_point(&mut rule, stop, &self.config.output, map, z0, observer)
    }
    fn solve_in(
        &self,
        ws: &mut SolveWorkspace<T>,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        stop: &StopCriteria,
    ) -> Result<()> {
        self.config.validate()?;
        let beta = cast::<T>(self.config.beta);
        ws.run_with_rule(
            || PicardRule { beta },
            |r| r.beta = beta,
            stop,
            &self.config.output,
            map,
            z0,
            &mut super::NoObserver,
        )
    }
}
