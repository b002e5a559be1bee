#!/usr/bin/env bash
# Runs on a GPU machine with the bundle of scripts/gpu-bundle.sh in .gpu/: the CUDA tests
# (every kernel, tiny Llama/Qwen2/Gemma 3 and, when models/ holds it, SmolLM2 logits and greedy
# continuations against the CPU) and scripts/gpu-bench.sh (ours vs PyTorch eager on that GPU).
# Writes cuda-test.log, the bench JSONs and gpu-bench.md under $OUT (default target/gpu-check).
# SKIP_TESTS=1 / SKIP_BENCH=1 leave a part out.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/target/gpu-check}"; mkdir -p "$OUT"
[ -e .gpu/lib/libopenblas.so.0 ] || xz -dk .gpu/lib/libopenblas.so.0.xz
# The test binary finds tests/fixtures through the path it was built at.
built_at=$(cat .gpu/built_at 2>/dev/null || true)
[ -n "$built_at" ] && [ ! -e "$built_at" ] && mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
# cudarc's cuda-12080 bindings dlopen libnvrtc.so / libcublas.so / libcublasLt.so (unversioned
# names among others); a CUDA 13 toolkit has only versioned files, so link them by that name.
mkdir -p /tmp/elm-cuda-libs; dirs=""
for n in nvrtc cublas cublasLt; do
  f=$(ls /usr/local/cuda/lib64/lib$n.so.* 2>/dev/null | sort -V | tail -1)
  [ -n "$f" ] || f=$(find /usr/local /opt /usr/lib -name "lib$n.so*" -type f 2>/dev/null | grep -v stub | sort -V | tail -1)
  echo "lib$n -> ${f:-not found}"
  [ -n "$f" ] && ln -sf "$f" /tmp/elm-cuda-libs/lib$n.so && dirs="$dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$PWD/.gpu/lib:/tmp/elm-cuda-libs$dirs:${LD_LIBRARY_PATH:-}"
export ELM_MODELS_DIR="${ELM_MODELS_DIR:-$PWD/models}"
rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== CUDA tests"
  timeout 300 .gpu/cuda-test --test-threads=1 --nocapture > "$OUT/cuda-test.log" 2>&1 || rc=1
  grep -E "^test result|FAILED|panicked|skipped" "$OUT/cuda-test.log"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  echo "== gpu-bench"
  BIN="$PWD/.gpu/elm-gpu-bench" OUT="$OUT" timeout 300 bash scripts/gpu-bench.sh > "$OUT/gpu-bench.txt" 2>&1 || rc=1
  tail -12 "$OUT/gpu-bench.txt"
  rm -rf "$OUT/driver"
fi
exit $rc
