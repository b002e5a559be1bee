#!/usr/bin/env bash
# Does the Hutchinson Jacobian regulariser lower the trained ELM's spectral radius? Trains the
# same ELM (SmolLM2-135M, start 12, M = 8, 60 steps of batch 2 x 128, shared teacher cache) with
# penalty weights $WEIGHTS, measures rho(dphi/dz) of each with `elm spectral`, and redraws the
# rho sweep (results/rho_sweep) with the trained modules marked. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
weights="${WEIGHTS:-0 3 1000 10000}"
out="${OUT:-results/jacobian_regulariser}"
work="${WORK:-$(mktemp -d)}"
model="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || bash scripts/fetch-smollm2.sh
cargo build --release --bin elm
elm=target/release/elm
mkdir -p "$out"
"$elm" compress --model "$model" --start 12 --num-replaced 8 --out "$work/start" --force
marks=()
for w in $weights; do
  cfg="$work/cfg-$w.json"
  echo "{\"steps\":60,\"batch_size\":2,\"seq_len\":128,\"jacobian_penalty\":{\"weight\":$w,\"probes\":1},\"spectral_every\":15}" > "$cfg"
  "$elm" train --model "$model" --elm "$work/start" --config "$cfg" --out "$work/run-$w" --force \
    --eval-examples 8 --teacher-cache "$work/teacher" --json > "$out/train-$w.json"
  "$elm" spectral --model "$model" --elm "$work/run-$w" --limit 8 --json > "$out/spectral-$w.json"
  marks+=(--mark-report "jac $w=$out/spectral-$w.json")
done
"$elm" sweep --out results/rho_sweep "${marks[@]}"
