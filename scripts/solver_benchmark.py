"""The solver benchmark (issues 41 and 58): every fixed-point solver of ours, SciPy's `anderson`,
`broyden1`, `linearmixing` and `newton_krylov`, and cvxgrp's `aa` (Type-I and Type-II Anderson) on
every problem of `elm_solver.BENCHMARKS`, in one run. Writes OUT/benchmark.json, OUT/benchmark.md
and OUT/benchmark.svg, and the README block `solver-benchmark`.

What is compared, per problem, by map evaluations (batched calls of the map or of F):

* ours: each solver once, with the crate's default parameters (nothing tuned per problem);
* SciPy: each of `anderson`, `broyden1`, `linearmixing` with its default `alpha` and over the
  grid ALPHA_GRID, the best kept (`newton_krylov`, which has no `alpha`, as it is); a batched (DEQ)
  problem is posed to SciPy both as one coupled system of B·D unknowns and row by row (B separate
  solves of D unknowns, counted as the batched-equivalent: the most F calls any row needed, which
  is what a lockstep batched run would call; the total over rows is kept too);
* wins / ties / losses of our best solver against SciPy's best, and the geometric mean of
  (our best evaluations) / (SciPy's best) over the problems both solve, with SciPy's defaults and
  with SciPy's best `alpha`;
* wall time per solve (best of REPS) of our best solver and SciPy's best configuration.

Run by scripts/solver-benchmark.sh (which builds the package into a venv with SciPy and
matplotlib). The tolerance is SciPy's own criterion, max|F(x)| ≤ TOL, checked on every answer
by evaluating F; our rows stop on ‖g(x) − x‖₂ = α‖F(x)‖₂ ≤ α·TOL, which implies it (and is
stricter on the wide problems). On the H-equation and Bratu problems an answer must also be the
physical solution (the H-equation's moment identity, Bratu's lower branch) to count.
"""

import argparse
import json
import math
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
TIME_CAP = 20.0
"""Seconds one SciPy solve may take before it is stopped and scored a failure (only SciPy's
broyden1 on a coupled B·D = 4096 system comes near it: its low-rank update grows every step)."""
REPS = 3
ALPHA_GRID = (0.001, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0)
"""SciPy's `alpha` values tried besides its default `0.5·max(‖x₀‖, 1)/‖F(x₀)‖` (its initial
Jacobian guess is −1/α)."""
SCIPY = {
    "scipy anderson": optimize.anderson,
    "scipy broyden1": optimize.broyden1,
    "scipy linearmixing": optimize.linearmixing,
    "scipy newton_krylov": optimize.newton_krylov,
}
TUNED = ("scipy anderson", "scipy broyden1", "scipy linearmixing")


class _Stop(Exception):
    """Raised inside F when a SciPy solve has used its evaluations or its time."""


def physical(name, x):
    """Whether an answer of a literature problem is the physical solution (None when the problem
    has no such check): the H-equation's midpoint solution obeys (c/2N) Σ Hᵢ = 1 − √(1 − c),
    the other root 1 + √(1 − c) (accept within half the gap); Bratu's lower branch is
    u(x) = −2 ln(cosh((x − ½)θ/2)/cosh(θ/4)) with the smaller θ = √(2λ) cosh(θ/4) (accept within
    0.01, 15× the discretisation error at λ = 3.5, where the upper branch is ≥ 0.3 away)."""
    x = np.asarray(x).ravel()
    if name.startswith("h-equation-"):
        c = float(name.rsplit("-", 1)[1])
        moment = c / (2 * x.size) * x.sum()
        return abs(moment - (1 - math.sqrt(1 - c))) <= math.sqrt(1 - c)
    if name.startswith("bratu-"):
        lam = float(name.rsplit("-", 1)[1])
        s = math.sqrt(2 * lam)
        lo, hi = 0.0, 4 * math.asinh(4 / s)
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if mid - s * math.cosh(mid / 4) < 0 else (lo, mid)
        th = 0.5 * (lo + hi)
        grid = np.arange(1, x.size + 1) / (x.size + 1)
        exact = -2 * np.log(np.cosh((grid - 0.5) * th / 2) / np.cosh(th / 4))
        return float(np.abs(x - exact).max()) <= 0.01
    return None


