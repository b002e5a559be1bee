"""Exceptions of ``elm_solver``: one class per variant of the Rust crate's error enum
(``elm_solver::SolverError``), all under :class:`SolverError`, and :class:`NoConvergence`.

Per-row outcomes do not raise by default: a row that fails to converge, diverges or meets NaN
reports it in ``result.status``; pass ``raise_on_failure=True`` to get :class:`NoConvergence`
instead. A bad argument raises one of these, naming the argument as you spelled it
(``error.argument``), and an exception raised inside the user's function comes back as itself,
with its traceback.
"""

from typing import Any, Optional


class SolverError(Exception):
    """Base class of every error raised by the solvers themselves."""

    def __init__(self, message: str, argument: Optional[str] = None) -> None:
        super().__init__(message)
        self.argument = argument
        """The argument at fault, in Python's spelling (``max_iter``, ``history``), if one is."""


class ConfigError(SolverError, ValueError):
    """A parameter out of range, of the wrong type or unknown (the message names it)."""


class ShapeError(SolverError, ValueError):
    """Arrays of the wrong shape (including what the user's function returned)."""


class InvalidArgumentError(SolverError, ValueError):
    """A request that cannot be served (e.g. a dtype other than float32/float64)."""


class BudgetError(SolverError, MemoryError):
    """An allocation larger than the memory budget allows."""


class JsonError(SolverError, ValueError):
    """Solver parameters that do not form a valid config."""


class NoConvergence(SolverError, RuntimeError):
    """Raised by ``solve``/``linear_solve`` with ``raise_on_failure=True`` when a row did not
    converge; ``error.result`` is the whole (partial) result, every row included."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result
