"""The solver benchmark (issue 41): every fixed-point solver of ours, SciPy's `anderson`,
`broyden1`, `linearmixing` and `newton_krylov`, and cvxgrp's `aa` (Type-I and Type-II Anderson) on
every problem of `elm_solver.BENCHMARKS`, in one run: map evaluations to tolerance, failures and wall time. Writes OUT/benchmark.json,
OUT/benchmark.md and OUT/benchmark.svg, and the README block `solver-benchmark`.

Run by scripts/solver-benchmark.sh (which builds the package into a venv with SciPy and
matplotlib). The tolerance is SciPy's own criterion, max|F(x)| ≤ TOL, checked on every answer
by evaluating F; our rows stop on ‖g(x) − x‖₂ = α‖F(x)‖₂ ≤ α·TOL, which implies it.
"""

import argparse
import json
import os
import platform
import sys
import time
import warnings

import numpy as np
import scipy
from scipy import optimize

import elm_solver as es

TOL = 1e-6
MAX_EVALS = 5000
SCIPY = {
    "scipy anderson": optimize.anderson,
    "scipy broyden1": optimize.broyden1,
    "scipy linearmixing": optimize.linearmixing,
    "scipy newton_krylov": optimize.newton_krylov,
}


def ours(problem, solver):
    t = time.perf_counter()
    r = es.solve(problem, problem.x0, solver, abs_tol=problem.alpha * TOL, rel_tol=0.0, max_iter=MAX_EVALS)
    wall = time.perf_counter() - t
    err = float(np.abs(problem.root(r.z)).max())
    ok = r.converged and err <= TOL
    return {"evals": int(r.map_evals), "ok": bool(ok), "max_abs_F": err, "seconds": wall,
            "why": None if ok else ",".join(sorted(set(r.status)))}


def theirs(problem, fn):
    shape = problem.x0.shape
    calls = [0]

    def F(x):
        calls[0] += 1
        return problem.root(np.asarray(x, dtype=np.float64).reshape(shape)).ravel()

    t = time.perf_counter()
    why = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = fn(F, problem.x0.ravel(), f_tol=TOL, maxiter=MAX_EVALS)
    except optimize.NoConvergence as e:
        x, why = np.asarray(e.args[0]), "no convergence"
    except (ValueError, FloatingPointError, OverflowError, np.linalg.LinAlgError) as e:
        x, why = None, type(e).__name__
    wall = time.perf_counter() - t
    evals = calls[0]
    if x is None:
        return {"evals": evals, "ok": False, "max_abs_F": None, "seconds": wall, "why": why}
    err = float(np.abs(problem.root(np.asarray(x).reshape(shape))).max())
    ok = why is None and np.isfinite(err) and err <= TOL
    if why is None and not ok:
        why = "answer above tolerance"
    return {"evals": evals, "ok": bool(ok), "max_abs_F": err if np.isfinite(err) else None,
            "seconds": wall, "why": why}


def cvxgrp_aa(problem, type1):
    """cvxgrp's `aa` (PyPI anderson-acceleration; Type-I or Type-II Anderson with its safeguard),
    memory 5 like ours, in its documented loop; one map evaluation per iteration."""
    import aa

    shape, alpha = problem.x0.shape, problem.alpha
    g = lambda v: problem(v.reshape(shape)).ravel()
    acc = aa.AndersonAccelerator(problem.x0.size, 5, type1=type1, regularization=1e-12)
    x = problem.x0.ravel().copy()
    x_prev = x.copy()
    t = time.perf_counter()
    answer, evals, why = None, 0, "max evaluations"
    for i in range(MAX_EVALS):
        if i > 0:
            acc.apply(x, x_prev)
        x_prev = x.copy()
        x = g(x_prev)
        evals += 1
        acc.safeguard(x, x_prev)
        step = np.abs(x - x_prev)
        if not np.all(np.isfinite(step)):
            why = "non-finite"
            break
        # x = g(x_prev) after the safeguard too: the residual max|F(x_prev)| = max|x − x_prev| / α.
        if step.max() / alpha <= TOL:
            answer, why = x_prev, None
            break
    wall = time.perf_counter() - t
    if answer is None:
        return {"evals": evals, "ok": False, "max_abs_F": None, "seconds": wall, "why": why}
    err = float(np.abs(problem.root(answer.reshape(shape))).max())
    ok = err <= TOL
    return {"evals": evals, "ok": bool(ok), "max_abs_F": err, "seconds": wall,
            "why": None if ok else "answer above tolerance"}


OTHERS = {"aa type-II": lambda p: cvxgrp_aa(p, False), "aa type-I": lambda p: cvxgrp_aa(p, True)}


def run():
    table = {}
    for name in es.BENCHMARKS:
        p = es.BenchmarkProblem(name)
        row = {"description": p.description, "alpha": p.alpha, "shape": list(p.x0.shape)}
        for s in es.SOLVERS:
            row[s] = ours(p, s)
        for s, fn in SCIPY.items():
            row[s] = theirs(p, fn)
        for s, fn in OTHERS.items():
            row[s] = fn(p)
        table[name] = row
        print(f"{name}: " + ", ".join(f"{k} {v['evals']}{'' if v['ok'] else ' (failed)'}"
                                      for k, v in row.items() if isinstance(v, dict)), flush=True)
    return table


def methods():
    return list(es.SOLVERS) + list(SCIPY) + list(OTHERS)


