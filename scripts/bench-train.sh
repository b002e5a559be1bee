#!/usr/bin/env bash
# Training speed against PyTorch on this CPU (issue 25), in one invocation and with the same
# threads: the ELM training step (distillation phase, CE phase, each with and without the
# teacher cache; examples/train_profile.rs), the LoRA SFT step, and PyTorch eager's same steps in f32 and bf16
# autocast (scripts/torch_train_ref.py, same shapes and supervised-token count). Prints one JSON
# object: both sides' tok/s and ours over theirs. Needs `torch` (TORCH_PY: a python that has it;
# default: a venv in target/torch-venv made on first use). Also writes the object to
# results/bench_train.json (OUT= to change), which docs/performance.md points to.
# The training steps, ours and PyTorch's, run in REPS rounds (default 3), both sides in every
# round, and each phase reports its median over the rounds: this VM's speed drifts by 10-30%
# over minutes, and a ratio of two single runs minutes apart carried that drift.
# About 9 minutes on 2 cores once built.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${THREADS:-2}"
steps="${STEPS:-4}"
reps="${REPS:-3}"
rounds=$(mktemp -d)
trap 'rm -rf "$rounds"' EXIT
py="${TORCH_PY:-}"
if [ -z "$py" ]; then
  py=target/torch-venv/bin/python
  if ! [ -x "$py" ] || ! "$py" -c "import torch" 2>/dev/null; then
    python3 -m venv target/torch-venv
    target/torch-venv/bin/pip install -q torch numpy >&2
  fi
fi
cargo build --release --example train_profile --example gemm_bench --bin elm >&2
model="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || bash scripts/fetch-smollm2.sh >&2
gemm=$(OPENBLAS_NUM_THREADS="$threads" RAYON_NUM_THREADS="$threads" target/release/examples/gemm_bench)
# OpenBLAS's threads are left to the example (one when our GEMM carries the large products).
export RAYON_NUM_THREADS="$threads"
# The same with glibc's default of returning freed blocks to the kernel (src/heap.rs).
glibc=$(ELM_KEEP_HEAP=0 target/release/examples/train_profile --steps "$steps" --json)
# The same on the linked BLAS for every product (OpenBLAS with a thread per core).
blas=$(ELM_GEMM=blas OPENBLAS_NUM_THREADS="$threads" target/release/examples/train_profile --steps "$steps" --json)
sup=$(echo "$glibc" | "$py" -c "import json,sys; print(round(json.load(sys.stdin)['supervised_tokens']))")
# Dense prefill of 256 tokens (f32 weights), ours and PyTorch's, f32 and bf16.
pre() { RAYON_NUM_THREADS="$threads" target/release/elm bench --model "$model" --prompt-len 256 --decode-steps 4 --json "$@"; }
p32=$(pre); pbf=$(pre --precision bf16 2>/dev/null || echo null)
# The evaluation's teacher-forced answer NLL over 300 GSM8K test problems (dense model).
nll=$(RAYON_NUM_THREADS="$threads" target/release/elm eval --model "$model" --task gsm8k-nll --limit 300 --json)
tpre() { "$py" scripts/torch_ref_bench.py --model smollm2-135m --device cpu --prefill-len 256 --batches 1 --steps 2 --reps 5 --threads "$threads" "$@"; }
tp32=$(tpre); tpbf=$(tpre --bf16)
ref() { "$py" scripts/torch_train_ref.py --threads "$threads" --steps "$steps" --supervised "$sup" "$@"; }
for r in $(seq "$reps"); do
  target/release/examples/train_profile --steps "$steps" --json > "$rounds/ours-$r.json"
  # bf16 mode where the CPU has AVX-512 BF16 (else null).
  target/release/examples/train_profile --steps "$steps" --precision bf16 --json 2>/dev/null \
    > "$rounds/bf16-$r.json" || echo null > "$rounds/bf16-$r.json"
  ref --dtype f32 > "$rounds/t32-$r.json"
  ref --dtype f32 --teacher-cache --phases distill,ce > "$rounds/t32c-$r.json"
  ref --dtype bf16 > "$rounds/tbf-$r.json"
  ref --dtype bf16 --teacher-cache --phases distill,ce > "$rounds/tbfc-$r.json"
done
"$py" scripts/analysis/bench_train.py "${OUT:-results/bench_train.json}" "${README:-}" "threads=$threads steps=$steps rounds=$reps" "$rounds" "$nll" "$p32" "$pbf" "$tp32" "$tpbf" "$gemm" "$blas" "$glibc"
