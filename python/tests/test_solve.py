"""The Python package against the Rust crate and against closed forms (run by scripts/test.sh)."""

import math
import traceback

import numpy as np
import pytest

import elm_solver as es

DOTTIE = 0.7390851332151607  # the fixed point of cos


# ------------------------------------------------------------------ the crate, through Python


@pytest.mark.parametrize("problem", es.PROBLEMS)
@pytest.mark.parametrize("solver", es.SOLVERS)
def test_python_path_equals_the_rust_solve_on_canonical_problems(problem, solver):
    # The crate's own map evaluated through Python callbacks: the same iterations and statuses
    # as the whole solve run in Rust, and the same states up to the last bits (the native solve
    # evaluates only the running rows, the Python function the whole batch, and the crate's
    # matrix products may sum in another order for another number of rows).
    p = es.CanonicalProblem(problem, rho=0.9, seed=3)
    z_rust, status, iterations, map_evals = p.solve_native(solver, "{}", max_iter=400)
    r = es.solve(p, p.z0, solver, max_iter=400)
    assert r.status.tolist() == status
    assert r.iterations.tolist() == iterations
    assert r.map_evals == map_evals
    np.testing.assert_allclose(r.z, z_rust, rtol=1e-12, atol=1e-14)
    if p.exact is not None and all(s == "converged" for s in status):
        assert np.abs(r.z - p.exact).max() < 1e-4


def test_solver_parameters_reach_the_crate():
    p = es.CanonicalProblem("linear", rho=0.9, seed=1)
    params = {"history": 2, "beta": 0.7}
    z_rust, _, iterations, _ = p.solve_native("anderson", '{"history": 2, "beta": 0.7}')
    r = es.solve(p, p.z0, "anderson", **params)
    assert r.iterations.tolist() == iterations
    np.testing.assert_allclose(r.z, z_rust, rtol=1e-12, atol=1e-14)
    default = es.solve(p, p.z0, "anderson")
    assert default.iterations.tolist() != iterations, "the parameters changed nothing"


# ------------------------------------------------------------------ closed forms, dtypes, layouts


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("solver", es.SOLVERS)
def test_cos_fixed_point_in_both_dtypes(dtype, solver):
    tol = 1e-5 if dtype == np.float32 else 1e-9
    r = es.solve(np.cos, np.zeros((3, 1), dtype), solver, rel_tol=tol)
    assert r.converged, r.status
    assert r.z.dtype == dtype
    # |z − z*| ≤ residual / (1 − L), L = sin(z*) ≈ 0.67 near the fixed point.
    assert np.abs(r.z - DOTTIE).max() < 4 * tol


def test_any_memory_layout():
    rng = np.random.default_rng(0)
    base = rng.uniform(-1, 1, size=(8, 6))
    f = lambda z: 0.5 * np.tanh(z) + 0.1
    want = es.solve(f, base.copy()).z
    fortran = np.asfortranarray(base)
    strided = np.zeros((16, 6))
    strided[::2] = base
    for z0 in (fortran, strided[::2], base[:, :][::1]):
        np.testing.assert_array_equal(es.solve(f, z0).z, want)


def _tanh_layer(batch, dim, rho, seed, dtype):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((dim, dim))
    w *= rho / np.linalg.norm(w, 2)
    x = rng.standard_normal((batch, dim))
    return (lambda z: np.tanh(z @ w.T.astype(z.dtype) + x.astype(z.dtype))), np.zeros((batch, dim), dtype)


@pytest.mark.parametrize("batch", [1, 4096])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batches_of_one_and_4096_rows(batch, dtype):
    f, z0 = _tanh_layer(batch, 16, 0.9, 5, dtype)
    tol = 1e-4 if dtype == np.float32 else 1e-8
    r = es.solve(f, z0, "anderson", abs_tol=tol, rel_tol=0.0, max_iter=200)
    assert r.converged, set(r.status)
    assert r.iterations.shape == (batch,)
    # The returned state is a point where f was evaluated: its residual is the reported one.
    res = np.linalg.norm(f(r.z) - r.z, axis=1)
    assert (res <= tol * 1.01).all()
    np.testing.assert_allclose(res, r.residual, rtol=1e-3, atol=1e-12)


