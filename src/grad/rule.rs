//! [`GradientRule`]: how gradients flow through a fixed-point layer, and [`DeqConfig`]: the one
//! config (forward solver, its stopping, gradient rule with its backward solver) that training,
//! inference and scripts read (typed, serde).

use serde::{Deserialize, Serialize};

use crate::solver::{LinearSolverConfig, SolverConfig, StopCriteria};
use crate::{ElmError, Result};

/// How the gradient of `z* = f(z*, x; θ)` is computed. JSON form, e.g.
/// `{"kind": "implicit", "solver": {"kind": "anderson"}, "stop": {"rel_tol": 1e-8, "max_iter": 100}}`,
/// `{"kind": "implicit", "solver": {"kind": "gmres", "restart": 30}, "stop": {"rel_tol": 1e-8,
/// "max_iter": 300}, "on_failure": "error"}`, `{"kind": "phantom", "k": 5, "tau": 0.5}` or
/// `{"kind": "stochastic_jfb", "no_grad": [0, 4], "grad": [1, 4], "seed": 0}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    deny_unknown_fields,
    try_from = "RawRule"
)]
pub enum GradientRule {
    /// Backpropagate through `k` differentiable applications of `f` starting at `z0`
    /// (no forward solver; the output is `z_k`, memory grows with `k`).
    Unroll {
        /// Number of unrolled iterations (≥ 1).
        k: usize,
    },
    /// Jacobian-free backprop: solve for `z*` without gradient, then apply `f` once on the tape
    /// at the detached `z*` (gradient = `∂f/∂θᵀ g`, i.e. `(I − J)⁻ᵀ` replaced by `I`).
    Jfb,
    /// Stochastic JFB: `U{no_grad[0]..=no_grad[1]}` gradient-free iterations from `z0`, then
    /// `U{grad[0]..=grad[1]}` differentiable ones (no forward solver). Paper defaults for a
    /// module replacing M layers: `[0, M/2]` and `[1, M/2]`.
    StochasticJfb {
        /// Inclusive range of gradient-free iterations.
        no_grad: [usize; 2],
        /// Inclusive range of differentiable iterations (lower bound ≥ 1).
        grad: [usize; 2],
        /// Seed of the (m, n) draws.
        seed: u64,
    },
    /// Implicit function theorem: solve `z*` with the forward solver, then in backward solve the
    /// adjoint `(I − Jᵀ) u = g` (J = ∂f/∂z at z*) with `solver` using vector-Jacobian products,
    /// and return `∂f/∂(x, θ)ᵀ u`. `solver` is a fixed-point solver on `u = Jᵀu + g` (JSON
    /// `{"kind": "anderson"}`, as before) or a Krylov/series method on the linear system
    /// (`gmres`, `bicgstab`, `neumann`), which keeps working as ρ(J) → 1. Rows whose adjoint
    /// solve does not converge are handled by `on_failure` (default: JFB, `u = g`); the
    /// [`BackwardReport`](super::BackwardReport) names them.
    Implicit {
        /// Backward (adjoint) solver.
        solver: LinearSolverConfig,
        /// When an adjoint row stops: its iterations are VJP evaluations; its relative residual
        /// is `‖Jᵀu + g − u‖` over `‖Jᵀu + g‖` for a fixed-point solver, over `‖g‖` for the
        /// Krylov/series methods.
        stop: StopCriteria,
        /// What a row whose adjoint solve did not converge gets (written only when not the
        /// default, so existing configs keep their exact JSON).
        #[serde(default, skip_serializing_if = "BackwardFailure::is_default")]
        on_failure: BackwardFailure,
    },
    /// Phantom gradient (Geng et al., 2021): solve `z*` with the forward solver (no gradient),
    /// then `k` damped steps on the tape from the detached `z*`,
    /// `z_{i+1} = (1 − τ) z_i + τ f(z_i)`. The gradient is `τ Σ_{i<k} ((1−τ)I + τJ)^i ∂f/∂θ`,
    /// which tends to the IFT gradient as `k` grows when `ρ((1−τ)I + τJ) < 1`; memory `O(k)`.
    Phantom {
        /// Taped damped steps (≥ 1).
        k: usize,
        /// Damping τ ∈ (0, 1]; 1 is `k` plain applications of `f` (unroll from `z*`).
        tau: f64,
    },
}

