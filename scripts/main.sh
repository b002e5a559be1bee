#!/usr/bin/env bash
# The main job (README): installs system needs, fetches SmolLM2-135M, builds in release mode and rebuilds the
# paper's tables and plots at the `small` scale (CPU) into results/. Override with SCALE=smoke|small|long|paper.
# `long` (small + learning curves and seeds) writes results/long/ and docs/study.md's long block (the README's headline stays
# `small`'s); it
# starts from the stage records `small` left in results/stages (the same stages, same keys), so after a `small`
# run it computes only what it adds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ELM_MODELS_DIR="${ELM_MODELS_DIR:-$PWD/models}"
scale="${SCALE:-small}"
cargo build --release --workspace
if [ "$scale" = long ]; then
  mkdir -p results/long/stages
  if compgen -G 'results/stages/*.json' >/dev/null; then
    # -n: a record the long run already has (perhaps recomputed) is kept.
    cp -n results/stages/*.json results/long/stages/
    # A cached stage's files (plots, checkpoints) stay in small's work directory.
    mkdir -p results/long/work
    for d in results/work/*; do
      [ -e "results/long/work/$(basename "$d")" ] || ln -s "$PWD/$d" results/long/work/
    done
  fi
  exec cargo run --release -p paper_repro -- --scale long --out results/long --readme docs/study.md
fi
cargo run --release -p paper_repro -- --scale "$scale" --out results --readme README.md