def score(problem, name, x, why):
    """The record of an answer `x` (None when the solver gave none): it counts when nothing went
    wrong, max|F(x)| ≤ TOL and, where checked, it is the physical solution."""
    if x is None:
        return {"ok": False, "max_abs_F": None, "why": why}
    x = np.asarray(x, dtype=np.float64).reshape(problem.x0.shape)
    err = float(np.abs(problem.root(x)).max())
    if not np.isfinite(err):
        return {"ok": False, "max_abs_F": None, "why": why or "non-finite"}
    if why is None and err > TOL:
        why = "answer above tolerance"
    if why is None and physical(name, x) is False:
        why = "converged to the non-physical root"
    return {"ok": why is None, "max_abs_F": err, "why": why}


def ours(problem, name, solver):
    t = time.perf_counter()
    r = es.solve(problem, problem.x0, solver, abs_tol=problem.alpha * TOL, rel_tol=0.0, max_iter=MAX_EVALS)
    wall = time.perf_counter() - t
    status = np.asarray(r.status)
    why = None if np.all(status == "converged") else ",".join(sorted(set(status.tolist())))
    return {"evals": int(r.map_evals), "seconds": wall, **score(problem, name, r.z, why)}


def _scipy_solve(F, x0, fn, alpha):
    """One SciPy solve of F from x0 (1-D): (answer or None, reason it failed or None)."""
    kw = {} if alpha is None else {"alpha": alpha}
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return fn(F, x0, f_tol=TOL, maxiter=MAX_EVALS, **kw), None
    except optimize.NoConvergence as e:
        return np.asarray(e.args[0]), "no convergence"
    except _Stop as e:
        return None, str(e)
    except (ValueError, FloatingPointError, OverflowError, ZeroDivisionError, np.linalg.LinAlgError) as e:
        return None, type(e).__name__


def _counted(f, calls, start):
    """`f` with its calls counted and cut off at MAX_EVALS calls or TIME_CAP seconds."""

    def F(x):
        calls[0] += 1
        if calls[0] > MAX_EVALS:
            raise _Stop("evaluation budget")
        if time.perf_counter() - start > TIME_CAP:
            raise _Stop(f"time limit ({TIME_CAP:g} s)")
        return f(x)

    return F


def theirs_coupled(problem, name, fn, alpha):
    """SciPy on the whole problem as one system of B·D unknowns."""
    shape = problem.x0.shape
    calls, start = [0], time.perf_counter()
    F = _counted(lambda x: problem.root(np.asarray(x, dtype=np.float64).reshape(shape)).ravel(), calls, start)
    x, why = _scipy_solve(F, problem.x0.ravel(), fn, alpha)
    wall = time.perf_counter() - start
    return {"evals": min(calls[0], MAX_EVALS), "seconds": wall, **score(problem, name, x, why)}


def theirs_rows(problem, name, fn, alpha):
    """SciPy on a batched problem row by row: B solves of D unknowns. F of one row is read off a
    batched evaluation with that row in place (rows are independent), so each call costs a whole
    batch; the seconds spent inside F are kept apart (`seconds_in_F`). Stops at the first row
    SciPy fails on; the answer of all rows is scored as a whole. `evals` is the batched-equivalent (the most calls any row made), `total_evals`
    the calls summed over rows."""
    x0 = problem.x0
    z = x0.copy()
    answer = x0.copy()
    per_row, in_f, why = [], [0.0], None
    t = time.perf_counter()
    for b in range(x0.shape[0]):
        calls, start = [0], time.perf_counter()

        def f_row(x, b=b):
            t0 = time.perf_counter()
            z[b] = x
            out = problem.root(z)[b].copy()
            in_f[0] += time.perf_counter() - t0
            return out

        x, why = _scipy_solve(_counted(f_row, calls, start), x0[b].copy(), fn, alpha)
        per_row.append(min(calls[0], MAX_EVALS))
        z[b] = x0[b]
        if x is None or why is not None:
            why = f"row {b}: {why}"
            x = None
            break
        answer[b] = x
    wall = time.perf_counter() - t
    rec = score(problem, name, None if why else answer, why)
    return {"evals": max(per_row), "total_evals": int(sum(per_row)), "rows_solved": len(per_row) - (why is not None),
            "seconds": wall, "seconds_in_F": in_f[0], **rec}