# ------------------------------------------------------------------ per-row outcomes never raise


def test_nan_in_one_row_is_that_rows_status():
    def f(z):
        out = np.cos(z)
        out[2] = np.nan
        return out

    r = es.solve(f, np.zeros((4, 1)))
    assert r.status.tolist() == ["converged", "converged", "non_finite", "converged"]
    assert np.abs(r.z[[0, 1, 3]] - DOTTIE).max() < 1e-5


def test_max_iter_and_divergence_are_row_statuses():
    f = lambda z: z * np.array([[0.5], [2.0], [1.0]]) + np.array([[1.0], [1.0], [0.0]])
    r = es.solve(f, np.ones((3, 1)), "picard", max_iter=50, divergence_factor=1e3)
    assert r.status[0] == "converged"
    assert r.status[1] == "diverged"
    # z = z + 0 from z0 = 1 converges at once; a row that cannot make progress hits max_iter:
    g = lambda z: z + 1.0
    assert es.solve(g, np.zeros((2, 1)), "picard", max_iter=7, divergence_factor=1e30).status.tolist() == ["max_iter"] * 2
    assert r.iterations[1] < 50


def test_stopped_rows_are_held_fixed_and_active_only_passes_the_running_rows():
    seen = []

    def f(z):
        seen.append(z.copy())
        return np.cos(z) * np.array([[1.0], [0.5]])

    full = es.solve(f, np.zeros((2, 1)), "picard")
    # Row 1 (the faster contraction) stops first: afterwards it is passed unchanged.
    stop1 = int(full.iterations[1])
    for z in seen[stop1:]:
        assert z[1, 0] == seen[stop1][1, 0]
    calls = []

    def g(z, rows):
        calls.append(rows.tolist())
        return np.cos(z) * np.array([1.0, 0.5])[rows][:, None]

    part = es.solve(g, np.zeros((2, 1)), "picard", active_only=True)
    np.testing.assert_array_equal(part.z, full.z)
    assert part.iterations.tolist() == full.iterations.tolist()
    assert calls[0] == [0, 1] and calls[-1] == [0]


def test_trace_has_one_residual_per_evaluation():
    r = es.solve(np.cos, np.zeros((2, 1)), "anderson", trace=True)
    assert r.trace is not None and len(r.trace) == 2
    for t, n in zip(r.trace, r.iterations):
        assert len(t) == n
    assert es.solve(np.cos, np.zeros((2, 1))).trace is None


# ------------------------------------------------------------------ errors


def test_an_exception_inside_fun_comes_back_with_its_traceback():
    class Boom(RuntimeError):
        pass

    calls = []

    def exploding_map(z):
        calls.append(1)
        if len(calls) == 3:
            raise Boom("third call")
        return np.cos(z)

    with pytest.raises(Boom, match="third call") as info:
        es.solve(exploding_map, np.zeros((2, 1)))
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "exploding_map" in frames
    assert len(calls) == 3


def test_fun_may_not_write_into_the_solvers_state():
    def writer(z):
        z[0, 0] = 1.0
        return z

    with pytest.raises(ValueError, match="read-only"):
        es.solve(writer, np.zeros((1, 1)))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(solver="newton"), es.ConfigError, "unknown solver `newton`"),
        (dict(solver="picard", history=3), es.ConfigError, "`history` is a parameter of anderson, not of picard"),
        (dict(solver="anderson", nonsense=1), es.ConfigError, "no solver has a parameter"),
        (dict(solver="anderson", history=0), es.ConfigError, "history"),
        (dict(solver="anderson", beta=float("nan")), es.ConfigError, "finite"),
        (dict(max_iter=0), es.ConfigError, "max_iter"),
        (dict(rel_tol=-1.0), es.ConfigError, "rel_tol"),
    ],
)
def test_bad_arguments_raise_typed_errors_naming_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        es.solve(np.cos, np.zeros((2, 1)), **kwargs)


