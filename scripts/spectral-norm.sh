#!/usr/bin/env bash
# Does spectral normalisation of the module's matrices lower the trained ELM's spectral radius,
# and what does it cost? Trains the same ELM (SmolLM2-135M, start 12, M = 8, 60 steps of batch
# 2 x 128, shared teacher cache; the jacobian-regulariser.sh setting) without it and with
# `"spectral_norm": {"target": c, "relative": true}` for each c in $TARGETS (every matrix acting on z
# held at c times its starting norm: the copied layer's matrices range from 0.08 (W_z) to 29, so
# one absolute norm would rescale them by up to 100x), measures rho(dphi/dz) of each with
# `elm spectral` and keeps the reports in results/spectral_norm/ (held-out distillation loss:
# `distill_after` in train-*.json). About 6 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
targets="${TARGETS:-off 1 0.5}"
out="${OUT:-results/spectral_norm}"
work="${WORK:-$(mktemp -d)}"
model="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || bash scripts/fetch-smollm2.sh
cargo build --release --quiet --bin elm
elm=target/release/elm
mkdir -p "$out"
"$elm" compress --model "$model" --start 12 --num-replaced 8 --out "$work/start" --force >/dev/null
for c in $targets; do
  sn=""
  [ "$c" = off ] || sn=",\"spectral_norm\":{\"target\":$c,\"relative\":true}"
  echo "{\"steps\":60,\"batch_size\":2,\"seq_len\":128,\"spectral_every\":15$sn}" > "$work/cfg-$c.json"
  "$elm" train --model "$model" --elm "$work/start" --config "$work/cfg-$c.json" --out "$work/run-$c" \
    --force --eval-examples 8 --teacher-cache "$work/teacher" --json > "$out/train-$c.json"
  "$elm" spectral --model "$model" --elm "$work/run-$c" --limit 8 --json > "$out/spectral-$c.json"
done
python3 - "$out" $targets <<'PY'
import json, sys
out, targets = sys.argv[1], sys.argv[2:]
lines = ["| spectral_norm target (relative to each matrix's starting norm) | measured ρ(∂φ/∂z), mean [min, max] over 8 GSM8K sequences | held-out distillation MSE before → after | training s |",
         "|---|---|---|---|"]
for c in targets:
    t = json.load(open(f"{out}/train-{c}.json"))
    s = json.load(open(f"{out}/spectral-{c}.json"))
    mean, lo, hi = s["mean_radius"], s["min_radius"], s["max_radius"]
    lines.append(f"| {c} | {mean:.3f} [{lo:.3f}, {hi:.3f}] | {t['distill_before']:.2f} → {t['distill_after']:.2f} | {t['seconds']:.0f} |")
text = "*Written by `bash scripts/spectral-norm.sh`.*\n\n" + "\n".join(lines) + "\n"
open(f"{out}/spectral_norm.md", "w").write(text)
print(text)
PY
