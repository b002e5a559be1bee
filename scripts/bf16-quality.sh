#!/usr/bin/env bash
# Does bf16 training change the study's conclusions? (issue 25) Trains the main-budget ELM
# (start 12, M = 8, 300 steps of 2 x 128, the `small` scale's budget) and the LoRA-tuned dense
# model (300 steps) once with `--precision f32` and once with `--precision bf16`, then scores
# each bf16 model against its f32 twin on the same held-out GSM8K problems (answer NLL, paired
# difference with its bootstrap interval; evaluation itself in f32). Writes
# results/bf16_quality/{elm,lora}.json and bf16_quality.md. About 25 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
limit="${LIMIT:-200}"
out="${OUT:-results/bf16_quality}"
work="${WORK:-$(mktemp -d)}"
model="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || bash scripts/fetch-smollm2.sh
cargo build --release --bin elm >&2
elm=target/release/elm
mkdir -p "$out"
"$elm" compress --model "$model" --start 12 --num-replaced 8 --out "$work/init" --force >&2
echo '{"steps":300,"batch_size":2,"seq_len":128,"checkpoint_every":75}' > "$work/train.json"
for p in f32 bf16; do
  "$elm" train --precision "$p" --model "$model" --elm "$work/init" --config "$work/train.json" \
    --out "$work/elm-$p" --force --eval-examples 0 --json > "$out/train-elm-$p.json"
  "$elm" lora --precision "$p" --model "$model" --steps 300 --seq-len 128 --out "$work/lora-$p" \
    --force --eval-examples 0 --json > "$out/train-lora-$p.json"
done
"$elm" eval --model "$model" --elm "$work/elm-bf16" --compare-elm "$work/elm-f32" --task gsm8k-nll \
  --limit "$limit" --json > "$out/elm.json"
"$elm" eval --model "$work/lora-bf16/model" --compare-model "$work/lora-f32/model" --task gsm8k-nll \
  --limit "$limit" --json > "$out/lora.json"
python3 - "$out" "$limit" <<'PY'
import json, sys
out, limit = sys.argv[1], sys.argv[2]
rows = []
for name, label in (("elm", "ELM (start 12, M = 8), 300 steps"), ("lora", "LoRA-tuned dense, 300 steps")):
    r = json.load(open(f"{out}/{name}.json"))
    rows.append((label, r))
lines = ["Written by `bash scripts/bf16-quality.sh` (SmolLM2-135M-Instruct Q4_1; each model trained once in f32 "
         f"and once with `--precision bf16`, same seed and data; answer NLL on {limit} held-out GSM8K problems, "
         "evaluated in f32; intervals: bootstrap 95% over problems).", "",
         "| model | f32-trained NLL | bf16-trained NLL | Δ (bf16 − f32), paired | within the paired interval of 0? |",
         "|---|---|---|---|---|"]
for label, r in rows:
    m = r["metrics"]["answer_nll"]
    p = m["paired"]
    mb, mf, d = p["model"], p["reference"], p["delta"]
    lines.append(f"| {label} | {mf['value']:.4f} [{mf['lo']:.4f}, {mf['hi']:.4f}] | "
                 f"{mb['value']:.4f} [{mb['lo']:.4f}, {mb['hi']:.4f}] | "
                 f"{d['value']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] | "
                 f"{'yes' if p['verdict'] == 'indistinguishable' else 'no (' + p['verdict'] + ')'} |")
open(f"{out}/bf16_quality.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
