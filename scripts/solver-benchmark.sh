#!/usr/bin/env bash
# The solver benchmark (issues 41 and 58): every fixed-point solver of elm_solver (its defaults),
# cvxgrp's aa, and SciPy's anderson, broyden1 and linearmixing (their default alpha and a grid of
# alpha, the best kept per problem) and newton_krylov on every problem of elm_solver.BENCHMARKS
# (SciPy's test problems, DEQ layers posed to SciPy coupled and row by row, the Chandrasekhar
# H-equation, 1-D Bratu), one run; wins/ties/losses, geometric means, wall times; writes
# results/solver_benchmark/ (benchmark.json, benchmark.md, benchmark.svg) and the README block
# `solver-benchmark`. Builds the Python package into the venv of scripts/python-test.sh and adds
# SciPy and matplotlib there (from PyPI). About 3 minutes on 2 cores with the package already built.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${ELM_PY_VENV:-$PWD/target/py-venv}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/python}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q numpy scipy matplotlib anderson-acceleration 2>&1
"$venv/bin/pip" install -q --force-reinstall --no-deps ./python 2>&1
"$venv/bin/python" scripts/solver_benchmark.py --out results/solver_benchmark --readme docs/solvers.md \
  --command "bash scripts/solver-benchmark.sh"
