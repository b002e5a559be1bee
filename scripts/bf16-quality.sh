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

python3 - "$out" "$limit" "${README:-}" <<'PY'
import glob, json, math, os, re, sys
out, limit, readme = sys.argv[1], sys.argv[2], sys.argv[3]

def paired(path):
    p = json.load(open(path))["metrics"]["answer_nll"]["paired"]
    return p["model"], p["reference"], p["delta"], p["verdict"]

def fmt(i):
    return f"{i['value']:.4f} [{i['lo']:.4f}, {i['hi']:.4f}]"

def seed_of(path):
    return int(re.search(r"seed(\d+)\.json$", path).group(1))

rows = []
for kind, label in (("elm", "ELM (start 12, M = 8), 300 steps"), ("lora", "LoRA-tuned dense, 300 steps")):
    for path in sorted(glob.glob(f"{out}/{kind}-bf16-seed*.json"), key=seed_of):
        rows.append((f"{label}, seed {seed_of(path)}: bf16 vs f32", *paired(path)))
    for path in sorted(glob.glob(f"{out}/{kind}-f32-seed*.json"), key=seed_of):
        rows.append((f"{label}: f32 seed {seed_of(path)} vs f32 seed 0 (training noise)", *paired(path)))

lines = ["Written by `bash scripts/bf16-quality.sh` (SmolLM2-135M-Instruct Q4_1; each model trained with "
         "`--precision f32` and with `--precision bf16`, same seed and data; answer NLL on "
         f"{limit} held-out GSM8K problems, evaluated in f32; intervals: bootstrap 95% over problems).", "",
         "| model | reference (f32) NLL | compared model's NLL | Δ (compared − reference), paired | 0 in the paired interval? |",
         "|---|---|---|---|---|"]
for label, m, r, d, verdict in rows:
    lines.append(f"| {label} | {fmt(r)} | {fmt(m)} | {d['value']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] | "
                 f"{'yes' if verdict == 'indistinguishable' else 'no (' + verdict + ')'} |")

# Across seeds: the interval that covers training (Student t over the per-seed differences).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
elm = sorted(glob.glob(f"{out}/elm-bf16-seed*.json"), key=seed_of)
summary = {}
if len(elm) >= 2:
    pairs = [paired(p) for p in elm]
    f32 = [r["value"] for _, r, _, _ in pairs]
    bf16 = [m["value"] for m, _, _, _ in pairs]
    diffs = [b - f for b, f in zip(bf16, f32)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1))
    half = T975[n - 1] * sd / math.sqrt(n)
    f32_mean = sum(f32) / n
    f32_sd = math.sqrt(sum((x - f32_mean) ** 2 for x in f32) / (n - 1))
    within = mean - half <= 0.0 <= mean + half
    worst = max(range(n), key=lambda i: abs(diffs[i]))
    summary = {"seeds": [seed_of(p) for p in elm], "f32_nll": f32, "bf16_nll": bf16, "bf16_minus_f32": diffs,
               "mean_difference": mean, "t_interval_95": [mean - half, mean + half],
               "f32_seed_sd": f32_sd, "zero_in_interval": within}
    lines += ["", f"Across the {n} ELM seeds ({', '.join(str(s) for s in summary['seeds'])}): f32 NLL "
              f"{', '.join(f'{x:.4f}' for x in f32)} (seed-to-seed sd {f32_sd:.4f}); bf16 "
              f"{', '.join(f'{x:.4f}' for x in bf16)}. Mean bf16 − f32 difference {mean:+.4f}, 95% t interval "
              f"over seeds [{mean - half:+.4f}, {mean + half:+.4f}]: "
              + ("it contains 0, so bf16 training is not distinguishable from the training noise at this "
                 "number of seeds." if within else
                 "it excludes 0, so bf16 training moves the ELM's NLL by more than the training noise.")
              + (f" The largest single-seed shift, {diffs[worst]:+.4f} (seed {summary['seeds'][worst]}), is "
                 f"{abs(diffs[worst]) / f32_sd:.1f} times the f32 seed-to-seed sd." if f32_sd > 0 else "")]
lines += ["", "Each paired interval covers the evaluation's sampling of problems, not training; the rows marked "
          "training noise, and for the ELM the interval over seeds, give the scale a bf16 difference is judged "
          "against. The main job (`small`, `long`) trains and scores with bf16 products since issue 40; `smoke` and `paper` with f32."]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
open(f"{out}/bf16_quality.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
if readme:
    sys.path.insert(0, "scripts")
    from readme_block import rewrite
    rewrite(readme, "bf16-quality", lines)
PY
