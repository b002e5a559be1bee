//! Typed, serde-(de)serialisable solver configs. Unknown keys are rejected at every level.

use serde::{Deserialize, Serialize};

use super::{Anderson, Broyden, FixedPointSolver, Picard, SolverFloat};
use crate::error::{ElmError, Result};

/// When a row stops; shared by every solver and passed with each solve (semantics documented in
/// [`crate::solver`]). Defaults: `rel_tol` 1e-6, at most 1000 evaluations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
                Err(ElmError::config(
                    format!("stop.{name}"),
                    format!("must be finite and >= 0, got {v}"),
                ))
            }
        };
        nonneg("abs_tol", self.abs_tol)?;
        nonneg("rel_tol", self.rel_tol)?;
        nonneg("rel_eps", self.rel_eps)?;
        crate::limits::check_max_iter("stop.max_iter", self.max_iter)?;
        if self.divergence_factor.is_nan() || self.divergence_factor <= 1.0 {
            return Err(ElmError::config(
                "stop.divergence_factor",
                format!("must be > 1 (or inf), got {}", self.divergence_factor),
            ));
        }
        Ok(())
    }
}

/// What a solve returns besides the state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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

/// Damped Picard iteration `z ← (1−β) z + β f(z)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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

/// Anderson acceleration (type II) with per-row history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AndersonConfig {
    /// History length ≥ 1 (number of residual differences kept).
    pub history: usize,
    /// Ridge λ ≥ 0, relative to the mean diagonal of the Gram matrix.
    pub lambda: f64,
    /// Mixing β ∈ (0, 1].
    pub beta: f64,
    /// Restart a row's history when the estimated condition number of its (ridged) Gram matrix
    /// exceeds this.
    pub max_condition: f64,
    pub output: OutputOptions,
}

impl Default for AndersonConfig {
    fn default() -> Self {
        AndersonConfig {
            history: 5,
            lambda: 1e-10,
            beta: 1.0,
            max_condition: 1e12,
            output: OutputOptions::default(),
        }
    }
}

/// "Good" Broyden with a limited-memory inverse Jacobian.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BroydenConfig {
    /// Memory L ≥ 1: rank-one updates kept (oldest overwritten first).
    pub memory: usize,
    /// Initial inverse Jacobian of `g(z) = f(z) − z` is `−β·I`, so the first step is a damped
    /// Picard step.
    pub beta: f64,
    /// Halve the step (up to `max_backtracks` times) when the residual grows by more than
    /// `backtrack_growth`×. Off by default: Broyden's residual is not monotone, and measured on
    /// the canonical problems backtracking with growth 1 cost up to 100× more evaluations.
    pub backtrack: bool,
    pub backtrack_growth: f64,
    pub max_backtracks: usize,
    pub output: OutputOptions,
}

impl Default for BroydenConfig {
    fn default() -> Self {
        BroydenConfig {
            memory: 10,
            beta: 1.0,
            backtrack: false,
            backtrack_growth: 10.0,
            max_backtracks: 4,
            output: OutputOptions::default(),
        }
    }
}

fn check_beta(field: &str, beta: f64) -> Result<()> {
    if beta > 0.0 && beta <= 1.0 {
        Ok(())
    } else {
        Err(ElmError::config(
            field,
            format!("must be in (0, 1], got {beta}"),
        ))
    }
}

impl PicardConfig {
    pub fn validate(&self) -> Result<()> {
        check_beta("beta", self.beta)
    }
}

impl AndersonConfig {
    pub fn validate(&self) -> Result<()> {
        check_beta("beta", self.beta)?;
        if self.history == 0 {
            return Err(ElmError::config("history", "must be >= 1"));
        }
        if !(self.lambda.is_finite() && self.lambda >= 0.0) {
            return Err(ElmError::config(
                "lambda",
                format!("must be finite and >= 0, got {}", self.lambda),
            ));
        }
        if self.max_condition.is_nan() || self.max_condition <= 1.0 {
            return Err(ElmError::config("max_condition", "must be > 1"));
        }
        Ok(())
    }
}

impl BroydenConfig {
    pub fn validate(&self) -> Result<()> {
        check_beta("beta", self.beta)?;
        if self.memory == 0 {
            return Err(ElmError::config("memory", "must be >= 1"));
        }
        if !(self.backtrack_growth.is_finite() && self.backtrack_growth >= 1.0) {
            return Err(ElmError::config(
                "backtrack_growth",
                "must be finite and >= 1",
            ));
        }
        Ok(())
    }
}

/// Any solver's config: the algorithm and what a solve reports, never when it stops (that is a
/// [`StopCriteria`] passed with each solve). JSON form `{"kind": "anderson", "history": 5}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SolverConfig {
    Picard(PicardConfig),
    Anderson(AndersonConfig),
    Broyden(BroydenConfig),
}

impl Default for SolverConfig {
    fn default() -> Self {
        SolverConfig::anderson()
    }
}

impl SolverConfig {
    /// Default Picard (β = 1).
    pub fn picard() -> Self {
        SolverConfig::Picard(PicardConfig::default())
    }
    /// Default Anderson (history 5, λ = 1e-10, β = 1).
    pub fn anderson() -> Self {
        SolverConfig::Anderson(AndersonConfig::default())
    }
    /// Default Broyden (L = 10, no backtracking).
    pub fn broyden() -> Self {
        SolverConfig::Broyden(BroydenConfig::default())
    }
    /// Default config for a solver named `picard`, `anderson` or `broyden`.
    pub fn by_name(name: &str) -> Result<Self> {
        match name {
            "picard" => Ok(Self::picard()),
            "anderson" => Ok(Self::anderson()),
            "broyden" => Ok(Self::broyden()),
            other => Err(ElmError::config(
                "kind",
                format!("unknown solver `{other}` (expected picard|anderson|broyden)"),
            )),
        }
    }
    /// Parses and validates a JSON config.
    pub fn from_json(text: &str) -> Result<Self> {
        let cfg: SolverConfig = serde_json::from_str(text).map_err(|e| ElmError::Json {
            what: "solver config".into(),
            msg: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }
    /// Solver name.
    pub fn name(&self) -> &'static str {
        match self {
            SolverConfig::Picard(_) => "picard",
            SolverConfig::Anderson(_) => "anderson",
            SolverConfig::Broyden(_) => "broyden",
        }
    }
    /// Checks every value range.
    pub fn validate(&self) -> Result<()> {
        match self {
            SolverConfig::Picard(c) => c.validate(),
            SolverConfig::Anderson(c) => c.validate(),
            SolverConfig::Broyden(c) => c.validate(),
        }
    }
    /// Mutable output options.
    pub fn output_mut(&mut self) -> &mut OutputOptions {
        match self {
            SolverConfig::Picard(c) => &mut c.output,
            SolverConfig::Anderson(c) => &mut c.output,
            SolverConfig::Broyden(c) => &mut c.output,
        }
    }
    /// Builder-style: replace the output options.
    pub fn with_output(mut self, output: OutputOptions) -> Self {
        *self.output_mut() = output;
        self
    }
    /// The solver. Configs are validated when `solve` is called (invalid ones return
    /// [`ElmError::Config`] there).
    pub fn build<T: SolverFloat>(&self) -> Box<dyn FixedPointSolver<T>> {
        match self {
            SolverConfig::Picard(c) => Box::new(Picard::new(c.clone())),
            SolverConfig::Anderson(c) => Box::new(Anderson::new(c.clone())),
            SolverConfig::Broyden(c) => Box::new(Broyden::new(c.clone())),
        }
    }
}
