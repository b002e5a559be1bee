"""The benchmark problems (elm_solver::benchmark) against SciPy's own definitions
(scipy/optimize/tests/test_nonlin.py and test_minpack.py's pressure_network, restated here in
NumPy), and their fixed-point form g = x + αF with SciPy's default α; the literature problems
(the Chandrasekhar H-equation as in Kelley's SIAMFANLEquations.jl `HeqFix!`, the 1-D Bratu problem)
against NumPy statements and known solutions."""

import numpy as np
import pytest

import elm_solver as es


def F(x):
    d = np.diag([3, 2, 1.5, 1, 0.5])
    return -d @ x - 0.01 * float(x @ x) * x


def F2(x):
    return x


def F3(x):
    a = np.array([[-2, 1, 0.0], [1, -2, 1], [0, 1, -2]])
    return a @ x - np.array([1, 2, 3.0])


def F4_powell(x):
    a = 1e4
    return np.array([a * x[0] * x[1] - 1, np.exp(-x[0]) + np.exp(-x[1]) - (1 + 1 / a)])


def F5(x):
    p = np.array([0.5, 0.5, 0.5, 0.5]) * x**2
    return np.hstack((p[1:] - p[0], x.sum() - 4))


def F6(x):
    x1, x2 = x
    j0 = np.array([[-4.256, 14.7], [0.8394989, 0.59964207]])
    v = np.array([(x1 + 3) * (x2**5 - 7) + 3 * 6, np.sin(x2 * np.exp(x1) - 1)])
    return -np.linalg.solve(j0, v)


SCIPY = {
    "scipy-F": (F, [1, 1, 1, 1, 1]),
    "scipy-F2": (F2, [1, 2, 3, 4, 5, 6]),
    "scipy-F2-lucky": (F2, [0, 0, 0, 0, 0, 0]),
    "scipy-F3": (F3, [1, 2, 3]),
    "scipy-F4-powell": (F4_powell, [-1, -2]),
    "scipy-F5": (F5, [2.0, 0, 2, 0]),
    "scipy-F6": (F6, [-0.5, 1.4]),
}


@pytest.mark.parametrize("name", list(SCIPY))
def test_root_functions_equal_scipys(name):
    f, xin = SCIPY[name]
    p = es.BenchmarkProblem(name)
    xin = np.array(xin, dtype=np.float64)
    np.testing.assert_array_equal(p.x0[0], xin)
    f0 = f(xin)
    want_alpha = 0.5 * max(np.linalg.norm(xin), 1) / np.linalg.norm(f0) if np.linalg.norm(f0) else 1.0
    assert p.alpha == pytest.approx(want_alpha, rel=1e-14)
    rng = np.random.default_rng(11)
    for _ in range(5):
        x = xin + 0.3 * rng.standard_normal(xin.shape)
        np.testing.assert_allclose(p.root(x[None, :])[0], f(x), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(p(x[None, :])[0], x + p.alpha * f(x), rtol=1e-12, atol=1e-12)


def test_every_problem_is_listed_and_the_deq_ones_are_batched_contractions():
    assert set(SCIPY) < set(es.BENCHMARKS)
    deq = [n for n in es.BENCHMARKS if n.startswith("deq-")]
    assert len(deq) == 3
    for n in deq:
        p = es.BenchmarkProblem(n)
        assert p.x0.shape == (64, 64) and p.alpha == 1.0
        z = np.random.default_rng(1).standard_normal((64, 64))
        np.testing.assert_allclose(p(z), z + p.root(z), atol=1e-14)
        r = es.solve(p, p.x0, "anderson", abs_tol=1e-9, rel_tol=0.0, max_iter=1000)
        assert np.all(np.asarray(r.status) == "converged")
    with pytest.raises(es.ConfigError, match="unknown benchmark problem"):
        es.BenchmarkProblem("rosenbrock")
    with pytest.raises(es.ShapeError):
        es.BenchmarkProblem("scipy-F").root(np.zeros((1, 3)))


H_EQUATION = {"h-equation-0.5": 0.5, "h-equation-0.99": 0.99, "h-equation-0.9999": 0.9999}
BRATU = {"bratu-1": 1.0, "bratu-3.5": 3.5}


def h_map(c, h):
    """Kelley's H-equation fixed-point map on the midpoint rule: with μᵢ = (i − ½)/N,
    G(H)ᵢ = 1 / (1 − (c/2N) Σⱼ μᵢ Hⱼ / (μᵢ + μⱼ))."""
    n = h.size
    mu = (np.arange(1, n + 1) - 0.5) / n
    return 1.0 / (1.0 - (c / (2 * n)) * (mu[:, None] / (mu[:, None] + mu[None, :])) @ h)


@pytest.mark.parametrize("name", list(H_EQUATION))
def test_h_equation_is_kelleys_map_and_meets_the_moment_identity(name):
    c = H_EQUATION[name]
    p = es.BenchmarkProblem(name)
    assert p.x0.shape == (1, 500) and np.all(p.x0 == 1.0) and p.alpha == 1.0
    x = 1.0 + 0.5 * np.abs(np.sin(0.37 * np.arange(500)))
    np.testing.assert_allclose(p.root(x[None, :])[0], h_map(c, x) - x, rtol=1e-13, atol=1e-13)
    # Picard from H = 1 rises to the physical solution, whose midpoint moments satisfy
    # (c/2N) Σ Hᵢ = 1 − √(1 − c) exactly (sum Hᵢ × the equation, symmetrise the kernel).
    r = es.solve(p, p.x0, "picard", abs_tol=1e-11, rel_tol=0.0, max_iter=5000)
    assert np.all(np.asarray(r.status) == "converged")
    h = r.z[0]
    np.testing.assert_allclose(h_map(c, h), h, atol=1e-10)
    assert c / (2 * h.size) * h.sum() == pytest.approx(1 - np.sqrt(1 - c), abs=1e-9)


def bratu_exact(lam, x):
    """u(x) = −2 ln(cosh((x − ½)θ/2) / cosh(θ/4)) with the smaller root of θ = √(2λ) cosh(θ/4)."""
    s = np.sqrt(2 * lam)
    lo, hi = 0.0, 4 * np.arcsinh(4 / s)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mid - s * np.cosh(mid / 4) < 0 else (lo, mid)
    th = 0.5 * (lo + hi)
    return -2 * np.log(np.cosh((x - 0.5) * th / 2) / np.cosh(th / 4))


@pytest.mark.parametrize("name", list(BRATU))
def test_bratu_is_the_finite_difference_map_and_meets_the_analytic_solution(name):
    lam = BRATU[name]
    p = es.BenchmarkProblem(name)
    n = p.x0.shape[1]
    assert p.x0.shape == (1, 100) and np.all(p.x0 == 0.0) and p.alpha == 1.0
    h = 1.0 / (n + 1)
    t = 2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)
    g = lambda u: np.linalg.solve(t, lam * h * h * np.exp(u))
    u = 0.3 * np.sin(np.pi * h * np.arange(1, n + 1))
    np.testing.assert_allclose(p.root(u[None, :])[0], g(u) - u, rtol=1e-12, atol=1e-13)
    r = es.solve(p, p.x0, "anderson", abs_tol=1e-11, rel_tol=0.0, max_iter=5000)
    assert np.all(np.asarray(r.status) == "converged")
    err = np.abs(r.z[0] - bratu_exact(lam, h * np.arange(1, n + 1))).max()
    # Second order: max|u_h − u|/h² is 0.0142 (λ = 1) and 6.2 (λ = 3.5) at N = 100 and 200.
    assert err < {1.0: 0.02, 3.5: 8.7}[lam] * h * h