def cvxgrp_aa(problem, name, type1):
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
    return {"evals": evals, "seconds": wall, **score(problem, name, answer, why)}


OTHERS = {"aa type-II": lambda p, n: cvxgrp_aa(p, n, False), "aa type-I": lambda p, n: cvxgrp_aa(p, n, True)}


def _alpha_key(alpha):
    return "default" if alpha is None else f"{alpha:g}"


def scipy_sweep(problem, name, pose):
    """Every SciPy method with its default alpha and, for the three that have one, over ALPHA_GRID:
    {method: {"default": record, "grid": {alpha: record}, "best": alpha key or None}}."""
    run = theirs_coupled if pose == "coupled" else theirs_rows
    out = {}
    for m, fn in SCIPY.items():
        rec = {"default": run(problem, name, fn, None), "grid": {}}
        if m in TUNED:
            for a in ALPHA_GRID:
                rec["grid"][_alpha_key(a)] = run(problem, name, fn, a)
        tried = {"default": rec["default"], **rec["grid"]}
        ok = {k: v["evals"] for k, v in tried.items() if v["ok"]}
        # The fewest evaluations; on a tie the default, then the smaller alpha.
        rec["best"] = min(ok, key=lambda k: (ok[k], k != "default", float(k) if k != "default" else 0.0)) if ok else None
        out[m] = rec
    return out


def run():
    table = {}
    for name in es.BENCHMARKS:
        t0 = time.perf_counter()
        p = es.BenchmarkProblem(name)
        row = {"description": p.description, "alpha": p.alpha, "shape": list(p.x0.shape), "ours": {}, "others": {}}
        for s in es.SOLVERS:
            row["ours"][s] = ours(p, name, s)
        row["scipy"] = {"coupled": scipy_sweep(p, name, "coupled")}
        if p.x0.shape[0] > 1:
            row["scipy"]["rows"] = scipy_sweep(p, name, "rows")
        for s, fn in OTHERS.items():
            row["others"][s] = fn(p, name)
        table[name] = row
        best = pick(row)
        print(f"{name} ({time.perf_counter() - t0:.1f} s): ours {best['ours']}, SciPy default {best['scipy_default']}, "
              f"SciPy best {best['scipy_best']}", flush=True)
    return table


def pick(row):
    """Our best solver and SciPy's best configuration (with its defaults / over the alpha grid),
    each as a dict with evals and label, or None where none solves."""
    ok_ours = {s: r["evals"] for s, r in row["ours"].items() if r["ok"]}
    best_ours = None
    if ok_ours:
        s = min(ok_ours, key=lambda k: (ok_ours[k], list(row["ours"]).index(k)))
        best_ours = {"solver": s, "evals": ok_ours[s]}

    def best_scipy(tuned):
        cands = []
        for pose, sweep in row["scipy"].items():
            for m, rec in sweep.items():
                keys = ["default"] + (list(rec["grid"]) if tuned else [])
                for k in keys:
                    r = rec["default"] if k == "default" else rec["grid"][k]
                    if r["ok"]:
                        cands.append((r["evals"], pose != "coupled", k != "default", list(SCIPY).index(m), pose, m, k))
        if not cands:
            return None
        ev, _, _, _, pose, m, k = min(cands)
        return {"method": m, "alpha": k, "pose": pose, "evals": ev}

    return {"ours": best_ours, "scipy_default": best_scipy(False), "scipy_best": best_scipy(True)}


def label(b):
    if b is None:
        return "✗"
    alpha = "" if b["alpha"] == "default" or b["method"] == "scipy newton_krylov" else f" α={b['alpha']}"
    pose = ", row by row" if b["pose"] == "rows" else ""
    return f"{b['method'].removeprefix('scipy ')}{alpha}{pose}"


def verdict(ours, theirs):
    if ours is None and theirs is None:
        return "tie"
    if theirs is None:
        return "win"
    if ours is None:
        return "loss"
    return "win" if ours["evals"] < theirs["evals"] else "loss" if ours["evals"] > theirs["evals"] else "tie"


