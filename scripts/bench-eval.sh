#!/usr/bin/env bash
# Evaluation speed as a benchmark (issue: "answer NLL over 300 GSM8K problems on the dense model
# in ≤ 2 minutes"): runs `elm bench` (sgemm peak, batched prefill) and
# `elm eval --task gsm8k-nll --limit N` in the same run and prints one JSON object with the
# evaluation's wall time, tokens/s, its FLOP rate and the ratios to the bench's prefill and sgemm
# peak, so a slow figure can be told apart from a busy machine (load average included).
#
#   bash scripts/bench-eval.sh [MODEL]        (env: LIMIT=300, BATCH=8)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-${ELM_MODELS_DIR:-models}/SmolLM2-135M-Instruct.Q4_1.gguf}
LIMIT=${LIMIT:-300}
BATCH=${BATCH:-8}
cargo build --release --bin elm >&2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
target/release/elm bench --model "$MODEL" --json > "$OUT/bench.json"
target/release/elm eval --model "$MODEL" --task gsm8k-nll --limit "$LIMIT" --batch "$BATCH" \
  --json > "$OUT/eval.json"
python3 - "$OUT/bench.json" "$OUT/eval.json" "$LIMIT" <<'PY'
import json, os, sys
bench, ev, limit = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
# Prefill FLOPs per token as the bench counts them: its GFLOP/s ÷ its tok/s.
flop_per_token = bench["prefill_gflop_s"] * 1e9 / bench["prefill_tok_s"]
eval_gflop_s = ev["tok_s"] * flop_per_token / 1e9
print(json.dumps({
    "problems": ev["n"],
    "eval_seconds": ev["seconds"],
    "eval_tokens": ev["tokens"],
    "eval_tok_s": ev["tok_s"],
    "eval_gflop_s": eval_gflop_s,
    "bench_prefill_tok_s": bench["prefill_tok_s"],
    "bench_sgemm_gflop_s": bench["sgemm_gflop_s"],
    "eval_vs_bench_prefill": ev["tok_s"] / bench["prefill_tok_s"],
    "eval_vs_sgemm_peak": eval_gflop_s / bench["sgemm_gflop_s"],
    "target_seconds_for_300": 120.0,
    "seconds_per_300_problems": ev["seconds"] * 300 / max(ev["n"], 1),
    "load_average_1m": os.getloadavg()[0],
    "bench_load_average_1m": bench.get("load_average_1m"),
}, indent=1))
PY
