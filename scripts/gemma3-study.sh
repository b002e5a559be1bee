#!/usr/bin/env bash
# The study's main table on the second family (issue 39): Gemma 3 270M base, Q4_K_M GGUF (dequantised to f32 for
# training), at SCALE (default small; smoke for a few-minute check of the whole pipeline), into results/gemma3/
# (README.md, tables.json, stages/ for resuming). The windows are the paper's scaled to 18 layers (layers 7-11,
# see paper_repro's Limits::for_layers); GSM8K is put in lm-evaluation-harness's base-model layout (QaLayout::Base).
# The SmolLM2 main job (scripts/main.sh) is separate and unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ELM_MODELS_DIR="${ELM_MODELS_DIR:-$PWD/models}"
scale="${SCALE:-small}"
out="results/gemma3"
[ "$scale" = small ] || out="results/gemma3-$scale"
cargo build --release --workspace
# A `small` run also writes its headline into docs/study.md's `headline-gemma3` block.
readme=()
[ "$scale" = small ] && readme=(--readme docs/study.md --readme-block headline-gemma3)
cargo run --release -p paper_repro -- --scale "$scale" --only main \
  --model "$ELM_MODELS_DIR/gemma-3-270m-q4_k_m.gguf" --out "$out" "${readme[@]}"
