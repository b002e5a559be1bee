"""Batched fixed-point and linear solvers from the Rust crate ``elm-solver``.

``solve(fun, z0)`` finds ``z = fun(z)`` for every row of a ``[B, D]`` batch with Picard, Anderson
(type II) or Broyden iteration, stopping each row on its own; ``linear_solve(matvec, b)`` solves
``A x = b`` per row with GMRES, BiCGStab, CGNR, a truncated Neumann series or any fixed-point
solver. Rows that fail report it in ``result.status`` ("converged", "max_iter", "diverged",
"non_finite"; ``result.success`` per row, ``result.message`` for people), or raise
:class:`NoConvergence` with ``raise_on_failure=True``; bad arguments raise
(``elm_solver.errors``), and an exception raised inside your function comes back unchanged.
Only the tolerances you name are used. The GIL is released while Rust works.
``elm_solver.torch`` (needs PyTorch) is a fixed-point layer with implicit gradients.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import numpy as np

from . import _native, errors
from .errors import (
    BudgetError,
    ConfigError,
    InvalidArgumentError,
    JsonError,
    NoConvergence,
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
    "NoConvergence",
    "STATUSES",
    "NORMS",
    "COMBINES",
]

SOLVERS, LINEAR_SOLVERS = (tuple(names) for names in _native.solver_names())
"""The built-in fixed-point solvers and linear solvers, by name (the crate's one list)."""

PROBLEMS = tuple(_native.problem_names())
"""The crate's canonical test problems (``CanonicalProblem(name)``)."""

CanonicalProblem = _native.CanonicalProblem

BENCHMARKS = tuple(_native.benchmark_names())
"""The solver benchmark's problems (``BenchmarkProblem(name)``; scripts/solver-benchmark.sh)."""

BenchmarkProblem = _native.BenchmarkProblem


STATUSES = ("converged", "max_iter", "diverged", "non_finite")
"""The values of ``result.status``, the crate's ``RowStatus`` by name."""

NORMS = ("l2", "max")
"""``norm=``: the 2-norm (TorchDEQ, the DEQ literature) or the max-norm (SciPy, optimistix)."""

COMBINES = ("any", "all")
"""``combine=``: converged when either named tolerance holds, or only when every one does."""


@dataclass(frozen=True)
class _Rows:
    status: np.ndarray
    """Per row: "converged", "max_iter", "diverged" or "non_finite" (a NumPy array of str, so
    ``result.status == "converged"`` compares elementwise)."""
    iterations: np.ndarray
    """Per row: map evaluations (or operator applications) spent, int64."""
    residual: np.ndarray
    """Per row: ``‖f(z) − z‖`` (``‖b − A x‖₂`` for a linear solve) at the returned state, in
    the solve's ``norm``."""
    rel_residual: np.ndarray
    """Per row: the residual relative to ``‖f(z)‖ + rel_eps`` (``‖b‖₂`` for a linear solve)."""
    restarts: np.ndarray
    """Per row: times the solver dropped its history (Anderson/Broyden safeguards)."""
    backtracks: np.ndarray
    """Per row: Broyden's step halvings."""
    rejections: np.ndarray
    """Per row: accelerated points refused by Anderson's ``safeguard`` (one evaluation each)."""
    spectral_radius: np.ndarray
    """Per row, with ``spectral_radius_iters > 0``: the estimated spectral radius of ``∂f/∂z``
    at the returned state (NaN otherwise). Above 1, the point repels the plain iteration: near
    a fold an accelerated solver may have left the start's branch."""
    trace: Optional[List[np.ndarray]]
    """Per row, with ``trace=True``: the residual after every evaluation."""

    @property
    def success(self) -> np.ndarray:
        """Per row: whether it converged (bool array)."""
        return self.status == "converged"

    @property
    def converged(self) -> bool:
        """Whether every row converged."""
        return bool(self.success.all())

    @property
    def nfev(self) -> np.ndarray:
        """Per row: evaluations of the function spent (SciPy's name; same as ``iterations``).
        Batched calls are ``map_evals`` (``applications`` for a linear solve)."""
        return self.iterations

    @property
    def message(self) -> str:
        """One line on how the rows ended, for people."""
        n = len(self.status)
        counts = {s: int((self.status == s).sum()) for s in STATUSES}
        if counts["converged"] == n:
            return f"all {n} rows converged (largest residual {self.residual.max():.3g})"
        failed = np.flatnonzero(~self.success)
        parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES[1:] if counts[s])
        shown = ", ".join(str(i) for i in failed[:8]) + (", ..." if len(failed) > 8 else "")
        failed_res = self.residual[failed]
        worst = np.nanmax(failed_res) if np.isfinite(failed_res).any() else float("nan")
        return (
            f"{counts['converged']} of {n} rows converged; {parts} (rows {shown}; largest "
            f"residual of a failed row {worst:.3g})"
        )


