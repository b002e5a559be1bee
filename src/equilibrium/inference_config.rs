//! How the fixed-point module is solved at inference: [`InferenceConfig`] (solver, stopping per
//! token, KV mode) and [`KvMode`].

use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};
use crate::quant::ActQuant;
use crate::solver::{FixedPointSolver, SolverConfig, StopCriteria};

/// KV-cache policy of the fixed-point block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvMode {
    OneStep,
    MultiStep,
}

impl KvMode {
    /// The name `--kv` takes.
    pub fn name(self) -> &'static str {
        match self {
            KvMode::OneStep => "one-step",
            KvMode::MultiStep => "multi-step",
        }
    }
}

impl std::fmt::Display for KvMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvMode {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            s if s == KvMode::OneStep.name() => Ok(KvMode::OneStep),
            s if s == KvMode::MultiStep.name() => Ok(KvMode::MultiStep),
            _ => Err(ElmError::config(
                "kv",
                format!("`{s}`: expected one-step or multi-step"),
            )),
        }
    }
}

/// How deep the module runs at inference, whatever it was trained with: the train-K × test-K
/// study tests a module trained as a fixed loop when solved, and a solved one (the ELM) as a
/// fixed loop of K' applications.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Depth {
    /// As trained: `K` applications for a fixed-K module, solved for the ELM.
    #[default]
    AsTrained,
    /// Exactly `K` applications from the module's `z⁰`, no solver, no tolerance.
    Fixed(usize),
    /// Solved by the inference config's solver to its tolerance.
    Solved,
}

impl std::str::FromStr for Depth {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "trained" => Ok(Depth::AsTrained),
            "solved" => Ok(Depth::Solved),
            k => match k.parse::<usize>() {
                Ok(k) if k >= 1 => {
                    crate::limits::check_max_iter("depth", k)?;
                    Ok(Depth::Fixed(k))
                }
                _ => Err(ElmError::config(
                    "depth",
                    format!("`{s}`: expected trained, solved or a number of applications >= 1"),
                )),
            },
        }
    }
}

impl std::fmt::Display for Depth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Depth::AsTrained => f.write_str("trained"),
            Depth::Fixed(k) => write!(f, "{k}"),
            Depth::Solved => f.write_str("solved"),
        }
    }
}

/// Where the module's iteration starts at inference (path independence: a solved module
/// should reach the same fixed point from any of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InitialState {
    /// As the module was trained: z⁰ = 0 with input injection, z⁰ = h without.
    #[default]
    Module,
    /// z⁰ = 0.
    Zero,
    /// z⁰ = h, the state entering the window.
    Input,
    /// z⁰ drawn from N(0, σ²), σ the RMS of h (seed 0).
    Random,
}

impl InitialState {
    fn is_module(&self) -> bool {
        *self == InitialState::Module
    }
}

impl std::str::FromStr for InitialState {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "module" => Ok(InitialState::Module),
            "zero" => Ok(InitialState::Zero),
            "input" => Ok(InitialState::Input),
            "random" => Ok(InitialState::Random),
            _ => Err(ElmError::config(
                "z0",
                format!("`{s}`: expected module, zero, input or random"),
            )),
        }
    }
}

/// How the fixed-point module is solved at inference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferenceConfig {
    /// Solver and its parameters.
    #[serde(default = "SolverConfig::anderson")]
    pub solver: SolverConfig,
    /// When a token stops: `abs_tol` = δ per token (see module doc; 0 with `rel_tol` 0 = always
    /// `max_iter`), `max_iter` map evaluations per token (the commit evaluation comes on top).
    #[serde(default = "d_stop")]
    pub stop: StopCriteria,
    #[serde(default = "d_kv")]
    pub kv_mode: KvMode,
    /// Stop prefill rows adaptively too (else prefill always runs `max_iter`).
    #[serde(default = "d_true")]
    pub adaptive_prefill: bool,
    /// How the module's products with quantized weights quantize their activations (no effect
    /// on f32 weights): `q8x2` by default, since with one 8-bit block the iteration stalls at a
    /// residual floor above δ (see [`ActQuant::Q8x2`]); the kept dense layers always use `q8`.
    /// Written only when it differs from the default, so configs from before it existed keep
    /// their meaning and their hash.
    #[serde(
        default = "d_module_activations",
        skip_serializing_if = "is_d_module_activations"
    )]
    pub module_activations: ActQuant,
    /// Where the iteration starts (see [`InitialState`]); written only when it is not the
    /// module's own start, so older configs keep their meaning and hash.
    #[serde(default, skip_serializing_if = "InitialState::is_module")]
    pub z0: InitialState,
}

/// δ = 0.5 per token, at most 16 evaluations.
pub(crate) fn d_stop() -> StopCriteria {
    StopCriteria::absolute(0.5, 16)
}
pub(crate) fn d_kv() -> KvMode {
    KvMode::OneStep
}
pub(crate) fn d_true() -> bool {
    true
}
fn d_module_activations() -> ActQuant {
    ActQuant::Q8x2
}
fn is_d_module_activations(a: &ActQuant) -> bool {
    *a == d_module_activations()
}

crate::default_from_empty_json!(InferenceConfig);

impl InferenceConfig {
    /// `solver` stopping per token as `stop` (see the module doc), other fields default.
    pub fn new(solver: SolverConfig, stop: StopCriteria) -> Self {
        InferenceConfig {
            solver,
            stop,
            ..InferenceConfig::default()
        }
    }
    /// The stop criteria of a row of `tokens` tokens: δ scaled to the row (`δ·√T`), or no
    /// tolerance when the row is not stopped adaptively.
    pub(crate) fn stop_for(&self, tokens: usize, adaptive: bool) -> StopCriteria {
        let (abs_tol, rel_tol) = if adaptive {
            (
                self.stop.abs_tol * (tokens as f64).sqrt(),
                self.stop.rel_tol,
            )
        } else {
            (0.0, 0.0)
        };
        StopCriteria {
            abs_tol,
            rel_tol,
            ..self.stop.clone()
        }
    }
    /// The solver, returning each row's best iterate (its K/V are the ones committed).
    pub(crate) fn build_solver(&self) -> Box<dyn FixedPointSolver<f32>> {
        let mut cfg = self.solver.clone();
        if let Some(output) = cfg.output_mut() {
            output.return_best = true;
        }
        cfg.build()
    }
    pub fn validate(&self) -> Result<()> {
        self.stop.validate()?;
        Ok(self.solver.validate()?)
    }
}
