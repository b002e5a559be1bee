#!/usr/bin/env bash
# The real-checkpoint pipeline a refactor must leave unchanged: compress, a few training steps,
# eval with Anderson and Broyden, generate, quantize, quantized generate. Writes each step's
# JSON (timings removed) to OUT_DIR; diff two such directories to compare builds:
#   ELM_BIN=/path/to/old/elm bash scripts/pipeline-compare.sh /tmp/before
#   bash scripts/pipeline-compare.sh /tmp/after && diff -r /tmp/before /tmp/after
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: pipeline-compare.sh OUT_DIR}"
bin="${ELM_BIN:-target/release/elm}"
model="${ELM_MODELS_DIR:-$PWD/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
step() { # NAME ARGS...: runs `elm ARGS --json`, keeps its JSON without wall-clock fields
  local name="$1"; shift
  "$bin" "$@" --json > "$work/$name.json"
  python3 - "$work/$name.json" "$out/$name.json" "$work" <<'PY'
import json, re, sys
timing = re.compile(r"(second|_s$|^s$|time|tok_s|per_s|elapsed|ms$|_ms|wall|eta|path|dir|file|out$|created|rss)", re.I)
def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if not timing.search(k)}
    if isinstance(v, list):
        return [strip(x) for x in v]
    if isinstance(v, str) and v.startswith(sys.argv[3]):
        return "WORK" + v[len(sys.argv[3]):]  # the run's own temporary directory
    return v
data = json.load(open(sys.argv[1]))
json.dump(strip(data), open(sys.argv[2], "w"), indent=1, sort_keys=True)
PY
  echo "$name: ok"
}
step compress compress --model "$model" --start 12 --num-replaced 8 --out "$work/init"
step train train --model "$model" --elm "$work/init" --steps 3 --out "$work/run" --eval-examples 4
step eval-anderson eval --model "$model" --elm "$work/run" --task gsm8k-nll --limit 8 --solver anderson
step eval-broyden eval --model "$model" --elm "$work/run" --task gsm8k-nll --limit 8 --solver broyden
step generate generate --model "$model" --elm "$work/run" --chat --prompt "What is 2+3?" --max-new-tokens 24
step quantize quantize --model "$model" --elm "$work/run" --format q8_0 --out "$work/q.gguf"
step generate-quant generate --elm "$work/q.gguf" --chat --prompt "What is 2+3?" --max-new-tokens 24
