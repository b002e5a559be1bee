#!/usr/bin/env bash
# GPU throughput of elm's CUDA inference path vs a PyTorch eager reference on the SAME GPU.
#
# For SmolLM2-135M and a Qwen2.5-1.5B-shaped model (seeded random weights of the exact shapes;
# timing does not depend on values) it measures prefill tok/s (batch 1) and decode tok/s
# (batch 1 and 32) with `elm::cuda::bench::run_bench` and with scripts/torch_ref_bench.py (same
# protocol), then prints elm / torch ratios. Needs: an NVIDIA driver, the CUDA libraries cudarc
# loads at run time (libnvrtc, libcublas), system OpenBLAS (as for any elm build), python3 + torch.
#
# Usage: scripts/gpu-bench.sh            (env overrides below)
#   BIN=path: a driver built elsewhere (BUILD_ONLY=1 prints its path), for GPU machines without cargo
#   ORDINAL=0 PREFILL_LEN=512 DECODE_PROMPT_LEN=128 STEPS=64 BATCHES=1,32 REPS=5 TF32=0
#   MODELS="smollm2-135m qwen2.5-1.5b" OUT=target/gpu-bench
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ORDINAL="${ORDINAL:-0}"
PREFILL_LEN="${PREFILL_LEN:-512}"
DECODE_PROMPT_LEN="${DECODE_PROMPT_LEN:-128}"
STEPS="${STEPS:-64}"
BATCHES="${BATCHES:-1,32}"
REPS="${REPS:-5}"
TF32="${TF32:-0}"
MODELS="${MODELS:-smollm2-135m qwen2.5-1.5b}"
OUT="${OUT:-$ROOT/target/gpu-bench}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

PROFILE="${PROFILE:-release}"   # PROFILE=dev + BUILD_ONLY=1: compile-check the driver on any machine

if [ -z "${BUILD_ONLY:-}" ]; then
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  python3 -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'" \
    || { echo "gpu-bench: python3 with CUDA-enabled torch is required" >&2; exit 1; }
fi

# A throw-away driver crate: the library exposes the benchmark (elm::cuda::bench) and this
# binary only parses arguments and prints the JSON report.
DRIVER="$OUT/driver"
mkdir -p "$DRIVER/src"
cat > "$DRIVER/Cargo.toml" <<EOF
[package]
name = "elm-gpu-bench"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
elm = { path = "$ROOT", features = ["cuda"] }
serde_json = "1"

# Not part of elm's workspace.
[workspace]
EOF
cp "$ROOT/scripts/gpu-bench-driver/main.rs" "$DRIVER/src/main.rs"

if [ -z "${BIN:-}" ]; then
  # Same dependency versions as elm itself (and works offline when elm's deps are cached).
  cp "$ROOT/Cargo.lock" "$DRIVER/Cargo.lock"
  echo "gpu-bench: building the elm driver ($PROFILE, --features cuda) ..." >&2
  cargo build --profile "$PROFILE" --quiet --manifest-path "$DRIVER/Cargo.toml"
  PROFILE_DIR="$PROFILE"; [ "$PROFILE" = dev ] && PROFILE_DIR=debug
  BIN="$CARGO_TARGET_DIR/$PROFILE_DIR/elm-gpu-bench"
fi
if [ -n "${BUILD_ONLY:-}" ]; then echo "gpu-bench: built $BIN" >&2; exit 0; fi

COMMON=(--prefill-len "$PREFILL_LEN" --decode-prompt-len "$DECODE_PROMPT_LEN" --steps "$STEPS"
        --batches "$BATCHES" --reps "$REPS" --tf32 "$TF32")
mkdir -p "$OUT"
for m in $MODELS; do
  echo "gpu-bench: $m: elm ..." >&2
  "$BIN" --model "$m" --ordinal "$ORDINAL" "${COMMON[@]}" > "$OUT/elm-$m.json"
  echo "gpu-bench: $m: torch eager ..." >&2
  python3 "$ROOT/scripts/torch_ref_bench.py" --model "$m" --device "cuda:$ORDINAL" "${COMMON[@]}" \
    > "$OUT/torch-$m.json"
done

python3 - "$OUT" $MODELS <<'EOF'
import json, sys
out, models = sys.argv[1], sys.argv[2:]
rows = []
for m in models:
    e = json.load(open(f"{out}/elm-{m}.json"))
    t = json.load(open(f"{out}/torch-{m}.json"))
    rows.append((m, f"prefill {e['prefill_len']} tok (b1)", e["prefill_tok_s"], t["prefill_tok_s"]))
    td = {d["batch"]: d for d in t["decode"]}
    for d in e["decode"]:
        rows.append((m, f"decode b{d['batch']}", d["tok_s"], td[d["batch"]]["tok_s"]))
    print(f"# {m}: elm on {e['device']} (tf32={e['tf32']}), reference {t['impl']} on {t['device']}")
print(f"{'model':<14} {'measurement':<24} {'elm tok/s':>12} {'torch tok/s':>12} {'elm/torch':>10}")
for m, what, a, b in rows:
    print(f"{m:<14} {what:<24} {a:>12.1f} {b:>12.1f} {a / b:>10.2f}")
summary = [dict(model=m, measurement=w, elm_tok_s=a, torch_tok_s=b, ratio=a / b) for m, w, a, b in rows]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(f"(json: {out}/summary.json)")
EOF