def summary(table):
    per, counts, ratios = {}, {}, {}
    for which in ("scipy_default", "scipy_best"):
        counts[which] = {"win": 0, "tie": 0, "loss": 0}
        ratios[which] = []
    for name, row in table.items():
        b = pick(row)
        per[name] = b
        for which in ("scipy_default", "scipy_best"):
            v = verdict(b["ours"], b[which])
            counts[which][v] += 1
            if b["ours"] and b[which]:
                ratios[which].append(b["ours"]["evals"] / b[which]["evals"])
    geo = {w: float(np.exp(np.mean(np.log(r)))) if r else None for w, r in ratios.items()}
    return {
        "per_problem": per,
        "wins_ties_losses": counts,
        "geometric_mean_ratio_ours_over_scipy": geo,
        "ratio_count": {w: len(r) for w, r in ratios.items()},
        "failures_ours": {s: [n for n, row in table.items() if not row["ours"][s]["ok"]] for s in es.SOLVERS},
    }


MORE_MEMORY = {"anderson": {"history": 20}, "broyden": {"memory": 50}}
"""The second diagnostic's parameters: SciPy's broyden1 keeps every secant pair, ours 10 by default."""


def loosened(table, summ):
    """Where SciPy's best beats ours: whether the gap is our stricter stopping rule. SciPy stops
    on max|F| ≤ TOL, ours on ‖g − x‖₂ ≤ α·TOL; our solvers run again stopped at
    ‖g − x‖₂ ≤ α·TOL·√D·2^(−k/2) (from the 2-norm that max|F| ≤ TOL allows at worst down to ours),
    and the fewest evaluations whose answer still passes SciPy's test (max|F| ≤ TOL, and the
    physical solution) are kept: what ours would take if it could stop on SciPy's test; then the
    same with more memory (MORE_MEMORY)."""
    for name, row in table.items():
        b = summ["per_problem"][name]
        if verdict(b["ours"], b["scipy_best"]) != "loss":
            continue
        p = es.BenchmarkProblem(name)
        d = p.x0.shape[1]
        tols = [p.alpha * TOL * math.sqrt(d) * 2 ** (-k / 2) for k in range(int(math.log2(d)) + 1)] + [p.alpha * TOL]
        for key, variants in (("ours_max_norm_stop", {s: {} for s in es.SOLVERS}), ("ours_max_norm_stop_more_memory", MORE_MEMORY)):
            best = None
            for s, params in variants.items():
                for tol in tols:
                    r = es.solve(p, p.x0, s, abs_tol=tol, rel_tol=0.0, max_iter=MAX_EVALS, **params)
                    status = np.asarray(r.status)
                    rec = score(p, name, r.z, None if np.all(status == "converged") else "stopped")
                    if rec["ok"]:
                        if best is None or r.map_evals < best["evals"]:
                            best = {"solver": s, "params": params, "evals": int(r.map_evals), "abs_tol": tol}
                        break
            row[key] = best


def retime(table, summ):
    """Best of REPS wall times of our best solver and SciPy's best configuration per problem."""
    for name, row in table.items():
        p = es.BenchmarkProblem(name)
        b = summ["per_problem"][name]
        if b["ours"]:
            row["wall_ours"] = min(ours(p, name, b["ours"]["solver"])["seconds"] for _ in range(REPS))
        if b["scipy_best"]:
            sb = b["scipy_best"]
            run = theirs_coupled if sb["pose"] == "coupled" else theirs_rows
            alpha = None if sb["alpha"] == "default" else float(sb["alpha"])
            recs = [run(p, name, SCIPY[sb["method"]], alpha) for _ in range(REPS)]
            fastest = min(recs, key=lambda r: r["seconds"] - r.get("seconds_in_F", 0.0))
            row["wall_scipy_best"] = fastest["seconds"]
            if sb["pose"] == "rows":
                row["wall_scipy_best_in_F"] = fastest["seconds_in_F"]


def _scipy_wall(row):
    """SciPy's best wall time for the comparison: row by row, only its time outside F (each of
    its F calls evaluates a whole batch to read one row), a lower bound in SciPy's favour."""
    if row.get("wall_scipy_best_in_F") is not None:
        return row["wall_scipy_best"] - row["wall_scipy_best_in_F"]
    return row.get("wall_scipy_best")


