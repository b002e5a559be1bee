"""elm_solver.torch: the DEQ layer's fixed point and gradients (run by scripts/test.sh).

Skipped where PyTorch is not installed, unless ELM_REQUIRE_TORCH=1 makes its absence a failure.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

if os.environ.get("ELM_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import elm_solver as es  # noqa: E402  (after the skip)
import elm_solver.torch as et  # noqa: E402

torch.set_num_threads(1)

NX, D, B = 4, 6, 3
TIGHT = dict(
    abs_tol=1e-13,
    rel_tol=0.0,
    max_iter=300,
    backward_abs_tol=1e-14,
    backward_rel_tol=0.0,
    backward_max_iter=300,
)


def _params(dtype=torch.float64, seed=0, rho=0.9):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D, D, generator=g, dtype=dtype)
    w *= rho / torch.linalg.matrix_norm(w, 2)
    u = torch.randn(D, NX, generator=g, dtype=dtype) / NX**0.5
    b = 0.1 * torch.randn(D, generator=g, dtype=dtype)
    x = torch.randn(B, NX, generator=g, dtype=dtype)
    return w, u, b, x


def _layer(w, u, b):
    """f(z, x) = tanh(W z + U x + b) per row: a contraction in z for ‖W‖₂ < 1."""
    return lambda z, x: torch.tanh(z @ w.T + x @ u.T + b)


def _deq(w, u, b, **kwargs):
    return et.DEQFixedPoint(_layer(w, u, b), z_shape=(D,), **{**TIGHT, **kwargs})


def _unrolled(w, u, b, x, steps=400):
    """The fixed point by plain Picard steps, differentiated by autograd through all of them."""
    f = _layer(w, u, b)
    z = torch.zeros(x.shape[0], D, dtype=x.dtype)
    for _ in range(steps):
        z = f(z, x)
    return z


def _loss(z):
    target = torch.linspace(-0.5, 0.5, z.numel(), dtype=z.dtype).view_as(z)
    return ((z - target) ** 2).sum()


def _grads(make_z, w, u, b, x):
    inputs = [t.clone().requires_grad_() for t in (w, u, b, x)]
    return torch.autograd.grad(_loss(make_z(*inputs)), inputs)


def _rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


# ------------------------------------------------------------------ packaging


def test_importing_elm_solver_does_not_import_torch():
    code = "import sys, elm_solver; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ forward


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_forward_returns_the_fixed_point(dtype, tol):
    w, u, b, x = _params(dtype)
    deq = et.DEQFixedPoint(_layer(w, u, b), z_shape=(D,), abs_tol=tol, rel_tol=0.0, max_iter=200)
    z = deq(x)
    assert isinstance(z, torch.Tensor) and z.dtype == dtype and z.shape == (B, D)
    assert deq.forward_stats.converged, deq.forward_stats.summary()
    assert (deq.forward_stats.iterations > 1).all()
    # z is one step past the solver's point, so its residual is at most L × the tolerance.
    res = torch.linalg.vector_norm(_layer(w, u, b)(z, x) - z, dim=1)
    assert (res <= tol).all(), res
    # ... and it is the same point unrolled Picard reaches.
    assert _rel_err(z, _unrolled(w, u, b, x)) < 1e2 * tol


def test_per_row_shapes_and_starting_points():
    # z of any per-row shape is flattened for the solver and comes back in its shape; a
    # starting point at the fixed point converges at once.
    w, u, b, x = _params()
    f = lambda z, x: _layer(w, u, b)(z.reshape(B, D), x).reshape(z.shape)
    deq = et.DEQFixedPoint(f, z_shape=(2, 3), **TIGHT)
    z = deq(x)
    assert z.shape == (B, 2, 3)
    assert _rel_err(z.reshape(B, D), _unrolled(w, u, b, x)) < 1e-11
    again = deq(x, z0=z.detach())
    assert (deq.forward_stats.iterations <= 2).all()
    assert _rel_err(again, z) < 1e-12


def test_tensors_cross_to_numpy_without_copies():
    # Contiguous CPU tensors reach the solver as views of their memory; the output is a
    # tensor of the input's dtype.
    t = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    view = et._rows(t)
    assert view.shape == (2, 12) and np.shares_memory(view, t.numpy())
    seen = []

    def f(z, x):
        seen.append((z.dtype, z.requires_grad))
        return 0.5 * z + x

    x = torch.ones(2, 5, dtype=torch.float32)
    z = et.DEQFixedPoint(f, abs_tol=1e-6, rel_tol=0.0)(x)
    assert z.dtype == torch.float32 and torch.allclose(z, 2 * x)
    # Inside the solve f sees plain float32 tensors without a graph.
    assert seen[0] == (torch.float32, False)


# ------------------------------------------------------------------ implicit gradients


def test_implicit_gradient_matches_finite_differences():
    # torch's own check: the Jacobian of the whole layer w.r.t. W, U, b and x against central
    # differences of the forward solve (float64, both solves to ~1e-13).
    w, u, b, x = _params()
    inputs = [t.clone().requires_grad_() for t in (w, u, b, x)]

    def layer(w, u, b, x):
        return _deq(w, u, b)(x)

    assert torch.autograd.gradcheck(layer, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("backward_solver", ["gmres", "bicgstab", "anderson"])
def test_implicit_gradient_matches_unrolled_autograd(backward_solver):
    w, u, b, x = _params()
    deq = None

    def make(*p):
        nonlocal deq
        deq = _deq(*p[:3], backward_solver=backward_solver)
        return deq(p[3])

    ours = _grads(make, w, u, b, x)
    unrolled = _grads(lambda *p: _unrolled(*p), w, u, b, x)
    for name, a, want in zip("WUbx", ours, unrolled):
        assert _rel_err(a, want) < 1e-9, (name, _rel_err(a, want))
    assert deq.backward_stats.converged and deq.backward_stats.solver == backward_solver


def test_float32_gradients_agree_with_float64():
    w, u, b, x = _params()
    want = _grads(lambda *p: _deq(*p[:3])(p[3]), w, u, b, x)
    p32 = [t.float() for t in (w, u, b, x)]
    deq = None

    def make(*p):
        nonlocal deq
        deq = et.DEQFixedPoint(
            _layer(*p[:3]), z_shape=(D,), abs_tol=1e-6, rel_tol=0.0, backward_rel_tol=1e-6
        )
        return deq(p[3])

    got = _grads(make, *p32)
    for a, ref in zip(got, want):
        assert a.dtype == torch.float32
        assert _rel_err(a.double(), ref) < 1e-4
    assert deq.forward_stats.converged and deq.backward_stats.converged


def test_jfb_gradient_is_the_one_step_gradient():
    w, u, b, x = _params()
    deq = None

    def make(*p):
        nonlocal deq
        deq = _deq(*p[:3], backward="jfb")
        return deq(p[3])

    ours = _grads(make, w, u, b, x)
    z_star = _deq(w, u, b)(x).detach()
    one_step = _grads(lambda w, u, b, x: _layer(w, u, b)(z_star, x), w, u, b, x)
    for a, want in zip(ours, one_step):
        assert _rel_err(a, want) < 1e-12
    assert deq.backward_stats is None
    # Not the exact gradient: the implicit one differs at ρ = 0.9.
    exact = _grads(lambda *p: _deq(*p[:3])(p[3]), w, u, b, x)
    assert _rel_err(ours[0], exact[0]) > 1e-2


def test_a_module_f_trains_its_parameters_and_backward_can_repeat():
    torch.manual_seed(0)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(D, D, dtype=torch.float64)
            self.inj = torch.nn.Linear(NX, D, dtype=torch.float64)

        def forward(self, z, x):
            w = self.lin.weight * (0.8 / torch.linalg.matrix_norm(self.lin.weight))
            return torch.tanh(z @ w.T + self.lin.bias + self.inj(x))

    deq = et.DEQFixedPoint(Layer(), z_shape=(D,), **TIGHT)
    assert {n for n, _ in deq.named_parameters()} == {
        "f.lin.weight",
        "f.lin.bias",
        "f.inj.weight",
        "f.inj.bias",
    }
    x = _params()[3]
    loss = _loss(deq(x))
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in deq.parameters()]
    loss.backward()  # the hook solves again on the retained graph
    for p, g in zip(deq.parameters(), first):
        assert torch.allclose(p.grad, 2 * g, rtol=1e-10, atol=0)


def test_no_grad_forward_builds_no_graph():
    w, u, b, x = _params()
    w.requires_grad_()
    with torch.no_grad():
        z = _deq(w, u, b)(x)
    assert not z.requires_grad


# ------------------------------------------------------------------ convergence failures


def test_unconverged_solves_warn_raise_or_pass_as_asked():
    w, u, b, x = _params()
    w.requires_grad_()
    short = dict(abs_tol=1e-13, rel_tol=0.0, max_iter=3)
    with pytest.warns(et.ConvergenceWarning, match="forward solve did not converge.*max_iter"):
        z = et.DEQFixedPoint(_layer(w, u, b), z_shape=(D,), **short)(x)
    assert z.shape == (B, D)
    with pytest.raises(et.ConvergenceError, match="forward"):
        et.DEQFixedPoint(_layer(w, u, b), z_shape=(D,), on_failure="raise", **short)(x)
    quiet = et.DEQFixedPoint(_layer(w, u, b), z_shape=(D,), on_failure="ignore", **short)
    quiet(x)
    assert (np.asarray(quiet.forward_stats.status) == "max_iter").all()
    # The backward solve reports the same way.
    deq = _deq(w, u, b, backward_max_iter=2, on_failure="raise")
    loss = _loss(deq(x))
    with pytest.raises(et.ConvergenceError, match="backward"):
        loss.backward()


# ------------------------------------------------------------------ errors


def test_bad_tensors_are_refused_with_clear_errors():
    w, u, b, x = _params()
    deq = _deq(w, u, b)
    with pytest.raises(ValueError, match="CPU only"):
        deq(torch.empty(B, NX, dtype=torch.float64, device="meta"))
    with pytest.raises(TypeError, match="float32 or float64"):
        deq(torch.ones(B, NX, dtype=torch.int64))
    with pytest.raises(TypeError, match="float32 or float64"):
        deq(torch.ones(B, NX, dtype=torch.complex128))
    with pytest.raises(TypeError, match="torch.Tensor"):
        deq(np.ones((B, NX)))
    with pytest.raises(ValueError, match="z0 requires grad"):
        deq(x, z0=torch.zeros(B, D, dtype=torch.float64, requires_grad=True))
    with pytest.raises(ValueError, match="dtype and batch size"):
        deq(x, z0=torch.zeros(B, D, dtype=torch.float32))
    with pytest.raises(ValueError, match="dtype and batch size"):
        deq(x, z0=torch.zeros(B + 1, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="must return z's shape and dtype"):
        et.DEQFixedPoint(lambda z, x: z[:, :1], z_shape=(D,))(x)
    with pytest.raises(ValueError, match="must return z's shape and dtype"):
        et.DEQFixedPoint(lambda z, x: z.float(), z_shape=(D,))(x)


def test_bad_configurations_are_refused():
    f = _layer(*_params()[:3])
    with pytest.raises(ValueError, match="solver must be one of"):
        et.DEQFixedPoint(f, "newton")
    with pytest.raises(ValueError, match="backward must be"):
        et.DEQFixedPoint(f, backward="unrolled")
    with pytest.raises(ValueError, match="backward_solver must be one of"):
        et.DEQFixedPoint(f, backward_solver="cgnr")
    with pytest.raises(ValueError, match="on_failure"):
        et.DEQFixedPoint(f, on_failure="log")
    with pytest.raises(TypeError, match="callable"):
        et.DEQFixedPoint(3)
    # The solvers' own parameters are checked by the crate.
    with pytest.raises(es.ConfigError, match="history"):
        et.DEQFixedPoint(f, z_shape=(D,), solver_params={"history": 0})(_params()[3])


def test_higher_order_gradients_are_refused():
    w, u, b, x = _params()
    w.requires_grad_()
    loss = _loss(_deq(w, u, b)(x))
    with pytest.raises(NotImplementedError, match="create_graph"):
        torch.autograd.grad(loss, w, create_graph=True)


def test_a_layer_that_ignores_z_has_the_one_step_gradient():
    # J = 0: the implicit backward's solve is y = g, the gradient that of f(·, x) itself.
    scale = torch.ones(NX, dtype=torch.float64, requires_grad=True)
    x = _params()[3]
    deq = et.DEQFixedPoint(lambda z, x: x * scale, abs_tol=1e-12, rel_tol=0.0)
    deq(x).sum().backward()
    assert torch.allclose(scale.grad, x.sum(0))
    assert deq.backward_stats.converged
