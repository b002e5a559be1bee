"""Batched fixed-point and linear solvers from the Rust crate ``elm-solver``.

``solve(fun, z0)`` finds ``z = fun(z)`` for every row of a ``[B, D]`` batch with Picard, Anderson
(type II) or Broyden iteration, stopping each row on its own; ``linear_solve(matvec, b)`` solves
``A x = b`` per row with GMRES, BiCGStab, CGNR, a truncated Neumann series or any fixed-point
solver. Rows that fail report it in ``result.status`` ("converged", "max_iter", "diverged",
"non_finite"); only bad arguments raise (``elm_solver.errors``), and an exception raised inside
your function comes back unchanged. The GIL is released while Rust works.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import numpy as np

from . import _native, errors
from .errors import (
    BudgetError,
    ConfigError,
    InvalidArgumentError,
    JsonError,
    ShapeError,
    SolverError,
)

__all__ = [
    "solve",
    "linear_solve",
    "SolveResult",
    "LinearResult",
    "SOLVERS",
    "LINEAR_SOLVERS",
    "default_params",
    "CanonicalProblem",
    "PROBLEMS",
    "BenchmarkProblem",
    "BENCHMARKS",
    "errors",
    "SolverError",
    "ConfigError",
    "ShapeError",
    "InvalidArgumentError",
    "BudgetError",
    "JsonError",
]

SOLVERS, LINEAR_SOLVERS = (tuple(names) for names in _native.solver_names())
"""The built-in fixed-point solvers and linear solvers, by name (the crate's one list)."""

PROBLEMS = tuple(_native.problem_names())
"""The crate's canonical test problems (``CanonicalProblem(name)``)."""

CanonicalProblem = _native.CanonicalProblem

BENCHMARKS = tuple(_native.benchmark_names())
"""The solver benchmark's problems (``BenchmarkProblem(name)``; scripts/solver-benchmark.sh)."""

BenchmarkProblem = _native.BenchmarkProblem


@dataclass(frozen=True)
class _Rows:
    status: List[str]
    """Per row: "converged", "max_iter", "diverged" or "non_finite"."""
    iterations: np.ndarray
    """Per row: map evaluations (or operator applications) spent, int64."""
    residual: np.ndarray
    """Per row: ``‖f(z) − z‖₂`` (``‖b − A x‖₂`` for a linear solve) at the returned state."""
    rel_residual: np.ndarray
    """Per row: the residual relative to ``‖f(z)‖₂ + rel_eps`` (``‖b‖₂`` for a linear solve)."""
    restarts: np.ndarray
    """Per row: times the solver dropped its history (Anderson/Broyden safeguards)."""
    backtracks: np.ndarray
    """Per row: Broyden's step halvings."""
    trace: Optional[List[np.ndarray]]
    """Per row, with ``trace=True``: the absolute residual after every evaluation."""

    @property
    def converged(self) -> bool:
        """Whether every row converged."""
        return all(s == "converged" for s in self.status)


@dataclass(frozen=True)
class SolveResult(_Rows):
    """The outcome of :func:`solve`."""

    z: np.ndarray = field(default=None)  # type: ignore[assignment]
    """``[B, D]``: each row's lowest-residual iterate (or its last, with ``return_best=False``)."""
    map_evals: int = 0
    """Batched calls of ``fun`` made by the iteration."""


@dataclass(frozen=True)
class LinearResult(_Rows):
    """The outcome of :func:`linear_solve`."""

    x: np.ndarray = field(default=None)  # type: ignore[assignment]
    """``[B, D]``: each row's final iterate."""
    applications: int = 0
    """Batched calls of ``matvec`` (and ``rmatvec``)."""


def _batch(name: str, a: Any, dtype: Optional[np.dtype] = None) -> np.ndarray:
    """``a`` as a C-contiguous 2-D float32/float64 array (any input layout), or a typed error."""
    arr = np.asarray(a)
    if dtype is None and arr.dtype not in (np.float32, np.float64):
        raise InvalidArgumentError(
            f"{name} must be float32 or float64, got {arr.dtype} (cast it first)"
        )
    if dtype is not None and arr.dtype != dtype:
        raise InvalidArgumentError(f"{name} must have dtype {dtype} like b, got {arr.dtype}")
    if arr.ndim != 2:
        raise ShapeError(f"{name} must be 2-D [B, D], got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ShapeError(f"{name} must have at least one row and one column, got {arr.shape}")
    return np.ascontiguousarray(arr)


def _params_json(params: dict) -> str:
    try:
        return json.dumps(params, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"solver parameters must be finite numbers or booleans: {e}") from None


def solve(
    fun: Callable[..., Any],
    z0: Any,
    solver: str = "anderson",
    *,
    abs_tol: Optional[float] = None,
    rel_tol: Optional[float] = None,
    rel_eps: Optional[float] = None,
    max_iter: Optional[int] = None,
    divergence_factor: Optional[float] = None,
    return_best: bool = True,
    trace: bool = False,
    active_only: bool = False,
    **solver_params: Any,
) -> SolveResult:
    """Solve ``z = fun(z)`` for every row of ``z0``.

    Args:
        fun: called with the whole ``[B, D]`` batch (read-only; rows that have stopped are
            passed frozen and their outputs ignored), returning ``[B, D]``. With
            ``active_only=True`` it is called as ``fun(z_active, rows)`` with only the rows
            still iterating (``rows``: their indices, int64) and returns ``[len(rows), D]``.
        z0: ``[B, D]`` float32 or float64, any memory layout; the solve runs in its dtype.
        solver: one of ``SOLVERS`` ("picard", "anderson", "broyden").
        abs_tol, rel_tol, rel_eps, max_iter, divergence_factor: each row stops when
            ``‖f(z) − z‖₂ ≤ abs_tol`` or ``‖f(z) − z‖₂ / (‖f(z)‖₂ + rel_eps) ≤ rel_tol``
            (converged), after ``max_iter`` evaluations, when its residual exceeds
            ``divergence_factor`` × its first one (diverged), or on NaN/∞ (non_finite). Left
            out: the crate's defaults (``rel_tol`` 1e-6, ``max_iter`` 1000).
        return_best: return each row's lowest-residual iterate (else its last).
        trace: record each row's residual after every evaluation (``result.trace``).
        **solver_params: the solver's parameters by name, e.g. ``history=5, beta=1.0`` for
            Anderson (``default_params(solver)`` lists them); an unknown one raises
            :class:`ConfigError` naming the solvers that have it.

    Returns:
        :class:`SolveResult` with ``z`` and, per row, ``status``, ``iterations`` and ``residual``.
    """
    if not callable(fun):
        raise InvalidArgumentError("fun must be callable")
    z = _batch("z0", z0)
    out = _native.solve(
        fun,
        z,
        solver,
        _params_json(solver_params),
        abs_tol,
        rel_tol,
        rel_eps,
        max_iter,
        divergence_factor,
        bool(return_best),
        bool(trace),
        bool(active_only),
    )
    return SolveResult(**out)


def linear_solve(
    matvec: Callable[..., Any],
    b: Any,
    solver: str = "gmres",
    *,
    x0: Any = None,
    rmatvec: Optional[Callable[..., Any]] = None,
    abs_tol: Optional[float] = None,
    rel_tol: Optional[float] = None,
    rel_eps: Optional[float] = None,
    max_iter: Optional[int] = None,
    divergence_factor: Optional[float] = None,
    active_only: bool = False,
    **solver_params: Any,
) -> LinearResult:
    """Solve ``A x = b`` for every row of ``b`` with a matrix-free ``A``.

    Args:
        matvec: ``matvec(x) -> A x`` on a ``[B, D]`` batch of row vectors (the same calling
            convention as :func:`solve`'s ``fun``, ``active_only`` included).
        b: ``[B, D]`` float32 or float64.
        solver: one of ``LINEAR_SOLVERS`` ("gmres", "bicgstab", "neumann", "cgnr") or a
            fixed-point solver of ``SOLVERS`` run on ``x = b + (I − A) x``.
        x0: starting point (zeros when left out); same shape and dtype as ``b``.
        rmatvec: ``Aᵀ x``, needed by "cgnr".
        abs_tol, rel_tol, rel_eps, max_iter, divergence_factor: per-row stopping on the true
            residual ``b − A x`` (see :func:`solve`).
        **solver_params: e.g. ``restart=30`` for GMRES, ``terms=50`` for Neumann.

    Returns:
        :class:`LinearResult` with ``x`` and the per-row outcomes.
    """
    if not callable(matvec) or (rmatvec is not None and not callable(rmatvec)):
        raise InvalidArgumentError("matvec (and rmatvec) must be callable")
    bb = _batch("b", b)
    xx = None
    if x0 is not None:
        xx = _batch("x0", x0, bb.dtype)
        if xx.shape != bb.shape:
            raise ShapeError(f"x0 has shape {xx.shape}, b {bb.shape}")
    config = dict(solver_params)
    config["kind"] = solver
    out = _native.linear_solve(
        matvec,
        bb,
        xx,
        rmatvec,
        _params_json(config),
        abs_tol,
        rel_tol,
        rel_eps,
        max_iter,
        divergence_factor,
        bool(active_only),
    )
    return LinearResult(**out)


def default_params(solver: str) -> dict:
    """The default parameters of a built-in fixed-point solver (its JSON config)."""
    params = json.loads(_native.default_params(solver))
    params.pop("kind", None)
    params.pop("output", None)
    return params