def _rows(out: dict) -> dict:
    out["status"] = np.array(out["status"], dtype=str)
    return out


@dataclass(frozen=True)
class SolveResult(_Rows):
    """The outcome of :func:`solve` (``.z``, alias ``.x``; per-row ``status``, ``success``,
    ``nfev``, ``residual``; ``message``)."""

    z: np.ndarray = field(default=None)  # type: ignore[assignment]
    """``[B, D]``: each row's lowest-residual iterate (or its last, with ``return_best=False``)."""
    map_evals: int = 0
    """Batched calls of ``fun`` made by the iteration."""

    @property
    def x(self) -> np.ndarray:
        """``z`` under SciPy's name."""
        return self.z


@dataclass(frozen=True)
class LinearResult(_Rows):
    """The outcome of :func:`linear_solve`."""

    x: np.ndarray = field(default=None)  # type: ignore[assignment]
    """``[B, D]``: each row's final iterate."""
    applications: int = 0
    """Batched calls of ``matvec`` (and ``rmatvec``)."""


def _real(name: str, value: Any, *, above: float = 0.0, inclusive: bool = True,
          allow_inf: bool = False) -> Optional[float]:
    """``value`` as a float checked against its range, or a ConfigError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating)):
        raise ConfigError(f"`{name}` must be a real number, got {value!r}", name)
    v = float(value)
    ok = (v >= above if inclusive else v > above) and (math.isfinite(v) or (allow_inf and v > 0))
    if not ok:
        bound = f">= {above:g}" if inclusive else f"> {above:g}"
        finite = " (or inf)" if allow_inf else " and finite"
        raise ConfigError(f"`{name}` must be {bound}{finite}, got {value!r}", name)
    return v


def _count(name: str, value: Any, *, least: int) -> Optional[int]:
    """``value`` as an int ``>= least``, or a ConfigError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral,)):
        raise ConfigError(f"`{name}` must be an integer, got {value!r}", name)
    if int(value) < least:
        raise ConfigError(f"`{name}` must be >= {least}, got {value!r}", name)
    if int(value) > 2**63 - 1:
        raise ConfigError(f"`{name}` is too large: {value!r}", name)
    return int(value)


def _choice(name: str, value: Any, choices: tuple) -> str:
    if value not in choices:
        raise ConfigError(f"`{name}` must be one of {', '.join(map(repr, choices))}, got {value!r}",
                          name)
    return value


def _stop_args(abs_tol, rel_tol, rel_eps, max_iter, divergence_factor, norm, combine) -> tuple:
    """The stopping arguments checked and in the order of the native functions."""
    return (
        _real("abs_tol", abs_tol),
        _real("rel_tol", rel_tol),
        _real("rel_eps", rel_eps),
        _count("max_iter", max_iter, least=1),
        _real("divergence_factor", divergence_factor, above=1.0, inclusive=False, allow_inf=True),
        _choice("norm", norm, NORMS),
        _choice("combine", combine, COMBINES),
    )


