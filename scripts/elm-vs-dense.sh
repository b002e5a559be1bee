#!/usr/bin/env bash
# The ELM against its dense parent in wall clock (the edge-inference issue, Build 3), one
# script, one run, written into the README block `elm-vs-dense`:
#
#   1. trains ELMs at M = 8 and M = 14 from layer 12 (the main job's window and its M sweep's)
#      at a documented budget: `elm train` defaults with STEPS steps of batch 2 x 128 tokens
#      (STEPS=300 is the `small` main budget); resumable, a finished run is reused;
#   2. for each ELM, Picard and Anderson at per-token tolerance δ ∈ {1, 0.5, 0.1}: `elm bench
#      --weights f32,auto --rounds ROUNDS` (block evaluations per token, KV bytes at a 4K
#      context one-step and multi-step, from the allocated caches), whose `versus_dense` rounds
#      decode the dense model and the ELM alternately in one process (b1 and b8), so each
#      ratio is read within a round and reported as the median over rounds with its range;
#   3. quality beside each speed: answer NLL on the first NLL_PROBLEMS GSM8K test problems
#      (`elm eval --task gsm8k-nll --compare-dense`, f32), with the paired difference to the
#      dense model and its interval.
#
#   bash scripts/elm-vs-dense.sh        (env: MODEL, STEPS, NLL_PROBLEMS, PROMPT_LEN,
#                                        DECODE_STEPS, ROUNDS, OUT, README, RENDER_ONLY)
#
# RENDER_ONLY=1 measures nothing: it renders the JSON and the block from the last run's files.
#
# Prints one JSON object; with README=PATH also replaces the `<!-- elm-vs-dense:begin -->` …
# `<!-- elm-vs-dense:end -->` block of PATH. About 30 min on 2 cores (two trainings of ~3 min,
# twelve bench runs of ~80 s, thirteen evaluations of ~25 s).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-${ELM_MODELS_DIR:-models}/SmolLM2-135M-Instruct.Q4_1.gguf}
STEPS=${STEPS:-300}
NLL_PROBLEMS=${NLL_PROBLEMS:-60}
PROMPT_LEN=${PROMPT_LEN:-128}
DECODE_STEPS=${DECODE_STEPS:-48}
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-results/elm_vs_dense}
WORK=$OUT/work
START=12
MS=(8 14)
SOLVERS=(picard anderson)
TOLS=(1 0.5 0.1)

[ -f "$MODEL" ] || { echo "no model at $MODEL (run scripts/setup.sh)" >&2; exit 1; }
if [ -z "${RENDER_ONLY:-}" ]; then
cargo build --release --bin elm >&2
ELM=${CARGO_TARGET_DIR:-target}/release/elm
mkdir -p "$WORK"
printf '{"steps": %d, "batch_size": 2, "seq_len": 128}\n' "$STEPS" > "$WORK/train_config.json"

for m in "${MS[@]}"; do
  dir=$WORK/elm-m$m
  if [ -f "$dir/train_state.json" ]; then
    echo "M=$m: resuming (or reusing) $dir" >&2
    "$ELM" train --model "$MODEL" --out "$dir" --resume --eval-examples 0 --json > "$dir.train.json"
  else
    echo "M=$m: training $STEPS steps into $dir" >&2
    "$ELM" train --model "$MODEL" --start "$START" --num-replaced "$m" \
      --config "$WORK/train_config.json" --out "$dir" --eval-examples 0 --json > "$dir.train.json"
  fi
done

"$ELM" eval --model "$MODEL" --task gsm8k-nll --limit "$NLL_PROBLEMS" --json > "$WORK/eval-dense.json"
for m in "${MS[@]}"; do
  for s in "${SOLVERS[@]}"; do
    for t in "${TOLS[@]}"; do
      tag=m$m-$s-$t
      echo "$tag: bench" >&2
      "$ELM" bench --model "$MODEL" --weights f32,auto --elm "$WORK/elm-m$m" --solver "$s" --abs-tol "$t" \
        --prompt-len "$PROMPT_LEN" --decode-steps "$DECODE_STEPS" --rounds "$ROUNDS" --json > "$WORK/bench-$tag.json"
      echo "$tag: answer NLL on $NLL_PROBLEMS problems" >&2
      "$ELM" eval --model "$MODEL" --elm "$WORK/elm-m$m" --solver "$s" --abs-tol "$t" \
        --task gsm8k-nll --limit "$NLL_PROBLEMS" --compare-dense --json > "$WORK/eval-$tag.json"
    done
  done
done
fi

python3 scripts/analysis/elm_vs_dense.py "$WORK" "$OUT" "${README:-}" "$STEPS" "$NLL_PROBLEMS" "$PROMPT_LEN" "$DECODE_STEPS" "$MODEL" \
  "${MS[*]}" "${SOLVERS[*]}" "${TOLS[*]}"
