#!/usr/bin/env bash
# Does bf16 training change the study's conclusions? (issue 25) Trains the main-budget ELM
# (start 12, M = 8, 300 steps of 2 x 128, the `small` scale's budget) with each seed of SEEDS
# (default 0 1 2 3 4) once with `--precision f32` and once with `--precision bf16`, and the LoRA-tuned
# dense model (300 steps) with seed 0 in both precisions and seed 1 in f32. Each bf16 model is
# scored against its same-seed f32 twin on the same held-out GSM8K problems (answer NLL, paired
# difference with its bootstrap interval over problems; evaluation itself in f32), and each
# other-seed f32 model against seed 0's (the training noise). Across the ELM seeds, the mean
# bf16 − f32 difference gets a t interval over seeds: that is the interval that covers training.
# PARTS="elm lora" (default both) picks what is trained again (PARTS=none: only the table); the
# table is built from every result present in OUT. Writes results/bf16_quality/*.json and
# bf16_quality.md and, with README=docs/performance.md, its bf16-quality block. About 10 minutes
# per ELM seed (52 for five, with the seed-to-seed pairings) and 22 for the LoRA part on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
limit="${LIMIT:-200}"
seeds="${SEEDS:-0 1 2 3 4}"
parts="${PARTS:-elm lora}"
out="${OUT:-results/bf16_quality}"
work="${WORK:-$(mktemp -d)}"
model="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || bash scripts/fetch-smollm2.sh
cargo build --release --bin elm >&2
elm=target/release/elm
mkdir -p "$out" "$work"
with_seed() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['seed']=int(sys.argv[2]); print(json.dumps(d))" "$1" "$2"; }

if [[ " $parts " == *" elm "* ]]; then
  rm -f "$out"/elm*.json "$out"/train-elm-*.json
  "$elm" compress --model "$model" --start 12 --num-replaced 8 --out "$work/init" --force >&2
  for s in $seeds; do
    with_seed '{"steps":300,"batch_size":2,"seq_len":128,"checkpoint_every":75}' "$s" > "$work/train-$s.json"
    for p in f32 bf16; do
      "$elm" train --precision "$p" --model "$model" --elm "$work/init" --config "$work/train-$s.json" \
        --out "$work/elm-$p-seed$s" --force --eval-examples 0 --json > "$out/train-elm-$p-seed$s.json"
    done
    "$elm" eval --model "$model" --elm "$work/elm-bf16-seed$s" --compare-elm "$work/elm-f32-seed$s" \
      --task gsm8k-nll --limit "$limit" --json > "$out/elm-bf16-seed$s.json"
  done
  first="${seeds%% *}"
  for s in $seeds; do
    [ "$s" = "$first" ] && continue
    "$elm" eval --model "$model" --elm "$work/elm-f32-seed$s" --compare-elm "$work/elm-f32-seed$first" \
      --task gsm8k-nll --limit "$limit" --json > "$out/elm-f32-seed$s.json"
  done
fi

if [[ " $parts " == *" lora "* ]]; then
  rm -f "$out"/lora*.json "$out"/train-lora-*.json
  for p in f32 bf16; do
    "$elm" lora --precision "$p" --model "$model" --steps 300 --seq-len 128 --out "$work/lora-$p" \
      --force --eval-examples 0 --json > "$out/train-lora-$p-seed0.json"
  done
  echo '{"seed":1}' > "$work/lora-seed1.json"
  "$elm" lora --model "$model" --config "$work/lora-seed1.json" --steps 300 --seq-len 128 \
    --out "$work/lora-f32-seed1" --force --eval-examples 0 --json > "$out/train-lora-f32-seed1.json"
  "$elm" eval --model "$work/lora-bf16/model" --compare-model "$work/lora-f32/model" --task gsm8k-nll \
    --limit "$limit" --json > "$out/lora-bf16-seed0.json"
  "$elm" eval --model "$work/lora-f32-seed1/model" --compare-model "$work/lora-f32/model" \
    --task gsm8k-nll --limit "$limit" --json > "$out/lora-f32-seed1.json"
fi

python3 scripts/analysis/bf16_quality.py "$out" "$limit" "${README:-}"
