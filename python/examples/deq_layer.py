"""A DEQ layer on NumPy arrays with elm_solver (run by scripts/python-test.sh; `--check` asserts).

1. Forward: z* = tanh(W z* + U x + c) per row, solved by our Anderson.
2. Backward (implicit function theorem): for a loss L(z*), the adjoint g solves
   (I − Jᵀ) g = ∂L/∂z*, with J = ∂f/∂z = diag(1 − z*²) W, by `linear_solve` (GMRES); then
   ∂L/∂W = (g ⊙ s)ᵀ z*, ∂L/∂U = (g ⊙ s)ᵀ x, ∂L/∂c = Σ_rows g ⊙ s, with s = 1 − z*².
   The gradients are checked against central finite differences of the whole solve.
3. "Which solver when": the map evaluations of every solver as the spectral radius ρ grows
   (0.5, 0.9, 0.99) on the crate's canonical linear problem (the one of results/rho_sweep), the
   README's reading reproduced from Python; and what ρ a tanh layer with ‖W‖₂ = 0.99 really has.

Usage: python deq_layer.py [--check]
"""

import argparse
import sys

import numpy as np

import elm_solver as es


def layer(rng, dim, nx, rho):
    w = rng.standard_normal((dim, dim))
    w *= rho / np.linalg.norm(w, 2)
    u = rng.standard_normal((dim, nx)) / np.sqrt(nx)
    c = 0.1 * rng.standard_normal(dim)
    return w, u, c


def forward(w, u, c, x, tol=1e-12):
    inj = x @ u.T + c
    r = es.solve(lambda z: np.tanh(z @ w.T + inj), np.zeros((x.shape[0], w.shape[0])), "anderson",
                 abs_tol=tol, rel_tol=0.0, max_iter=500)
    if not r.converged:
        raise RuntimeError(f"forward solve: {set(r.status)}")
    return r.z


def loss(z, target):
    return 0.5 * np.sum((z - target) ** 2)


def implicit_grads(w, u, c, x, target):
    z = forward(w, u, c, x)
    s = 1.0 - z**2
    dl_dz = z - target
    # Row form of (I − Jᵀ) g: g − (g ⊙ s) W, each row with its own s.
    r = es.linear_solve(lambda g: g - (g * s) @ w, dl_dz, "gmres", restart=30, abs_tol=1e-13, rel_tol=0.0)
    if not r.converged:
        raise RuntimeError(f"adjoint solve: {set(r.status)}")
    gs = r.x * s
    return {"w": gs.T @ z, "u": gs.T @ x, "c": gs.sum(axis=0)}, z, r


def finite_difference(w, u, c, x, target, name, index, h=1e-6):
    params = {"w": w, "u": u, "c": c}

    def at(delta):
        p = {k: v.copy() for k, v in params.items()}
        p[name][index] += delta
        return loss(forward(p["w"], p["u"], p["c"], x), target)

    return (at(h) - at(-h)) / (2 * h)


def gradient_check(check):
    rng = np.random.default_rng(0)
    w, u, c = layer(rng, dim=24, nx=8, rho=0.9)
    x = rng.standard_normal((16, 8))
    target = 0.5 * rng.standard_normal((16, 24))
    grads, z, adjoint = implicit_grads(w, u, c, x, target)
    worst = 0.0
    picks = [("w", (3, 5)), ("w", (17, 0)), ("w", (23, 23)), ("u", (2, 7)), ("u", (11, 1)), ("c", (4,)), ("c", (20,))]
    print("implicit gradient vs central differences (f64, forward tol 1e-12, adjoint GMRES tol 1e-13):")
    for name, idx in picks:
        fd = finite_difference(w, u, c, x, target, name, idx)
        ours = grads[name][idx]
        rel = abs(ours - fd) / max(abs(fd), 1e-8)
        worst = max(worst, rel)
        print(f"  dL/d{name}{list(idx)}: implicit {ours:+.8e}  finite diff {fd:+.8e}  rel. error {rel:.1e}")
    print(f"  adjoint solve: {adjoint.applications} batched matvecs, max {adjoint.iterations.max()} per row")
    if check:
        assert worst < 1e-5, f"implicit gradient off by {worst:.2e} (relative)"


def rho_sweep(check):
    # The canonical linear problem of `elm sweep` (A symmetric, eigenvalues evenly over [−ρ, ρ]):
    # the crate's own map, called from Python.
    print("\nmean map evaluations per row to a relative residual of 1e-4 on z = A z + b (as results/rho_sweep):")
    print("  rho    " + "  ".join(f"{s:>9}" for s in es.SOLVERS) + "   Anderson saving")
    saving = {}
    for rho in (0.5, 0.9, 0.99):
        p = es.CanonicalProblem("linear", rho=rho, seed=0)
        mean = {}
        for solver in es.SOLVERS:
            r = es.solve(p, p.z0, solver, rel_tol=1e-4, max_iter=5000)
            assert r.converged or not check, (rho, solver, set(r.status))
            mean[solver] = float(r.iterations.mean())
        saving[rho] = 1 - mean["anderson"] / mean["picard"]
        print(f"  {rho:<5}  " + "  ".join(f"{v:>9.1f}" for v in mean.values()) + f"   {saving[rho]:+.0%}")
    # A tanh layer with ‖W‖₂ = 0.99 is a much gentler problem than its norm says: the spectral
    # radius of J = diag(1 − z*²) W at the fixed point is what Picard's rate follows.
    rng = np.random.default_rng(1)
    w, u, c = layer(rng, dim=64, nx=16, rho=0.99)
    x = rng.standard_normal((64, 16))
    z = forward(w, u, c, x)
    rho_j = max(np.abs(np.linalg.eigvals((1 - z[b] ** 2)[:, None] * w)).max() for b in range(4))
    print(f"  a tanh layer with ||W||_2 = 0.99: rho(J) at its fixed point {rho_j:.2f} (measure yours before choosing)")
    if check:
        # The README's reading: acceleration pays more as ρ grows, more than half the
        # evaluations from ρ = 0.9 on.
        assert saving[0.5] < saving[0.9] < saving[0.99] and saving[0.9] > 0.5, saving
        assert rho_j < 0.9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="assert the gradient check and the sweep's reading")
    args = ap.parse_args()
    gradient_check(args.check)
    rho_sweep(args.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