crate::registry::variant_list! {
    /// The kinds of [`GradientRule`]: its JSON `kind` tag, its [`GradientRule::name`], and the one
    /// list of the rules (`GradientRuleKind::ALL`, checked by the compiler against this enum). A new
    /// rule is a variant of [`GradientRule`], its mirror in `RawRule`, and a variant here; the
    /// compiler then asks for each match that must handle it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum GradientRuleKind("gradient_rule.kind") {
        Unroll,
        Jfb,
        StochasticJfb,
        Implicit,
        Phantom,
    }
}

impl GradientRuleKind {
    /// `unroll`, `jfb`, `stochastic_jfb`, `implicit`, `phantom` (the JSON `kind` tag).
    pub fn name(self) -> &'static str {
        match self {
            GradientRuleKind::Unroll => "unroll",
            GradientRuleKind::Jfb => "jfb",
            GradientRuleKind::StochasticJfb => "stochastic_jfb",
            GradientRuleKind::Implicit => "implicit",
            GradientRuleKind::Phantom => "phantom",
        }
    }
}

impl std::str::FromStr for GradientRuleKind {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        <GradientRuleKind as crate::registry::Registry>::from_name(s).ok_or_else(|| {
            ElmError::config(
                "gradient_rule.kind",
                format!(
                    "unknown rule `{s}` (expected {})",
                    crate::registry::names_or::<GradientRuleKind>()
                ),
            )
        })
    }
}

/// What the implicit rule does with adjoint rows that did not converge (max iterations,
/// divergence, NaN) or a backward solve that failed as a whole. JSON: `"jfb"`, `"error"`, `"keep"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackwardFailure {
    /// Those rows take the JFB gradient (`u = g`), counted in `BackwardReport::fallback_rows`
    /// (the behaviour of every config written before this field existed).
    #[default]
    Jfb,
    /// The tape's backward returns [`ElmError::BackwardSolve`] naming the rows.
    Error,
    /// Those rows keep the solver's last iterate (e.g. a Neumann series truncated on purpose),
    /// counted in `BackwardReport::kept_rows`; a row with no finite iterate is an error as under
    /// `error`.
    Keep,
}

impl BackwardFailure {
    /// `jfb`, `error` or `keep`.
    pub fn name(&self) -> &'static str {
        match self {
            BackwardFailure::Jfb => "jfb",
            BackwardFailure::Error => "error",
            BackwardFailure::Keep => "keep",
        }
    }
    fn is_default(&self) -> bool {
        *self == BackwardFailure::default()
    }
}

impl GradientRule {
    /// The paper's SJFB default for a module that replaces `m_layers` layers:
    /// no-grad iterations `U[0, M/2]`, grad iterations `U[1, M/2]`.
    pub fn sjfb_default(m_layers: usize, seed: u64) -> Self {
        let half = (m_layers / 2).max(1);
        GradientRule::StochasticJfb {
            no_grad: [0, half],
            grad: [1, half],
            seed,
        }
    }

    /// IFT with the given backward solver (a [`SolverConfig`] or a [`LinearSolverConfig`]),
    /// stopping at relative adjoint residual `rel_tol` or after `max_iter` VJP evaluations per
    /// row; rows that do not converge fall back to JFB.
    pub fn implicit(solver: impl Into<LinearSolverConfig>, rel_tol: f64, max_iter: usize) -> Self {
        GradientRule::Implicit {
            solver: solver.into(),
            stop: StopCriteria::relative(rel_tol, max_iter),
            on_failure: BackwardFailure::Jfb,
        }
    }