def test_bad_arrays_and_functions():
    with pytest.raises(es.InvalidArgumentError, match="float32 or float64"):
        es.solve(np.cos, np.zeros((2, 1), dtype=np.int64))
    with pytest.raises(es.ShapeError, match="2-D"):
        es.solve(np.cos, np.zeros(3))
    with pytest.raises(es.ShapeError, match="at least one row"):
        es.solve(np.cos, np.zeros((0, 3)))
    with pytest.raises(es.ShapeError, match=r"fun returned an array of shape \[2, 2\], expected \(2, 1\)"):
        es.solve(lambda z: np.zeros((2, 2)), np.zeros((2, 1)))
    with pytest.raises(es.ShapeError, match="fun returned"):
        es.solve(lambda z: np.zeros(2), np.zeros((2, 1)))
    with pytest.raises(es.InvalidArgumentError, match="callable"):
        es.solve(3, np.zeros((2, 1)))
    # Every class is a SolverError and a standard Python error.
    assert issubclass(es.ConfigError, es.SolverError) and issubclass(es.ConfigError, ValueError)
    assert issubclass(es.BudgetError, MemoryError)


def test_a_batch_too_large_for_the_memory_budget_is_a_budget_error():
    # Anderson's history is [B, m, D]: a history of a million matrices is refused before any
    # allocation, not attempted.
    with pytest.raises(es.SolverError):
        es.solve(np.cos, np.zeros((64, 1024)), "anderson", history=10_000_000)


# ------------------------------------------------------------------ linear solves