def _fmt_s(s):
    return "–" if s is None else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _cell(rec):
    return f"{rec['evals']}" if rec["ok"] else "✗"


def _scipy_cell(rec):
    """`defaults → best (α)` for a tuned method; one figure where the default is the best."""
    if not rec["grid"] or rec["best"] == "default":
        return _cell(rec["default"])
    if rec["best"] is None:
        return "✗"
    return f"{_cell(rec['default'])} → {rec['grid'][rec['best']]['evals']} (α={rec['best']})"


def _defaults_line():
    parts = []
    for s in es.SOLVERS:
        params = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in es.default_params(s).items()
                           if k != "kind")
        parts.append(f"{s} ({params})")
    return "; ".join(parts)


def markdown(table, summ, command):
    wtl, geo, nr = summ["wins_ties_losses"], summ["geometric_mean_ratio_ours_over_scipy"], summ["ratio_count"]
    methods = list(es.SOLVERS) + list(SCIPY) + list(OTHERS)
    lines = [
        f"Generated by `{command}` (elm_solver {'/'.join(es.SOLVERS)} against SciPy {scipy.__version__} "
        f"`scipy.optimize` and cvxgrp's `aa` {_aa_version()} (PyPI anderson-acceleration: Type-II and Type-I Anderson "
        f"with its safeguard, memory 5); {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; one run). "
        f"Map evaluations (batched calls of the map or of F) until max|F(x)| ≤ {TOL:g}, at most {MAX_EVALS} "
        f"(SciPy's solves also stop at {TIME_CAP:g} s); ✗ = failed (the reason in `benchmark.json`); on the H-equation "
        "and Bratu rows an answer must also be the physical solution.",
        "",
        f"- **Our best vs SciPy's best, per problem (fewer evaluations wins, equal ties): "
        f"{wtl['scipy_best']['win']} wins / {wtl['scipy_best']['tie']} ties / {wtl['scipy_best']['loss']} losses** "
        f"with SciPy given its best α per problem; {wtl['scipy_default']['win']} / {wtl['scipy_default']['tie']} / "
        f"{wtl['scipy_default']['loss']} against SciPy's defaults.",
        f"- **Geometric mean of (our best evaluations) / (SciPy's best): {geo['scipy_best']:.2f}** with SciPy's best α "
        f"({nr['scipy_best']} problems both solve); {geo['scipy_default']:.2f} against SciPy's defaults "
        f"({nr['scipy_default']} problems).",
        f"- SciPy's α: its default `0.5·max(‖x₀‖, 1)/‖F(x₀)‖` and the grid {{{', '.join(f'{a:g}' for a in ALPHA_GRID)}}} "
        "for `anderson`, `broyden1` and `linearmixing` (best kept per problem and method; a cell reads "
        "`defaults → best (α)`), `newton_krylov` as it is; SciPy's best is the fewest over all of these and, on the DEQ rows, "
        "over both ways of posing them. "
        f"Ours all ran with the crate's defaults, the same on every problem: {_defaults_line()}; on SciPy's problems our map "
        "is `g = x + α₀F` with SciPy's default α₀ (no step tuned; α₀ = 1 on the other problems), and our rows stop on "
        "‖g(x) − x‖₂ ≤ α₀·1e-6, stricter than SciPy's max-norm test.",
        "- DEQ rows: the main table poses them to SciPy as one coupled system of B·D = 4096 unknowns; the second table "
        "row by row (64 solves of 64 unknowns), counted as the batched-equivalent (the most F calls any row made, what "
        "a lockstep batched run calls) with the total over rows after the slash. Ours solves the rows as one batch, "
        "each row stopping on its own.",
        "",
        "| problem | " + " | ".join(methods) + " | ours best / SciPy best (fewer in bold) | wall: ours / SciPy best |",
        "|---|" + "---:|" * len(methods) + "---|---:|",
    ]
    for name, row in table.items():
        b = summ["per_problem"][name]
        cells = [_cell(row["ours"][s]) for s in es.SOLVERS]
        cells += [_scipy_cell(row["scipy"]["coupled"][m]) for m in SCIPY]
        cells += [_cell(row["others"][s]) for s in OTHERS]
        o = f"{b['ours']['evals']} ({b['ours']['solver']})" if b["ours"] else "✗"
        t = f"{b['scipy_best']['evals']} ({label(b['scipy_best'])})" if b["scipy_best"] else "✗"
        v = verdict(b["ours"], b["scipy_best"])
        o, t = (f"**{o}**" if v in ("win", "tie") and b["ours"] else o), (f"**{t}**" if v in ("loss", "tie") and b["scipy_best"] else t)
        wall = f"{_fmt_s(row.get('wall_ours'))} / {_fmt_s(row.get('wall_scipy_best'))}"
        if row.get("wall_scipy_best_in_F") is not None:
            wall += f" ({_fmt_s(_scipy_wall(row))} outside F)"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {o} / {t} | {wall} |")
    margins = [summ["per_problem"][n]["ours"]["evals"] - summ["per_problem"][n]["scipy_best"]["evals"]
               for n in table if verdict(summ["per_problem"][n]["ours"], summ["per_problem"][n]["scipy_best"]) == "loss"
               and summ["per_problem"][n]["ours"]]
    walls = [(row["wall_ours"], _scipy_wall(row)) for row in table.values()
             if row.get("wall_ours") is not None and row.get("wall_scipy_best") is not None]
    extra = []
    if margins:
        extra.append(f"every loss to SciPy's best α is by {min(margins)}–{max(margins)} evaluations"
                     if min(margins) != max(margins) else f"every loss to SciPy's best α is by {margins[0]} evaluation(s)")
    if walls:
        faster = sum(o < t for o, t in walls)
        gm = float(np.exp(np.mean([np.log(o / t) for o, t in walls])))
        extra.append(f"wall time per solve: ours faster than SciPy's best configuration on {faster} of {len(walls)} "
                     f"problems, geometric mean of (our time) / (SciPy's) {gm:.2f}")
    if extra:
        lines.insert(4, "- " + "; ".join(extra)[0].upper() + "; ".join(extra)[1:] + ".")
    deq = [n for n, row in table.items() if "rows" in row["scipy"]]
    if deq:
        lines += [
            "",
            "The DEQ rows posed to SciPy row by row (batched-equivalent / total F calls over the 64 rows; defaults → best α):",
            "",
            "| problem | " + " | ".join(SCIPY) + " | ours best |",
            "|---|" + "---:|" * len(SCIPY) + "---:|",
        ]
        for name in deq:
            cells = []
            for m in SCIPY:
                rec = table[name]["scipy"]["rows"][m]
                d, best = rec["default"], rec["best"]
                txt = f"{d['evals']}/{d['total_evals']}" if d["ok"] else "✗"
                if best is not None and best != "default":
                    g = rec["grid"][best]
                    txt += f" → {g['evals']}/{g['total_evals']} (α={best})"
                cells.append(txt)
            b = summ["per_problem"][name]["ours"]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {b['evals'] if b else '✗'} |")
    lines += ["", "Where SciPy's best beats ours (fewer evaluations):", ""]
    beaten = [n for n in table if verdict(summ["per_problem"][n]["ours"], summ["per_problem"][n]["scipy_best"]) == "loss"]
    for name in beaten:
        b = summ["per_problem"][name]
        o = f"our {b['ours']['solver']} {b['ours']['evals']}" if b["ours"] else "ours fail"
        line = f"- {name}: SciPy {label(b['scipy_best'])} {b['scipy_best']['evals']} against {o}."
        sb = b["scipy_best"]
        if sb["alpha"] != "default" and sb["method"] in TUNED:
            d = table[name]["scipy"][sb["pose"]][sb["method"]]["default"]
            if not d["ok"] or d["evals"] >= (b["ours"]["evals"] if b["ours"] else MAX_EVALS):
                line += (f" SciPy's step tuned: with its default α the same solver takes "
                         f"{d['evals'] if d['ok'] else '✗'}" + (" (α = 1 is our map's own step here)."
                                                                 if sb["alpha"] == "1" and table[name]["alpha"] == 1.0 else "."))
        loose = table[name].get("ours_max_norm_stop")
        if loose and b["ours"]:
            if loose["evals"] <= sb["evals"]:
                line += (f" Our stricter stopping rule: with its 2-norm stop loosened to {loose['abs_tol']:.2g} (the "
                         f"loosest of a √2-step grid whose answer still meets max|F| ≤ 1e-6) our {loose['solver']} "
                         f"takes {loose['evals']}.")
            else:
                line += (f" Not our stopping rule alone: with its 2-norm stop loosened as far as SciPy's test allows, "
                         f"ours still takes {loose['evals']} ({loose['solver']}).")
                more = table[name].get("ours_max_norm_stop_more_memory")
                if more and more["evals"] <= sb["evals"]:
                    line += (f" With that stop and more memory ({more['solver']} "
                             + ", ".join(f"{k} {v}" for k, v in more["params"].items())
                             + f"; SciPy's broyden1 keeps every secant pair) it takes {more['evals']}.")
        lines.append(line)
    if not beaten:
        lines.append("- none.")
    wrong = [(n, s) for n, row in table.items() for s, r in row["ours"].items() if r["why"] == "converged to the non-physical root"]
    if wrong:
        lines += ["", "Our solvers that converged to the non-physical root (scored ✗): "
                  + ", ".join(f"{s} on {n}" for n, s in wrong) + "."]
    lines += [
        "",
        f"Wall time: seconds per solve through the Python API, best of {REPS}, of our best solver and of SciPy's best "
        "configuration. SciPy row by row: the sum over rows, where each F call evaluates the whole 64-row batch to read "
        "one row, so the time outside F (in brackets, a lower bound) is what the time ratio above uses.",
    ]
    return lines