    /// Builder-style: the implicit rule's `on_failure` policy (no effect on other rules).
    pub fn with_on_failure(mut self, policy: BackwardFailure) -> Self {
        if let GradientRule::Implicit { on_failure, .. } = &mut self {
            *on_failure = policy;
        }
        self
    }

    /// Phantom gradient with `k` damped steps of damping `tau`.
    pub fn phantom(k: usize, tau: f64) -> Self {
        GradientRule::Phantom { k, tau }
    }

    /// Seed of the rule's random draws (`stochastic_jfb`); 0 for the deterministic rules.
    pub fn seed(&self) -> u64 {
        match self {
            GradientRule::StochasticJfb { seed, .. } => *seed,
            GradientRule::Unroll { .. }
            | GradientRule::Jfb
            | GradientRule::Implicit { .. }
            | GradientRule::Phantom { .. } => 0,
        }
    }

    /// The rule's kind (its JSON `kind` tag).
    pub fn kind(&self) -> GradientRuleKind {
        match self {
            GradientRule::Unroll { .. } => GradientRuleKind::Unroll,
            GradientRule::Jfb => GradientRuleKind::Jfb,
            GradientRule::StochasticJfb { .. } => GradientRuleKind::StochasticJfb,
            GradientRule::Implicit { .. } => GradientRuleKind::Implicit,
            GradientRule::Phantom { .. } => GradientRuleKind::Phantom,
        }
    }

    /// Short name: `unroll`, `jfb`, `stochastic_jfb`, `implicit`, `phantom` (its kind's name).
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Whether the rule runs the forward fixed-point solver.
    pub fn uses_forward_solver(&self) -> bool {
        match self.kind() {
            GradientRuleKind::Jfb | GradientRuleKind::Implicit | GradientRuleKind::Phantom => true,
            GradientRuleKind::Unroll | GradientRuleKind::StochasticJfb => false,
        }
    }

    /// Parses and validates a JSON rule (unknown keys rejected).
    pub fn from_json(text: &str) -> Result<Self> {
        let r: GradientRule = serde_json::from_str(text).map_err(|e| ElmError::Json {
            what: "gradient rule".into(),
            msg: e.to_string(),
        })?;
        r.validate()?;
        Ok(r)
    }

