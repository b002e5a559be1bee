//! Gradient rules for implicit (fixed-point) layers `z* = f(z*, x; θ)`.
//!
//! Implement [`ImplicitLayer::forward`] once — one application of `f` on the tape, with the
//! parameters as a typed [`ParamSet`] — and [`implicit_forward`] puts the fixed point on the tape
//! with the backward pass chosen by the [`GradientRule`] of a [`DeqConfig`] (which also holds the
//! forward solver and its stopping):
//!
//! | rule | forward | backward | tape memory |
//! |---|---|---|---|
//! | `Unroll { k }` | `k` taped iterations from `z0` | exact gradient of `z_k` | `O(k)` |
//! | `Jfb` | solver (no grad), then 1 taped `f` at detached `z*` | `∂f/∂θᵀ g` | `O(1)` |
//! | `StochasticJfb` | `U[a,b]` untaped + `U[c,d]` taped iterations | through the taped ones | `O(taped)` |
//! | `Implicit` | solver (no grad) | adjoint `(I − Jᵀ) u = g` by any solver, then `∂f/∂θᵀ u` | `O(1)` |
//! | `Phantom { k, τ }` | solver (no grad), then `k` taped damped steps at detached `z*` | through the taped steps | `O(k)` |
//!
//! The IFT backward (`Implicit`) is a [`Tape::custom`](crate::autograd::Tape::custom) node whose
//! VJP solves the adjoint with a [`LinearSolverConfig`](crate::solver::LinearSolverConfig) via
//! vector-Jacobian products of `f` at `z*` on scratch tapes (one VJP per operator application):
//! a fixed-point solver on `u = Jᵀu + g` (Picard/Anderson/Broyden/your own), or GMRES,
//! BiCGStab or a truncated Neumann series on `(I − Jᵀ) u = g`, which keep converging as
//! ρ(J) → 1 where the fixed-point iteration needs thousands of VJPs. CG on the normal equations
//! is not offered: it needs `J v` products and the tape is reverse-mode only (VJPs). Rows whose
//! adjoint solve does not converge are handled by the rule's [`BackwardFailure`] policy: JFB
//! (`u = g`, the default), a typed error naming the rows, or keeping the solver's iterate. Its
//! statistics land in [`GradReport::backward`] when the tape's backward runs; the library prints
//! nothing.
//!
//! States are `[B, ...]` (batch first); the solvers see them as `[B, D]` rows. Per-row stopping
//! is exact when `f` acts on rows independently (the usual case).
//!
//! ## A new implicit layer in a few lines
//! ```
//! use elm::autograd::{Tape, Var};
//! use elm::grad::{implicit_forward, DeqConfig, GradientRule, ImplicitLayer};
//! use elm::solver::SolverConfig;
//! use ndarray::{Array2, ArrayD};
//!
//! elm::param_set! {
//!     /// θ of `z = tanh(W z + U x + b)`.
//!     struct TanhParams { w, u, b }
//! }
//!
//! #[derive(Clone)]
//! struct TanhDeq;
//! impl ImplicitLayer<f64> for TanhDeq {
//!     type Params = TanhParams;
//!     fn forward(&self, t: &mut Tape<f64>, z: Var, x: Var, p: &TanhParams) -> elm::Result<Var> {
//!         let wz = t.matmul_t(z, p.w, None)?; // z·Wᵀ      [B, D]
//!         let ux = t.matmul_t(x, p.u, Some(p.b))?; // x·Uᵀ + b  [B, D]
//!         let s = t.add(wz, ux)?;
//!         Ok(t.tanh(s))
//!     }
//! }
//!
//! let mut tape = Tape::<f64>::new();
//! let p = TanhParams {
//!     w: tape.param(ArrayD::from_elem(vec![3, 3], 0.1)),
//!     u: tape.param(ArrayD::from_elem(vec![3, 2], 0.5)),
//!     b: tape.param(ArrayD::zeros(vec![3])),
//! };
//! let x = tape.constant(Array2::from_elem((4, 2), 1.0).into_dyn());
//! let deq = DeqConfig::new(GradientRule::implicit(SolverConfig::anderson(), 1e-10, 100));
//! let z0 = ArrayD::zeros(vec![4, 3]);
//! let (z, report) = implicit_forward(&mut tape, &TanhDeq, x, &p, &z0, &deq).unwrap();
//! let loss = tape.sum(z);
//! let grads = tape.backward(loss).unwrap();
//! assert!(grads.get(p.w).is_some() && report.forward_converged());
//! assert!(report.backward.get().unwrap().converged());
//! ```

mod implicit;
mod regularizer;
mod rule;
mod spectral_norm;

pub use implicit::{
    check_param_count, implicit_forward, implicit_forward_with_rng, BackwardReport, BackwardSlot,
    GradFloat, GradReport, ImplicitDriver, ImplicitLayer, ParamSet,
};
pub use regularizer::{
    fixed_point_correction, jacobian_penalty, FixedPointCorrection, JacobianPenalty,
};
pub use rule::{BackwardFailure, DeqConfig, GradientRule, GradientRuleKind};
pub use spectral_norm::{SpectralNorm, SpectralNormConfig};
