#!/usr/bin/env bash
# The main job (README): installs system needs, fetches SmolLM2-135M, builds in release mode and rebuilds the
# paper's tables and plots at the `small` scale (CPU) into results/. Override with SCALE=smoke|small|paper.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ELM_MODELS_DIR="${ELM_MODELS_DIR:-$PWD/models}"
scale="${SCALE:-small}"
cargo build --release --workspace
cargo run --release -p paper_repro -- --scale "$scale" --out results --readme README.md
