"""Type stubs of the Rust extension module (use the wrappers of ``elm_solver`` instead)."""

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

def solve(
    fun: Callable[..., Any],
    z0: np.ndarray,
    solver: str,
    params_json: str,
    abs_tol: Optional[float],
    rel_tol: Optional[float],
    rel_eps: Optional[float],
    max_iter: Optional[int],
    divergence_factor: Optional[float],
    norm: str,
    combine: str,
    return_best: bool,
    trace: bool,
    spectral_radius_iters: int,
    active_only: bool,
) -> Dict[str, Any]: ...
def linear_solve(
    matvec: Callable[..., Any],
    b: np.ndarray,
    x0: Optional[np.ndarray],
    rmatvec: Optional[Callable[..., Any]],
    config_json: str,
    abs_tol: Optional[float],
    rel_tol: Optional[float],
    rel_eps: Optional[float],
    max_iter: Optional[int],
    divergence_factor: Optional[float],
    norm: str,
    combine: str,
    active_only: bool,
) -> Dict[str, Any]: ...
def solver_names() -> Tuple[List[str], List[str]]: ...
def default_params(solver: str) -> str: ...
def problem_names() -> List[str]: ...

class CanonicalProblem:
    """One of the crate's canonical problems ("linear", "tanh", "cos", "poisson")."""

    def __init__(self, name: str, rho: float = 0.9, seed: int = 0) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def z0(self) -> np.ndarray: ...
    @property
    def exact(self) -> Optional[np.ndarray]: ...
    def __call__(self, z: np.ndarray) -> np.ndarray: ...
    def solve_native(
        self,
        solver: str,
        params_json: str,
        abs_tol: Optional[float] = None,
        rel_tol: Optional[float] = None,
        max_iter: Optional[int] = None,
    ) -> Tuple[np.ndarray, List[str], List[int], int]: ...

def benchmark_names() -> List[str]: ...

class BenchmarkProblem:
    """A problem of the solver benchmark: ``problem(x)`` is ``g(x) = x + alpha F(x)``."""

    def __init__(self, name: str) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def alpha(self) -> float: ...
    @property
    def description(self) -> str: ...
    @property
    def x0(self) -> np.ndarray: ...
    def root(self, x: np.ndarray) -> np.ndarray: ...
    def __call__(self, x: np.ndarray) -> np.ndarray: ...
