#!/usr/bin/env bash
# Batch-1 decode with the streamed weights on transparent huge pages (the default) against
# the same binary with ELM_HUGE_PAGES=0 (4 KiB pages), alternated REPS times per model in one
# run; prints one JSON object with the medians and the paired ratios.
#
#   bash scripts/huge-pages-ab.sh [MODEL.gguf ...]     (env: REPS, THREADS, PROMPT_LEN,
#                                                        DECODE_STEPS, README)
#
# With README=PATH the table also replaces the block `<!-- huge-pages:begin -->` ...
# `<!-- huge-pages:end -->` of PATH. About 1 min per model and 8 repetitions on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  set -- "${ELM_MODELS_DIR:-models}/SmolLM2-135M-Instruct.Q4_1.gguf" \
         "${ELM_MODELS_DIR:-models}/gemma-3-270m-q4_k_m.gguf"
fi
REPS=${REPS:-8}
THREADS=${THREADS:-$(nproc)}
PROMPT_LEN=${PROMPT_LEN:-128}
DECODE_STEPS=${DECODE_STEPS:-48}
cargo build --release --bin elm >&2
ELM_BIN=${CARGO_TARGET_DIR:-target}/release/elm
OUT=$(mktemp -d)
for model in "$@"; do
  [ -f "$model" ] || { echo "no model at $model (run scripts/setup.sh)" >&2; exit 1; }
  name=$(basename "$model" .gguf)
  for r in $(seq 1 "$REPS"); do
    for pages in huge small; do
      echo "$name rep $r/$REPS: $pages pages" >&2
      flag=1; [ "$pages" = small ] && flag=0
      ELM_HUGE_PAGES=$flag taskset -c "0-$((THREADS - 1))" "$ELM_BIN" bench --model "$model" \
        --weights auto --prompt-len "$PROMPT_LEN" --decode-steps "$DECODE_STEPS" --json \
        > "$OUT/${name}_${pages}_$r.json"
    done
  done
done
python3 scripts/analysis/huge_pages_ab.py "$OUT" "$REPS" "${README:-}" "$PROMPT_LEN" "$DECODE_STEPS" "$THREADS" "$@"
rm -rf "$OUT"