def _aa_version():
    from importlib.metadata import version

    return version("anderson-acceleration")


def plot(table, summ, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    series = {s: [table[n]["ours"][s] for n in names] for s in es.SOLVERS}
    for m in SCIPY:
        series[f"{m} (defaults)"] = [table[n]["scipy"]["coupled"][m]["default"] for n in names]
    best = []
    for n in names:
        b = summ["per_problem"][n]["scipy_best"]
        best.append({"ok": b is not None, "evals": b["evals"] if b else MAX_EVALS})
    series["SciPy best α"] = best
    fig, ax = plt.subplots(figsize=(11, 5))
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    k_all = len(series)
    for k, (m, recs) in enumerate(series.items()):
        xs, ys, fx, fy = [], [], [], []
        for i, v in enumerate(recs):
            x = i + (k - k_all / 2) * 0.08
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


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/solver_benchmark")
    ap.add_argument("--readme", default="")
    ap.add_argument("--command", default="bash scripts/solver-benchmark.sh")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    table = run()
    summ = summary(table)
    loosened(table, summ)
    retime(table, summ)
    report = {"tol": TOL, "max_evals": MAX_EVALS, "time_cap_s": TIME_CAP, "alpha_grid": list(ALPHA_GRID),
              "reps": REPS, "scipy": scipy.__version__, "numpy": np.__version__,
              "anderson-acceleration": _aa_version(), "ours_defaults": {s: es.default_params(s) for s in es.SOLVERS},
              "problems": table, "summary": summ, "seconds": time.perf_counter() - t0}
    _write(os.path.join(args.out, "benchmark.json"), json.dumps(report, indent=1))
    lines = markdown(table, summ, args.command)
    _write(os.path.join(args.out, "benchmark.md"), "# Solver benchmark\n\n" + "\n".join(lines) + "\n\n![benchmark](benchmark.svg)\n")
    plot(table, summ, os.path.join(args.out, "benchmark.svg"))
    if args.readme:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from readme_block import rewrite

        # The plot as the block's own file links to it (docs/solvers.md: ../results/...).
        svg = os.path.relpath(os.path.join(args.out, "benchmark.svg"), os.path.dirname(os.path.abspath(args.readme)))
        rewrite(args.readme, "solver-benchmark", lines + ["", f"![solver benchmark]({svg})"])
    print(json.dumps({k: summ[k] for k in ("wins_ties_losses", "geometric_mean_ratio_ours_over_scipy", "ratio_count")}, indent=1))
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
