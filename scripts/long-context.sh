#!/usr/bin/env bash
# Long contexts: `elm generate` (batch 1, quantized weights as the file stores them, greedy,
# NEW_TOKENS new tokens) after prompts of about 1K, 4K and 8K tokens on SmolLM2 (its context is
# 8K) and 1K, 4K, 8K and 32K on Gemma 3: prefill and decode tok/s, the KV cache's bytes and the
# process's peak RSS, each from the command's own --json report. With OLD_BIN (an earlier `elm`),
# the two binaries alternate, repetition by repetition, so both see the same machine.
# Writes results/long_context/long_context.json and the `long-context` block of
# docs/performance.md (README=... for another file). About 8 minutes on 2 cores with OLD_BIN.
#   [OLD_BIN=/path/to/old/elm] bash scripts/long-context.sh
set -euo pipefail
cd "$(dirname "$0")/.."
models=${ELM_MODELS_DIR:-$PWD/models}
readme=${README:-docs/performance.md}
reps=${REPS:-1}
new_tokens=${NEW_TOKENS:-16}
lengths_smollm2=${LENGTHS_SMOLLM2:-1024 4096 8000}
lengths_gemma3=${LENGTHS_GEMMA3:-1024 4096 8192 32000}
old_max=${OLD_MAX_TOKENS:-8192}  # the old binary is run up to this length (at 32K it attends to every key on every layer)
[ -f "$models/gemma-3-270m-q4_k_m.gguf" ] || bash scripts/setup.sh
cargo build --release --quiet --bin elm
new_bin=${CARGO_TARGET_DIR:-target}/release/elm
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
rows="$work/rows.jsonl"
# prompt FILE TOKENS MODEL: writes a text of about TOKENS tokens of MODEL to FILE (a probe of 2000
# words gives the model's tokens per word).
prompt() {
  python3 scripts/analysis/long_context.py text 2000 >"$work/probe.txt"
  local per
  per=$("$new_bin" generate --model "$3" --prompt-file "$work/probe.txt" --max-new-tokens 1 --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["prompt_tokens"] / 2000)')
  python3 scripts/analysis/long_context.py text "$(python3 -c "print(int($2 / $per))")" >"$1"
}
# run LABEL BIN MODEL LENGTH PROMPT_FILE: one row.
# A prompt past 128 KiB does not fit one argument: this binary reads it from the file; an
# OLD_BIN from before --prompt-file gets it as --prompt (it runs up to OLD_MAX_TOKENS only).
run() {
  local source=(--prompt-file "$5")
  if [ "$1" = old ]; then source=(--prompt "$(cat "$5")"); fi
  "$2" generate --model "$3" "${source[@]}" --max-new-tokens "$new_tokens" --ignore-eos \
    --weights auto --json >"$work/out"
  python3 scripts/analysis/long_context.py row "$1" "$3" "$4" "$work/out" >>"$rows"
  echo "measured: $1 $(basename "$3") ~$4 tokens" >&2
}
for spec in "SmolLM2-135M-Instruct.Q4_1.gguf:$lengths_smollm2" "gemma-3-270m-q4_k_m.gguf:$lengths_gemma3"; do
  model="$models/${spec%%:*}"
  for len in ${spec#*:}; do
    prompt "$work/prompt.txt" "$len" "$model"
    for _ in $(seq "$reps"); do
      run new "$new_bin" "$model" "$len" "$work/prompt.txt"
      if [ -n "${OLD_BIN:-}" ] && [ "$len" -le "$old_max" ]; then run old "$OLD_BIN" "$model" "$len" "$work/prompt.txt"; fi
    done
  done
done
mkdir -p results/long_context
python3 scripts/analysis/long_context.py table "$rows" results/long_context/long_context.json "$readme"
