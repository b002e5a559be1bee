#!/usr/bin/env bash
# The test command (README, .ci/run): installs its own system needs, fetches the real
# SmolLM2 checkpoint, runs the whole suite, and checks that the `cuda` feature builds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ELM_MODELS_DIR="${ELM_MODELS_DIR:-$PWD/models}"
# Style gates over the whole tree (library, binaries, tests, examples, benches; both CUDA twins).
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings 2>&1
cargo clippy --workspace --all-targets --features cuda -- -D warnings 2>&1
cargo test --workspace --all-targets --no-fail-fast 2>&1
# CI has no GPU and no CUDA toolkit: the feature must still build (GPU tests skip themselves).
cargo build --lib --features cuda 2>&1
cargo test --features cuda --test cuda 2>&1
