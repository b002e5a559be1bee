#!/usr/bin/env bash
# The Python package (python/, PyO3 + rust-numpy, built by maturin) in a venv of its own: style
# gates on its Rust half; one abi3 wheel built by maturin with its manylinux compliance check
# (what would be published: target/wheels/), installed from that file; then its pytest tests,
# the torch layer's included (torch and scikit-learn are test-time dependencies: installed into
# this venv only, ~1.5 min and ~4 GB the first time, from PyPI); then the two examples with
# --check. Called by scripts/test.sh; needs python3-venv (scripts/setup.sh installs it) and the
# registries.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${ELM_PY_VENV:-$PWD/target/py-venv}"
# The extension's Cargo build lives beside the workspace's, so a second run rebuilds nothing.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/python}"
cargo fmt --manifest-path python/Cargo.toml -- --check
cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings 2>&1
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip 2>&1
"$venv/bin/pip" install -q numpy pytest "maturin>=1.5,<2" torch scikit-learn 2>&1
wheels="$PWD/target/wheels"
rm -rf "$wheels"
# maturin refuses a wheel whose symbols exceed its manylinux tag (its auditwheel check).
"$venv/bin/maturin" build --release --strip -m python/Cargo.toml --out "$wheels" 2>&1 | tail -n 3
wheel=$(ls "$wheels"/elm_solver-*.whl)
case "$wheel" in
  *-abi3-manylinux*) echo "wheel: $(basename "$wheel")" ;;
  *) echo "expected an abi3 manylinux wheel, got $(basename "$wheel")" >&2; exit 1 ;;
esac
"$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel" 2>&1
# From outside the repository, so the installed package (not python/elm_solver) is imported.
(cd "$venv" && bin/python -c "import elm_solver; print('elm_solver', elm_solver.__file__, elm_solver.SOLVERS, elm_solver.LINEAR_SOLVERS)")
# ELM_REQUIRE_TORCH: a missing torch fails the torch tests instead of skipping them.
(cd "$venv" && ELM_REQUIRE_TORCH=1 bin/python -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests" 2>&1)
# The scripts' analysis modules have small tests of their own.
(cd "$venv" && bin/python -m pytest -q -p no:cacheprovider "$OLDPWD/scripts/analysis" 2>&1)
# The examples: a DEQ layer on NumPy (forward, implicit backward against finite differences, the
# ρ reading of "which solver when") and a DEQ classifier trained with elm_solver.torch on
# scikit-learn's digits beside unrolled steps; each asserts its figures with --check.
(cd "$venv" && bin/python "$OLDPWD/python/examples/deq_layer.py" --check 2>&1)
(cd "$venv" && bin/python "$OLDPWD/python/examples/deq_digits.py" --check 2>&1)