def summary(table):
    """Per method: failures, and on the problems where any SciPy solver converges, our failures;
    the median over problems of (our best evaluations) / (SciPy's best evaluations)."""
    ours_best, scipy_best, ratio = {}, {}, []
    lost_where_scipy_ok = []
    for name, row in table.items():
        ok_ours = [row[s]["evals"] for s in es.SOLVERS if row[s]["ok"]]
        ok_scipy = [row[s]["evals"] for s in SCIPY if row[s]["ok"]]
        if any(row[s]["ok"] for s in OTHERS) and not ok_ours:
            lost_where_scipy_ok.append(name)
        ours_best[name] = min(ok_ours) if ok_ours else None
        scipy_best[name] = min(ok_scipy) if ok_scipy else None
        if ok_scipy and not ok_ours:
            lost_where_scipy_ok.append(name)
        if ok_ours and ok_scipy:
            ratio.append(min(ok_ours) / min(ok_scipy))
    return {
        "ours_best": ours_best,
        "scipy_best": scipy_best,
        "median_ratio_ours_over_scipy": float(np.median(ratio)) if ratio else None,
        "problems_ours_fail_where_scipy_converges": lost_where_scipy_ok,
        "failures": {m: [n for n, row in table.items() if not row[m]["ok"]] for m in methods()},
    }


def markdown(table, summ, command):
    lines = [
        f"Generated by `{command}` (elm_solver {'/'.join(es.SOLVERS)} against SciPy {scipy.__version__} "
        f"`scipy.optimize` with its defaults, and cvxgrp's `aa` {_aa_version()} (PyPI anderson-acceleration: Type-II "
        f"and Type-I Anderson with its safeguard, memory 5); {platform.processor() or platform.machine()}; one run). "
        f"Map evaluations (batched calls of the map or of F) until max|F(x)| ≤ {TOL:g}, at most {MAX_EVALS}; "
        "✗ = failed (the reason in `benchmark.json`); the fewest in each row in bold. SciPy solves a batched (DEQ) problem as one system of B·D unknowns, ours row by row.",
        "",
        "| problem | " + " | ".join(methods()) + " |",
        "|---|" + "---:|" * len(methods()),
    ]
    for name, row in table.items():
        best = min((row[m]["evals"] for m in methods() if row[m]["ok"]), default=None)
        cells = []
        for m in methods():
            v = row[m]
            c = f"{v['evals']}" if v["ok"] else f"✗ ({v['evals']})"
            cells.append(f"**{c}**" if v["ok"] and v["evals"] == best else c)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    med = summ["median_ratio_ours_over_scipy"]
    lost = summ["problems_ours_fail_where_scipy_converges"]
    lines += [
        "",
        f"- Failures of ours where a SciPy or `aa` solver converges: **{', '.join(lost) if lost else 'none'}**.",
        f"- Median over the problems both sides solve of (our best evaluations) / (SciPy's best): "
        f"**{med:.2f}**" + (" (fewer evaluations than SciPy's best on the median problem)." if med is not None and med < 1
                            else " (not fewer than SciPy's best on the median problem)."),
        "- Wall time per solve (seconds) is in `benchmark.json`; these problems are tiny, so it measures "
        "call overhead rather than solver work.",
    ]
    return lines


def _aa_version():
    from importlib.metadata import version

    return version("anderson-acceleration")


def plot(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    fig, ax = plt.subplots(figsize=(10, 4.8))
    markers = ["o", "s", "^", "D", "v", "P", "X"]
    for k, m in enumerate(methods()):
        xs, ys, fx, fy = [], [], [], []
        for i, n in enumerate(names):
            v = table[n][m]
            x = i + (k - len(methods()) / 2) * 0.08
            (xs if v["ok"] else fx).append(x)
            (ys if v["ok"] else fy).append(max(v["evals"], 1))
        line = ax.scatter(xs, ys, marker=markers[k % len(markers)], label=m, s=28)
        ax.scatter(fx, fy, marker="x", color=line.get_facecolor()[0], s=40)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"map evaluations to max|F| ≤ {TOL:g}")
    ax.set_title("Fixed-point solvers: elm_solver vs scipy.optimize (× = failed, at its evaluation count)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path + ".tmp.svg", format="svg")
    os.replace(path + ".tmp.svg", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/solver_benchmark")
    ap.add_argument("--readme", default="")
    ap.add_argument("--command", default="bash scripts/solver-benchmark.sh")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    table = run()
    summ = summary(table)
    report = {"tol": TOL, "max_evals": MAX_EVALS, "scipy": scipy.__version__, "numpy": np.__version__,
              "anderson-acceleration": _aa_version(),
              "problems": table, "summary": summ}
    with open(os.path.join(args.out, "benchmark.json.tmp"), "w") as f:
        json.dump(report, f, indent=1)
    os.replace(os.path.join(args.out, "benchmark.json.tmp"), os.path.join(args.out, "benchmark.json"))
    lines = markdown(table, summ, args.command)
    with open(os.path.join(args.out, "benchmark.md.tmp"), "w") as f:
        f.write("# Solver benchmark\n\n" + "\n".join(lines) + "\n\n![benchmark](benchmark.svg)\n")
    os.replace(os.path.join(args.out, "benchmark.md.tmp"), os.path.join(args.out, "benchmark.md"))
    plot(table, os.path.join(args.out, "benchmark.svg"))
    if args.readme:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from readme_block import rewrite

        rewrite(args.readme, "solver-benchmark", lines + ["", f"![solver benchmark]({args.out}/benchmark.svg)"])
    print(json.dumps(summ, indent=1))


if __name__ == "__main__":
    main()
