//! Batched, matrix-free solvers of linear systems `A x = b`, one independent system per row of a
//! `[B, D]` batch: restarted GMRES(m), BiCGStab, a truncated Neumann series and any fixed-point
//! solver on `x = b + (I − A) x`. Written for the adjoint of implicit layers, `(I − Jᵀ) u = g`,
//! where `A` is only available as products (one vector-Jacobian product per application), so
//! every method but one touches `A` only through a [`LinearOperator`]'s products `A v`. CG on the
//! normal equations (CGNR) also needs `Aᵀ v`: an operator offers it through
//! [`LinearOperator::apply_transpose`] ([`MatrixOperator`], [`FnOperatorPair`]).
//!
//! ## Per-row stopping
//! Each row runs its own method state. Every batched operator call applies `A` to one vector per
//! row still active (which vector depends on where that row is in its method); a row that stops
//! is frozen (it is passed as inactive and its input row is zero), so a row's result does not
//! depend on the other rows of the batch when the operator acts on rows independently.
//! With `r = b − A x`, the stop test of [`StopCriteria`](crate::StopCriteria) reads
//!
//! * `abs = ‖r‖₂`, `rel = ‖r‖₂ / (‖b‖₂ + rel_eps)`: **Converged** when `abs ≤ abs_tol` or
//!   `rel ≤ rel_tol` (a zero residual always converges); **NonFinite** on NaN/∞;
//!   **Diverged** when `abs > divergence_factor · ‖r₀‖`; **MaxIter** after `max_iter`
//!   operator applications for the row (or when a Neumann series used all its `terms`).
//!
//! A row is Converged only on its *true* residual `b − A x`: when a method's recursive estimate
//! (GMRES's Givens residual, BiCGStab's recurrence, the next Neumann term) first meets the
//! tolerance, one more application checks it, and a row whose true residual falls short restarts
//! from there. A row stopped for any other reason reports its last estimate. Applications are
//! counted per row ([`RowOutcome::iterations`](crate::RowOutcome::iterations)); [`RowOutcome::restarts`](crate::RowOutcome::restarts) counts cycles after
//! the first (GMRES restarts, BiCGStab restarts after a breakdown or a failed check).
//!
//! The fixed-point variant runs the [`FixedPointSolver`](crate::FixedPointSolver) of its
//! [`SolverConfig`](crate::SolverConfig) with that solver's own stop semantics (its relative residual divides by
//! `‖f(x)‖` rather than `‖b‖`). States may be `f32` or `f64`; the Krylov methods keep their
//! vectors and scalars in f64 and round only the vectors handed to the operator.

mod bicgstab;
mod cgnr;
mod config;
mod driver;
mod gmres;
#[cfg(feature = "serde")]
mod json;
mod neumann;
mod operator;

pub use config::{
    LinearSolverConfig, LinearSolverKind, BUILTIN_LINEAR_SOLVERS, DEFAULT_GMRES_RESTART,
    DEFAULT_NEUMANN_TERMS,
};
pub use driver::LinearSolution;
pub use operator::{FnOperator, FnOperatorPair, LinearOperator, MatrixOperator};