    /// Checks value ranges; errors name the field.
    pub fn validate(&self) -> Result<()> {
        match self {
            GradientRule::Unroll { k } => {
                if *k == 0 {
                    return Err(ElmError::config("gradient_rule.k", "must be >= 1"));
                }
            }
            GradientRule::Jfb => {}
            GradientRule::StochasticJfb { no_grad, grad, .. } => {
                if no_grad[0] > no_grad[1] {
                    return Err(ElmError::config(
                        "gradient_rule.no_grad",
                        format!("empty range {no_grad:?}"),
                    ));
                }
                if grad[0] > grad[1] {
                    return Err(ElmError::config(
                        "gradient_rule.grad",
                        format!("empty range {grad:?}"),
                    ));
                }
                if grad[0] == 0 {
                    return Err(ElmError::config(
                        "gradient_rule.grad",
                        "lower bound must be >= 1 (zero differentiable iterations give no gradient)",
                    ));
                }
            }
            GradientRule::Implicit { solver, stop, .. } => {
                solver.validate()?;
                stop.validate()?;
                if stop.abs_tol == 0.0 && stop.rel_tol == 0.0 {
                    return Err(ElmError::config(
                        "gradient_rule.stop",
                        "abs_tol or rel_tol must be > 0 (the adjoint solve would always run max_iter)",
                    ));
                }
            }
            GradientRule::Phantom { k, tau } => {
                if *k == 0 {
                    return Err(ElmError::config("gradient_rule.k", "must be >= 1"));
                }
                if !(tau.is_finite() && *tau > 0.0 && *tau <= 1.0) {
                    return Err(ElmError::config(
                        "gradient_rule.tau",
                        format!("must be in (0, 1], got {tau}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Deserialisation mirror of [`GradientRule`]: `Jfb {}` (a struct variant) so that serde's
/// `deny_unknown_fields` also rejects `{"kind": "jfb", "k": 3}`; values are validated on the way in.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum RawRule {
    Unroll {
        k: usize,
    },
    Jfb {},
    StochasticJfb {
        no_grad: [usize; 2],
        grad: [usize; 2],
        seed: u64,
    },
    Implicit {
        solver: LinearSolverConfig,
        stop: StopCriteria,
        #[serde(default)]
        on_failure: BackwardFailure,
    },
    Phantom {
        k: usize,
        tau: f64,
    },
}

impl TryFrom<RawRule> for GradientRule {
    type Error = ElmError;
    fn try_from(r: RawRule) -> Result<Self> {
        let rule = match r {
            RawRule::Unroll { k } => GradientRule::Unroll { k },
            RawRule::Jfb {} => GradientRule::Jfb,
            RawRule::StochasticJfb {
                no_grad,
                grad,
                seed,
            } => GradientRule::StochasticJfb {
                no_grad,
                grad,
                seed,
            },
            RawRule::Implicit {
                solver,
                stop,
                on_failure,
            } => GradientRule::Implicit {
                solver,
                stop,
                on_failure,
            },
            RawRule::Phantom { k, tau } => GradientRule::Phantom { k, tau },
        };
        rule.validate()?;
        Ok(rule)
    }
}

/// The compiler's check that `RawRule` mirrors every rule: a [`GradientRule`] variant without
/// its `RawRule` twin does not compile here (never called).
#[allow(dead_code)]
fn raw_rule_mirrors_every_rule(rule: GradientRule) -> RawRule {
    match rule {
        GradientRule::Unroll { k } => RawRule::Unroll { k },
        GradientRule::Jfb => RawRule::Jfb {},
        GradientRule::StochasticJfb {
            no_grad,
            grad,
            seed,
        } => RawRule::StochasticJfb {
            no_grad,
            grad,
            seed,
        },
        GradientRule::Implicit {
            solver,
            stop,
            on_failure,
        } => RawRule::Implicit {
            solver,
            stop,
            on_failure,
        },
        GradientRule::Phantom { k, tau } => RawRule::Phantom { k, tau },
    }
}

/// One config for an implicit layer, as TorchDEQ keeps one: the forward solver and when its rows
/// stop, and the gradient rule (which holds the backward solver when it has one). JSON form:
/// `{"forward_solver": {"kind": "anderson"}, "forward_stop": {"rel_tol": 1e-4, "max_iter": 30},
///   "gradient": {"kind": "jfb"}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeqConfig {
    /// Solver of the forward fixed point (used by `jfb` and `implicit`; the iterated rules run
    /// `f` a drawn or fixed number of times instead).
    #[serde(default)]
    pub forward_solver: SolverConfig,
    /// When a forward row stops.
    #[serde(default)]
    pub forward_stop: StopCriteria,
    /// How gradients flow through the fixed point.
    pub gradient: GradientRule,
}

impl DeqConfig {
    /// `gradient` with the default forward solver (Anderson) and stopping.
    pub fn new(gradient: GradientRule) -> Self {
        DeqConfig {
            forward_solver: SolverConfig::default(),
            forward_stop: StopCriteria::default(),
            gradient,
        }
    }
    /// Builder-style: the forward solver and its stopping.
    pub fn with_forward(mut self, solver: SolverConfig, stop: StopCriteria) -> Self {
        self.forward_solver = solver;
        self.forward_stop = stop;
        self
    }
    /// Checks every part; errors name the field.
    pub fn validate(&self) -> Result<()> {
        self.forward_solver.validate()?;
        self.forward_stop.validate()?;
        self.gradient.validate()
    }
    /// Parses and validates a JSON config (unknown keys rejected).
    pub fn from_json(text: &str) -> Result<Self> {
        let c: DeqConfig = serde_json::from_str(text).map_err(|e| ElmError::Json {
            what: "deq config".into(),
            msg: e.to_string(),
        })?;
        c.validate()?;
        Ok(c)
    }
}
