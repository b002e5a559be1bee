#!/usr/bin/env bash
# README table "memory estimate vs measured peak": runs `elm generate`, `elm eval`, `elm train` and
# `elm lora` on the real SmolLM2 checkpoint (release build), each with --json, and compares the
# estimate every command checks before its work (`memory_estimate.total_bytes`, elm::memory) with
# the peak resident set that /usr/bin/time measured for the process (%M, its maximum RSS).
# Writes results/memory/memory.{json,md} and rewrites the README block between
# <!-- memory:begin --> and <!-- memory:end -->. Exits 1 when an estimate is off by more than 25%.
# About 4 minutes on 2 cores.
#   bash scripts/memory-table.sh [README.md]
set -euo pipefail
cd "$(dirname "$0")/.."
readme=${1:-docs/faults.md}
model=${ELM_MODELS_DIR:-$PWD/models}/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || bash scripts/setup.sh
cargo build --release --quiet --bin elm
elm=$PWD/target/release/elm
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p results/memory
rows="$work/rows.jsonl"
# run LABEL ELM-ARGS...: one row (the command's JSON report and /usr/bin/time's peak in KiB).
run() {
  local label=$1; shift
  /usr/bin/time -f '%M' -o "$work/time" "$elm" "$@" --json >"$work/out" 2>"$work/err" ||
    { cat "$work/err" >&2; exit 1; }
  python3 - "$label" "$work/out" "$work/time" "$*" >>"$rows" <<'PY'
import json, sys
label, out, tm, args = sys.argv[1:]
report = json.loads(open(out).readline())
print(json.dumps({"label": label, "args": args, "estimate": report["memory_estimate"],
                  "peak_rss_bytes": int(open(tm).read().split()[-1]) * 1024}))
PY
  echo "measured: $label" >&2
}
echo '{"steps": 8, "checkpoint_every": 8, "lambda": {"ce_start": 0.0, "ce_end": 0.1}}' >"$work/train.json"
run "generate, f32, batch 1, 64 new tokens" generate --model "$model" --prompt "What is 12 times 7?" --max-new-tokens 64 --weights f32 --ignore-eos
run "generate, f32, batch 8, 256 new tokens" generate --model "$model" --prompt "What is 12 times 7?" --max-new-tokens 256 --batch 8 --weights f32 --ignore-eos
run "generate, quantized (auto), batch 8, 256 new tokens" generate --model "$model" --prompt "What is 12 times 7?" --max-new-tokens 256 --batch 8 --weights auto --ignore-eos
for b in 1 8 16; do
  run "eval gsm8k-nll, 100 problems, batch $b" eval --model "$model" --task gsm8k-nll --limit 100 --batch "$b"
done
run "train (start 12, M 8, batch 4 x 256, CE phase)" train --model "$model" --start 12 --m 8 --config "$work/train.json" --out "$work/elm" --eval-examples 0
run "eval gsm8k-nll with that ELM, batch 8" eval --model "$model" --elm "$work/elm" --task gsm8k-nll --limit 100 --batch 8
run "lora (all layers, batch 1 x 256, merge and save)" lora --model "$model" --steps 3 --out "$work/lora" --eval-examples 0
python3 scripts/analysis/memory_table.py "$rows" "$readme"