def _finish(result: Any, raise_on_failure: bool, what: str) -> Any:
    if raise_on_failure and not result.converged:
        raise NoConvergence(f"{what}: {result.message}", result)
    return result


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
    norm: str = "l2",
    combine: str = "any",
    return_best: bool = True,
    trace: bool = False,
    spectral_radius_iters: int = 0,
    active_only: bool = False,
    raise_on_failure: bool = False,
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
        abs_tol, rel_tol, rel_eps, max_iter, divergence_factor, norm, combine: each row stops
            as converged when ``‖f(z) − z‖ ≤ abs_tol`` and/or ``‖f(z) − z‖ / (‖f(z)‖ + rel_eps)
            ≤ rel_tol``; after ``max_iter`` evaluations (max_iter); when its residual exceeds
            ``divergence_factor`` × its first one (diverged; ``inf``: never); or when ``fun``
            returns NaN/∞ (non_finite). **Only the tolerances you name are used**: naming
            ``abs_tol`` alone switches the default ``rel_tol`` off; naming neither uses
            ``rel_tol=1e-6``. ``norm``: "l2" (default, per row) or "max" (SciPy's ``f_tol``);
            ``combine``: "any" (default: either named tolerance) or "all" (every named one, as
            SciPy combines its tolerances). ``max_iter`` defaults to 1000, ``rel_eps`` to 1e-12,
            ``divergence_factor`` to 1e8. Residuals are computed without overflow.
        return_best: return each row's lowest-residual iterate (else its last).
        trace: record each row's residual after every evaluation (``result.trace``).
        spectral_radius_iters: power-iteration steps estimating ``ρ(∂f/∂z)`` at each returned
            state (``result.spectral_radius``; costs ``1 + spectral_radius_iters`` batched
            calls). A value above 1 says the point repels plain iteration.
        raise_on_failure: raise :class:`NoConvergence` (carrying the result) when any row did
            not converge, instead of returning it.
        **solver_params: the solver's parameters by name, e.g. ``history=5, beta=1.0`` for
            Anderson, ``safeguard=True`` for Anderson's residual safeguard
            (``default_params(solver)`` lists them); an unknown one raises
            :class:`ConfigError` naming the solvers that have it.

    Returns:
        :class:`SolveResult`: ``z`` (alias ``x``), per row ``status``, ``success``, ``nfev``,
        ``residual``; ``message``; ``map_evals``.
    """
    if not callable(fun):
        raise InvalidArgumentError("`fun` must be callable", "fun")
    z = _batch("z0", z0)
    if not isinstance(solver, str):
        # A name the crate does not know is refused there, naming the solvers it has.
        _choice("solver", solver, SOLVERS)
    out = _native.solve(
        fun,
        z,
        solver,
        _params_json(solver_params),
        *_stop_args(abs_tol, rel_tol, rel_eps, max_iter, divergence_factor, norm, combine),
        bool(return_best),
        bool(trace),
        _count("spectral_radius_iters", spectral_radius_iters, least=0),
        bool(active_only),
    )
    return _finish(SolveResult(**_rows(out)), raise_on_failure, "solve")


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
    norm: str = "l2",
    combine: str = "any",
    active_only: bool = False,
    raise_on_failure: bool = False,
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
        abs_tol, rel_tol, rel_eps, max_iter, divergence_factor, norm, combine: per-row
            stopping on the true residual ``b − A x``, with the rules of :func:`solve` (the
            Krylov solvers take ``norm="l2"`` only).
        raise_on_failure: raise :class:`NoConvergence` when any row did not converge.
        **solver_params: e.g. ``restart=30`` for GMRES, ``terms=50`` for Neumann.

    Returns:
        :class:`LinearResult` with ``x`` and the per-row outcomes.
    """
    if not callable(matvec):
        raise InvalidArgumentError("`matvec` must be callable", "matvec")
    if rmatvec is not None and not callable(rmatvec):
        raise InvalidArgumentError("`rmatvec` must be callable", "rmatvec")
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
        *_stop_args(abs_tol, rel_tol, rel_eps, max_iter, divergence_factor, norm, combine),
        bool(active_only),
    )
    out.pop("spectral_radius", None)
    return _finish(
        LinearResult(spectral_radius=np.full(len(out["status"]), np.nan), **_rows(out)),
        raise_on_failure,
        "linear_solve",
    )


def default_params(solver: str) -> dict:
    """The default parameters of a built-in fixed-point solver (its JSON config)."""
    params = json.loads(_native.default_params(solver))
    params.pop("kind", None)
    params.pop("output", None)
    return params
