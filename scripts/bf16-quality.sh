#!/usr/bin/env bash
# Does bf16 training change the study's conclusions? (issue 25) Trains the main-budget ELM
# (start 12, M = 8, 300 steps of 2 x 128, the `small` scale's budget) and the LoRA-tuned dense
# model (300 steps) once with `--precision f32` and once with `--precision bf16`, then scores
# each bf16 model against its f32 twin on the same held-out GSM8K problems (answer NLL, paired
# difference with its bootstrap interval; evaluation itself in f32). Writes
# results/bf16_quality/{elm,lora}{,-seed}.json and bf16_quality.md; also trains each f32 model again
# with seed 1, the training noise the bf16 difference is compared with. About 16 minutes on 2 cores.
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
# The scale of training noise: the same f32 runs with another seed (batch order, random draws), the
# same paired comparison. A bf16 difference no larger than this is no difference a seed would not make.
jq_seed() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['seed']=1; print(json.dumps(d))" "$1"; }
jq_seed "$work/train.json" > "$work/train-seed1.json"
echo '{"seed":1}' > "$work/lora-seed1.json"
"$elm" train --model "$model" --elm "$work/init" --config "$work/train-seed1.json" \
  --out "$work/elm-f32-seed1" --force --eval-examples 0 --json > "$out/train-elm-f32-seed1.json"
"$elm" lora --model "$model" --config "$work/lora-seed1.json" --steps 300 --seq-len 128 \
  --out "$work/lora-f32-seed1" --force --eval-examples 0 --json > "$out/train-lora-f32-seed1.json"
"$elm" eval --model "$model" --elm "$work/elm-bf16" --compare-elm "$work/elm-f32" --task gsm8k-nll \
  --limit "$limit" --json > "$out/elm.json"
"$elm" eval --model "$work/lora-bf16/model" --compare-model "$work/lora-f32/model" --task gsm8k-nll \
  --limit "$limit" --json > "$out/lora.json"
"$elm" eval --model "$model" --elm "$work/elm-f32-seed1" --compare-elm "$work/elm-f32" --task gsm8k-nll \
  --limit "$limit" --json > "$out/elm-seed.json"
"$elm" eval --model "$work/lora-f32-seed1/model" --compare-model "$work/lora-f32/model" --task gsm8k-nll \
  --limit "$limit" --json > "$out/lora-seed.json"
python3 - "$out" "$limit" <<'PY'
import json, sys
out, limit = sys.argv[1], sys.argv[2]
rows = []
for name, label in (("elm", "ELM (start 12, M = 8), 300 steps: bf16 vs f32"),
                    ("elm-seed", "ELM, f32 with seed 1 vs f32 (training noise)"),
                    ("lora", "LoRA-tuned dense, 300 steps: bf16 vs f32"),
                    ("lora-seed", "LoRA-tuned dense, f32 with seed 1 vs f32 (training noise)")):
    r = json.load(open(f"{out}/{name}.json"))
    rows.append((label, r))
lines = ["Written by `bash scripts/bf16-quality.sh` (SmolLM2-135M-Instruct Q4_1; each model trained once in f32 "
         f"and once with `--precision bf16`, same seed and data; answer NLL on {limit} held-out GSM8K problems, "
         "evaluated in f32; intervals: bootstrap 95% over problems).", "",
         "| model | f32-trained NLL | compared model's NLL | Δ (compared − f32), paired | within the paired interval of 0? |",
         "|---|---|---|---|---|"]
for label, r in rows:
    m = r["metrics"]["answer_nll"]
    p = m["paired"]
    mb, mf, d = p["model"], p["reference"], p["delta"]
    lines.append(f"| {label} | {mf['value']:.4f} [{mf['lo']:.4f}, {mf['hi']:.4f}] | "
                 f"{mb['value']:.4f} [{mb['lo']:.4f}, {mb['hi']:.4f}] | "
                 f"{d['value']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] | "
                 f"{'yes' if p['verdict'] == 'indistinguishable' else 'no (' + p['verdict'] + ')'} |")
lines += ["", "The paired interval covers the evaluation's sampling of problems, not training: two f32 runs that "
          "differ only in their seed differ by the rows marked training noise. bf16 changes a conclusion only "
          "where its difference is well beyond that."]
open(f"{out}/bf16_quality.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
