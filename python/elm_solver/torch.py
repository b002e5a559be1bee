"""A deep-equilibrium (DEQ) fixed-point layer for PyTorch, solved by ``elm_solver``.

``DEQFixedPoint(f)`` maps an input ``x`` to the fixed point ``z* = f(z*, x)``: the forward pass
runs one of the package's fixed-point solvers (Anderson by default) on CPU tensors without
recording a graph, and the backward pass differentiates through the fixed point implicitly
(Bai, Kolter & Koltun, "Deep Equilibrium Models", 2019): the incoming gradient ``g`` is replaced
by the solution ``y`` of ``(I − Jᵀ) y = g`` (``J = ∂f/∂z`` at ``z*``), solved by one of the
package's linear solvers (GMRES by default) on PyTorch's vector–Jacobian products, so memory does
not grow with the number of forward iterations. ``backward="jfb"`` instead backpropagates through
the last application of ``f`` alone (Jacobian-free backpropagation, Fung et al., 2022).

This module is the only part of ``elm_solver`` that imports PyTorch; ``import elm_solver`` does
not need it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised only where torch is absent
    raise ImportError(
        "elm_solver.torch needs PyTorch (`pip install torch`); the rest of elm_solver does not"
    ) from e

import elm_solver as es

__all__ = ["DEQFixedPoint", "SolveStats", "ConvergenceWarning", "ConvergenceError"]

_FLOATS = (torch.float32, torch.float64)
_ON_FAILURE = ("warn", "raise", "ignore")
# CGNR needs products with (I − Jᵀ)ᵀ = I − J, i.e. Jacobian-vector products, which reverse-mode
# autograd does not give cheaply; every other solver needs only Jᵀ v.
_BACKWARD_SOLVERS = tuple(s for s in es.LINEAR_SOLVERS if s != "cgnr") + tuple(es.SOLVERS)


class ConvergenceWarning(RuntimeWarning):
    """A forward or backward solve left some rows unconverged (``on_failure="warn"``)."""


class ConvergenceError(RuntimeError):
    """A forward or backward solve left some rows unconverged (``on_failure="raise"``)."""


@dataclass(frozen=True)
class SolveStats:
    """The per-row outcome of one forward (fixed-point) or backward (linear) solve."""

    solver: str
    status: np.ndarray
    """Per row: "converged", "max_iter", "diverged" or "non_finite"."""
    iterations: np.ndarray
    """Per row: map evaluations (forward) or operator applications (backward) spent."""
    residual: np.ndarray
    """Per row: ``‖f(z) − z‖₂`` (forward) or ``‖g − (I − Jᵀ) y‖₂`` (backward) at the result."""

    @classmethod
    def _of(cls, solver: str, result: Any) -> "SolveStats":
        return cls(
            solver=solver,
            status=np.asarray(result.status),
            iterations=np.asarray(result.iterations),
            residual=np.asarray(result.residual),
        )

    @property
    def converged(self) -> bool:
        """Whether every row converged."""
        return bool((self.status == "converged").all())

    def summary(self) -> str:
        """One line: rows converged, iterations and the largest residual."""
        kinds, counts = np.unique(self.status, return_counts=True)
        outcome = ", ".join(f"{n} {k}" for k, n in zip(kinds, counts))
        return (
            f"{self.solver}: {outcome} of {len(self.status)} rows; iterations mean "
            f"{self.iterations.mean():.1f}, max {self.iterations.max()}; "
            f"max residual {self.residual.max():.2e}"
        )


def _rows(t: "torch.Tensor") -> np.ndarray:
    """``t`` (``[B, ...]``) as a ``[B, D]`` NumPy array, a view of its memory if contiguous."""
    return t.detach().reshape(t.shape[0], -1).numpy()


def _check_float_cpu(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(
            f"{name} is on {t.device}: DEQFixedPoint solves on the CPU only (move it with .cpu())"
        )
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
    if t.dim() < 1 or t.shape[0] == 0 or t.numel() == 0:
        raise ValueError(f"{name} must be a non-empty batch [B, ...], got shape {tuple(t.shape)}")


class DEQFixedPoint(torch.nn.Module):
    """The fixed point ``z* = f(z*, x)`` of a layer ``f``, differentiable in ``x`` and ``f``'s
    parameters.

    Args:
        f: ``f(z, x) -> z'``, a ``torch.nn.Module`` (its parameters become this module's) or any
            callable on tensors. ``z`` is ``[B, ...]`` (any per-row shape, flattened to
            ``[B, D]`` for the solver) and ``f`` must return a tensor of the same shape and
            dtype. Assumptions: rows are independent (no operation that mixes the batch, such
            as BatchNorm in training mode: the solver stops rows one by one and freezes those
            that have stopped), ``f`` is deterministic (no dropout while solving) and, for
            the implicit backward, differentiable in ``z`` with ``I − ∂f/∂z`` invertible at the
            fixed point (a contraction in ``z`` guarantees both the fixed point and this).
        solver: the forward fixed-point solver, one of ``elm_solver.SOLVERS``.
        backward: "implicit" (the exact gradient of the fixed point, up to the solves'
            tolerances) or "jfb" (the gradient of the last step ``f(z*, x)`` with ``z*`` held
            constant: cheaper, a descent direction for contractive ``f``, not the exact gradient).
        backward_solver: for "implicit", the solver of ``(I − Jᵀ) y = g``: "gmres", "bicgstab",
            "neumann" or a fixed-point solver of ``elm_solver.SOLVERS`` (run on
            ``y = g + Jᵀ y``).
        abs_tol, rel_tol, max_iter: the forward stopping rule per row, as in
            :func:`elm_solver.solve`: converged when ``‖f(z, x) − z‖₂ ≤ abs_tol`` or
            ``‖f(z, x) − z‖₂ / ‖f(z, x)‖₂ ≤ rel_tol``, failed after ``max_iter`` evaluations of
            ``f``. Only the tolerances you name are used (neither: ``rel_tol=1e-6``).
        backward_abs_tol, backward_rel_tol, backward_max_iter: the same for the backward
            linear solve, on its residual relative to ``‖g‖₂`` per row.
        solver_params, backward_solver_params: the solvers' own parameters, e.g.
            ``{"history": 5}`` for Anderson or ``{"restart": 20}`` for GMRES.
        z_shape: the per-row shape of ``z`` when it differs from ``x``'s and no ``z0`` is passed
            to :meth:`forward` (then ``z0`` is zeros of shape ``[B, *z_shape]``; without
            ``z_shape``, zeros shaped like ``x``).
        on_failure: what an unconverged row in a forward or backward solve does: "warn"
            (:class:`ConvergenceWarning`, the default), "raise" (:class:`ConvergenceError`) or
            "ignore". The result is returned (or the gradient used) either way with "warn"
            and "ignore": each row's best iterate.

    After each call, ``forward_stats`` (and, after each implicit backward, ``backward_stats``)
    hold the last solve's per-row :class:`SolveStats`: status, iterations, residual.

    Tensors must be on the CPU, float32 or float64, ``x`` and ``z0`` of one dtype. NumPy views
    of them are handed to the solver without copies where the memory is contiguous, and the
    result comes back as a tensor over the solver's own array. Higher-order gradients
    (``create_graph=True``) are not supported by the implicit backward.
    """

    def __init__(
        self,
        f: Callable[..., "torch.Tensor"],
        solver: str = "anderson",
        *,
        backward: str = "implicit",
        backward_solver: str = "gmres",
        abs_tol: Optional[float] = None,
        rel_tol: Optional[float] = None,
        max_iter: int = 50,
        backward_abs_tol: Optional[float] = None,
        backward_rel_tol: Optional[float] = None,
        backward_max_iter: int = 50,
        solver_params: Optional[Dict[str, Any]] = None,
        backward_solver_params: Optional[Dict[str, Any]] = None,
        z_shape: Optional[Sequence[int]] = None,
        on_failure: str = "warn",
    ) -> None:
        super().__init__()
        if not callable(f):
            raise TypeError("f must be callable as f(z, x)")
        if solver not in es.SOLVERS:
            raise ValueError(f"solver must be one of {es.SOLVERS}, got {solver!r}")
        if backward not in ("implicit", "jfb"):
            raise ValueError(f'backward must be "implicit" or "jfb", got {backward!r}')
        if backward_solver not in _BACKWARD_SOLVERS:
            raise ValueError(
                f"backward_solver must be one of {_BACKWARD_SOLVERS}, got {backward_solver!r}"
            )
        if on_failure not in _ON_FAILURE:
            raise ValueError(f"on_failure must be one of {_ON_FAILURE}, got {on_failure!r}")
        self.f = f
        self.solver = solver
        self.backward = backward
        self.backward_solver = backward_solver
        self.abs_tol, self.rel_tol, self.max_iter = abs_tol, rel_tol, max_iter
        self.backward_abs_tol = backward_abs_tol
        self.backward_rel_tol = backward_rel_tol
        self.backward_max_iter = backward_max_iter
        self.solver_params = dict(solver_params or {})
        self.backward_solver_params = dict(backward_solver_params or {})
        self.z_shape = None if z_shape is None else tuple(z_shape)
        self.on_failure = on_failure
        self.forward_stats: Optional[SolveStats] = None
        self.backward_stats: Optional[SolveStats] = None

    def extra_repr(self) -> str:
        return (
            f"solver={self.solver!r}, backward={self.backward!r}, "
            f"backward_solver={self.backward_solver!r}, abs_tol={self.abs_tol}, "
            f"rel_tol={self.rel_tol}, max_iter={self.max_iter}, on_failure={self.on_failure!r}"
        )

    def _apply_f(self, z: "torch.Tensor", x: "torch.Tensor") -> "torch.Tensor":
        out = self.f(z, x)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"f must return a torch.Tensor, got {type(out).__name__}")
        if out.shape != z.shape or out.dtype != z.dtype:
            raise ValueError(
                f"f(z, x) must return z's shape and dtype {tuple(z.shape)} {z.dtype}, "
                f"got {tuple(out.shape)} {out.dtype}"
            )
        return out

    def _report(self, stats: SolveStats, what: str) -> None:
        if stats.converged or self.on_failure == "ignore":
            return
        message = f"DEQFixedPoint {what} solve did not converge: {stats.summary()}"
        if self.on_failure == "raise":
            raise ConvergenceError(message)
        # stacklevel 3: the caller of forward() (through nn.Module.__call__) for the forward.
        warnings.warn(message, ConvergenceWarning, stacklevel=3)

    def forward(self, x: "torch.Tensor", z0: Optional["torch.Tensor"] = None) -> "torch.Tensor":
        """The fixed point ``z*`` of ``f(·, x)``, ``[B, ...]``, attached to autograd.

        Args:
            x: ``[B, ...]`` float32/float64 CPU tensor, passed to ``f`` unchanged.
            z0: the starting point (zeros when left out); its dtype is ``x``'s, and it must not
                require grad (the fixed point does not depend on where the search starts).
        """
        _check_float_cpu("x", x)
        batch = x.shape[0]
        if z0 is None:
            shape = x.shape if self.z_shape is None else (batch, *self.z_shape)
            z0 = torch.zeros(shape, dtype=x.dtype)
        _check_float_cpu("z0", z0)
        if z0.requires_grad:
            raise ValueError(
                "z0 requires grad, but the fixed point does not depend on the starting point: "
                "pass z0.detach()"
            )
        if z0.dtype != x.dtype or z0.shape[0] != batch:
            raise ValueError(
                f"z0 must have x's dtype and batch size: z0 {tuple(z0.shape)} {z0.dtype}, "
                f"x {tuple(x.shape)} {x.dtype}"
            )
        shape = z0.shape

        def fun(z_rows: np.ndarray) -> np.ndarray:
            return _rows(self._apply_f(torch.from_numpy(z_rows).view(shape), x))

        with torch.no_grad(), warnings.catch_warnings():
            # The solver hands `fun` a read-only array (its state, not to be written), which
            # torch.from_numpy can only wrap with this warning; `f` never writes into it.
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            result = es.solve(
                fun,
                _rows(z0),
                self.solver,
                abs_tol=self.abs_tol,
                rel_tol=self.rel_tol,
                max_iter=self.max_iter,
                **self.solver_params,
            )
        self.forward_stats = SolveStats._of(self.solver, result)
        self._report(self.forward_stats, "forward")
        z_star = torch.from_numpy(result.z).view(shape)

        # One differentiable application of f re-attaches the graph to x and f's parameters:
        # for JFB that is the whole backward, for the implicit backward the hook below replaces
        # the gradient arriving at z by (I − Jᵀ)⁻¹ of it.
        z = self._apply_f(z_star, x)
        if self.backward == "implicit" and z.requires_grad:
            # A second application, on a leaf alias of z*, keeps a graph for the Jᵀ v products
            # alone (as in Bai et al.'s reference code): the hook must not hold `z` itself,
            # which would tie the hook and its tensor in a reference cycle.
            z_in = z_star.detach().requires_grad_()
            f_in = self._apply_f(z_in, x)
            z.register_hook(self._implicit_hook(f_in, z_in))
        return z

    def _implicit_hook(
        self, f_in: "torch.Tensor", z_in: "torch.Tensor"
    ) -> Callable[["torch.Tensor"], "torch.Tensor"]:
        shape = z_in.shape

        def hook(grad: Optional["torch.Tensor"]) -> Optional["torch.Tensor"]:
            if grad is None:  # an undefined gradient (no path to the loss) stays undefined
                return None
            if torch.is_grad_enabled():
                raise NotImplementedError(
                    "DEQFixedPoint's implicit backward does not support create_graph=True "
                    "(higher-order gradients); use backward='jfb' or plain autograd"
                )

            def matvec(y_rows: np.ndarray) -> np.ndarray:
                y = torch.from_numpy(y_rows).view(shape)
                (jty,) = torch.autograd.grad(f_in, z_in, y, retain_graph=True, allow_unused=True)
                # None: f does not read z at all, so J = 0 and the solve is y = g.
                return y_rows if jty is None else _rows(y - jty)

            g = _rows(grad)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "The given NumPy array is not writable")
                # Starting from g (the first term of the Neumann series y = Σ (Jᵀ)ᵏ g) leaves
                # an initial residual ‖Jᵀ g‖ ≤ ‖J‖ ‖g‖ instead of ‖g‖.
                result = es.linear_solve(
                    matvec,
                    g,
                    self.backward_solver,
                    x0=g,
                    abs_tol=self.backward_abs_tol,
                    rel_tol=self.backward_rel_tol,
                    max_iter=self.backward_max_iter,
                    **self.backward_solver_params,
                )
            self.backward_stats = SolveStats._of(self.backward_solver, result)
            self._report(self.backward_stats, "backward")
            return torch.from_numpy(result.x).view(shape)

        return hook