def _system(batch, dim, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    a = np.eye(dim) + 0.3 * rng.standard_normal((dim, dim)) / math.sqrt(dim)
    b = rng.standard_normal((batch, dim))
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("solver", list(es.LINEAR_SOLVERS) + ["anderson"])
def test_linear_solvers_match_numpy(solver):
    a, b = _system(5, 12, 2)
    kwargs = {}
    if solver == "cgnr":
        kwargs["rmatvec"] = lambda x: x @ a
    if solver == "neumann":
        kwargs["terms"] = 400
    r = es.linear_solve(lambda x: x @ a.T, b, solver, rel_tol=1e-10, max_iter=2000, **kwargs)
    assert r.converged, (solver, r.status)
    want = np.linalg.solve(a, b.T).T
    np.testing.assert_allclose(r.x, want, atol=1e-7)
    assert r.applications > 0


def test_linear_solve_float32_x0_and_errors():
    a, b = _system(3, 8, 4, np.float32)
    r = es.linear_solve(lambda x: x @ a.T, b, "gmres", x0=np.ones_like(b), rel_tol=1e-5)
    assert r.converged and r.x.dtype == np.float32
    with pytest.raises(es.ConfigError, match="cgnr needs products with Aᵀ"):
        es.linear_solve(lambda x: x @ a.T, b, "cgnr")
    with pytest.raises(es.ShapeError, match="x0"):
        es.linear_solve(lambda x: x @ a.T, b, x0=np.zeros((2, 8), np.float32))
    with pytest.raises(es.InvalidArgumentError, match="dtype"):
        es.linear_solve(lambda x: x @ a.T, b, x0=np.zeros((3, 8)))
    with pytest.raises(es.SolverError):
        es.linear_solve(lambda x: x @ a.T, b, "gmres", restart=0)
    with pytest.raises(es.JsonError):
        es.linear_solve(lambda x: x @ a.T, b, "gmres", bogus=1)


# ------------------------------------------------------------------ stopping means what it says


def _h_equation(n, c):
    """The Chandrasekhar H-equation's fixed-point map (midpoint rule, n nodes), on rows."""
    mu = (np.arange(n) + 0.5) / n
    a = (c / (2 * n)) * mu[:, None] / (mu[:, None] + mu[None, :])
    return lambda h: 1.0 / (1.0 - h @ a.T)


def test_abs_tol_alone_is_the_criterion_on_a_400_unknown_integral_equation():
    # The report: abs_tol=1e-10 stopped at 8.6e-6 through the default rel_tol.
    n, c = 400, 0.9
    f = _h_equation(n, c)
    for solver in es.SOLVERS:
        r = es.solve(f, np.ones((1, n)), solver, abs_tol=1e-10, max_iter=500)
        assert r.converged, (solver, r.message)
        true = np.linalg.norm(f(r.x) - r.x)
        assert true <= 1e-10, (solver, true)
        # The midpoint-rule equation's mean is exactly (2/c)(1 − √(1 − c)).
        assert abs(r.x.mean() - 2 / c * (1 - math.sqrt(1 - c))) < 1e-9
    # Naming neither tolerance keeps the default rel_tol = 1e-6, which stops far earlier.
    loose = es.solve(f, np.ones((1, n)), "picard", max_iter=500)
    assert loose.converged and loose.rel_residual[0] <= 1e-6 and loose.residual[0] > 1e-8


def test_max_norm_and_combine():
    f = _h_equation(50, 0.5)
    r = es.solve(f, np.ones((2, 50)), "anderson", abs_tol=1e-9, norm="max")
    assert r.converged
    d = f(r.z) - r.z
    np.testing.assert_allclose(r.residual, np.abs(d).max(axis=1), rtol=1e-12)
    assert (np.linalg.norm(d, axis=1) > r.residual).all()
    # z ↦ z/2 + 1 from 0: abs_tol 1e-3 holds before rel_tol 1e-6; "all" waits for both.
    g = lambda z: 0.5 * z + 1.0
    anyr = es.solve(g, np.zeros((1, 1)), "picard", abs_tol=1e-3, rel_tol=1e-6)
    allr = es.solve(g, np.zeros((1, 1)), "picard", abs_tol=1e-3, rel_tol=1e-6, combine="all")
    assert anyr.rel_residual[0] > 1e-6 and allr.rel_residual[0] <= 1e-6 and allr.residual[0] <= 1e-3
    assert allr.nfev[0] > anyr.nfev[0]


def test_overflow_is_not_convergence():
    # Picard on z ↦ 2z + 1 with divergence detection off: the sum of squares overflows near
    # 1e154 (the relative residual read 0, "converged", before); the row ends non-finite only
    # when f(z) itself overflows.
    with np.errstate(over="ignore"):
        r = es.solve(lambda z: 2 * z + 1, np.zeros((1, 3)), "picard", rel_tol=1e-3,
                     divergence_factor=float("inf"), max_iter=5000)
    assert r.status[0] == "non_finite", r.message
    assert 1020 <= r.nfev[0] <= 1030
    # A finite row near 1e155 is measured exactly (it read non_finite before).
    z0 = np.full((1, 4), 1e155)
    big = es.solve(lambda z: 2 * z, z0, "picard", rel_tol=1e-3, rel_eps=0.0, max_iter=1)
    assert big.status[0] == "max_iter"
    np.testing.assert_allclose(big.residual, [2e155], rtol=1e-14)
    np.testing.assert_allclose(big.rel_residual, [0.5], rtol=1e-14)


# ------------------------------------------------------------------ a result people know


def test_result_fields_and_status_array():
    def f(z):
        out = np.cos(z)
        out[1] = np.nan
        return out

    r = es.solve(f, np.zeros((3, 1)), max_iter=50)
    assert isinstance(r.status, np.ndarray)
    np.testing.assert_array_equal(r.status == "converged", [True, False, True])
    np.testing.assert_array_equal(r.success, [True, False, True])
    assert r.x is r.z
    np.testing.assert_array_equal(r.nfev, r.iterations)
    assert r.map_evals == r.nfev.max()
    assert set(r.status) <= set(es.STATUSES)
    assert "2 of 3 rows converged" in r.message and "1 non_finite" in r.message, r.message
    assert not r.converged
    ok = es.solve(np.cos, np.zeros((2, 1)))
    assert ok.message.startswith("all 2 rows converged"), ok.message
    lin = es.linear_solve(lambda v: 2 * v, np.ones((2, 3)), rel_tol=1e-10)
    assert lin.success.all() and lin.nfev.shape == (2,)


def test_raise_on_failure_carries_the_partial_result():
    with pytest.raises(es.NoConvergence, match="1 of 2 rows converged") as info:
        es.solve(lambda z: z * np.array([[0.5], [2.0]]) + 1, np.zeros((2, 1)), "picard",
                 max_iter=30, raise_on_failure=True)
    result = info.value.result
    assert result.status.tolist() == ["converged", "diverged"]
    assert isinstance(info.value, es.SolverError) and isinstance(info.value, RuntimeError)
    a, b = _system(2, 12, 3)
    with pytest.raises(es.NoConvergence, match="linear_solve: 0 of 2 rows converged"):
        es.linear_solve(lambda x: x @ a.T, b, "gmres", max_iter=2, rel_tol=1e-12,
                        raise_on_failure=True)
    assert es.solve(np.cos, np.zeros((1, 1)), raise_on_failure=True).converged


@pytest.mark.parametrize(
    "kwargs, argument, match",
    [
        (dict(max_iter=-1), "max_iter", ">= 1"),
        (dict(max_iter=2.5), "max_iter", "integer"),
        (dict(max_iter=True), "max_iter", "integer"),
        (dict(abs_tol="1e-3"), "abs_tol", "real number"),
        (dict(abs_tol=float("inf")), "abs_tol", "finite"),
        (dict(divergence_factor=1.0), "divergence_factor", "> 1"),
        (dict(norm="l1"), "norm", "'l2', 'max'"),
        (dict(combine="both"), "combine", "'any', 'all'"),
        (dict(spectral_radius_iters=-2), "spectral_radius_iters", ">= 0"),
        (dict(history=-3), "history", "invalid value -3"),
        (dict(solver="broyden", history=3), "history", "parameter of anderson, not of broyden"),
        (dict(memory=3), "memory", "`memory` is a parameter of broyden, not of anderson"),
        (dict(safeguard_factor=0.0), "safeguard_factor", "> 0"),
    ],
)
def test_argument_errors_name_the_argument(kwargs, argument, match):
    with pytest.raises(es.ConfigError, match=match) as info:
        es.solve(np.cos, np.zeros((2, 1)), **kwargs)
    assert info.value.argument == argument
    assert "--" not in str(info.value), "a command-line flag in a Python message"


@pytest.mark.parametrize(
    "returned, match",
    [
        (lambda z: None, "fun returned None"),
        (lambda z: z + 0j, "dtype complex128"),
        (lambda z: np.array([[object()]] * len(z)), "dtype object"),
    ],
)
def test_what_fun_returns_is_checked_not_cast(returned, match):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning on the way
        with pytest.raises(es.InvalidArgumentError, match=match):
            es.solve(returned, np.zeros((2, 1)))


# ------------------------------------------------------------------ safeguard, branches


def test_the_safeguard_reaches_the_crate_and_the_spectral_radius_tells_the_branch():
    # z − atan z from 30: the secant step overshoots; the safeguard refuses such points.
    f = lambda z: z - np.arctan(z)
    safe = es.solve(f, np.full((1, 1), 30.0), "anderson", abs_tol=1e-12, safeguard=True)
    plain = es.solve(f, np.full((1, 1), 30.0), "anderson", abs_tol=1e-12)
    assert safe.converged and safe.rejections[0] >= 1 and plain.rejections[0] == 0
    # Near the H-equation's fold default Anderson reaches the other solution; ρ > 1 says so.
    n, c = 100, 0.9999
    h = _h_equation(n, c)
    physical, other = 2 / c * (1 - math.sqrt(1 - c)), 2 / c * (1 + math.sqrt(1 - c))
    for solver, params, want in [("anderson", {}, other), ("anderson", {"history": 1}, physical),
                                 ("broyden", {}, physical)]:
        r = es.solve(h, np.ones((1, n)), solver, abs_tol=1e-11, max_iter=5000,
                     spectral_radius_iters=400, **params)
        assert abs(r.x.mean() - want) < 1e-7, (solver, params, r.x.mean())
        assert (r.spectral_radius[0] > 1) == (want == other), r.spectral_radius
    assert np.isnan(es.solve(np.cos, np.zeros((1, 1))).spectral_radius).all()
