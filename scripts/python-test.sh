#!/usr/bin/env bash
# The Python package (python/, PyO3 + rust-numpy, built by maturin) in a venv of its own: style
# gates on its Rust half, `pip install ./python` (what a user runs; maturin comes from PyPI through
# pip's build isolation), then its pytest tests. Called by scripts/test.sh; needs python3-venv
# (scripts/setup.sh installs it) and the registries.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${ELM_PY_VENV:-$PWD/target/py-venv}"
# The extension's Cargo build lives beside the workspace's (not inside pip's temporary copy), so
# a second run rebuilds nothing.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/python}"
cargo fmt --manifest-path python/Cargo.toml -- --check
cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings 2>&1
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip 2>&1
"$venv/bin/pip" install -q numpy pytest 2>&1
"$venv/bin/pip" install -q --force-reinstall --no-deps ./python 2>&1
# From outside the repository, so the installed package (not python/elm_solver) is imported.
(cd "$venv" && bin/python -c "import elm_solver; print('elm_solver', elm_solver.SOLVERS, elm_solver.LINEAR_SOLVERS)")
(cd "$venv" && bin/python -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests" 2>&1)
# The example: a DEQ layer's forward and implicit backward against finite differences, and the
# ρ reading of "which solver when" (python/examples/deq_layer.py asserts both with --check).
(cd "$venv" && bin/python "$OLDPWD/python/examples/deq_layer.py" --check 2>&1)
