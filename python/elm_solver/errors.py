"""Exceptions of ``elm_solver``: one class per variant of the Rust crate's error enum
(``elm_solver::SolverError``), all under :class:`SolverError`.

Per-row outcomes never raise: a row that fails to converge, diverges or meets NaN reports it in
``result.status``. Only a bad argument raises one of these, and an exception raised inside the
user's function comes back as itself, with its traceback.
"""


class SolverError(Exception):
    """Base class of every error raised by the solvers themselves."""


class ConfigError(SolverError, ValueError):
    """A parameter out of range or unknown (the message names it)."""


class ShapeError(SolverError, ValueError):
    """Arrays of the wrong shape (including what the user's function returned)."""


class InvalidArgumentError(SolverError, ValueError):
    """A request that cannot be served (e.g. a dtype other than float32/float64)."""


class BudgetError(SolverError, MemoryError):
    """An allocation larger than the memory budget allows."""


class JsonError(SolverError, ValueError):
    """Solver parameters that do not form a valid config."""
