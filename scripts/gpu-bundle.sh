#!/usr/bin/env bash
# Builds what a GPU machine without a Rust toolchain needs to run elm's CUDA checks, into .gpu/
# (git-ignored through .git/info/exclude): the CUDA test binary and the gpu-bench driver
# (release, --features cuda, stripped), the system OpenBLAS they link (xz-compressed) with its
# Fortran runtime, and scripts/gpu-check.sh. On the GPU machine, from a checkout of the same
# tree: `bash scripts/gpu-check.sh` (results under $OUT). The real checkpoint (98 MB) does not
# travel in the bundle: place it in models/ there (or set ELM_MODELS_DIR) for the SmolLM2 tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# A worktree's .git is a file: ask git where its exclude file is.
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.gpu/' "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo '/.gpu/' >> "$exclude"; }
test_bin=$(cargo test --release --features cuda --test cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c "import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m['target']['name'] == 'cuda' and m.get('executable'): print(m['executable'])")
BUILD_ONLY=1 PROFILE=release bash scripts/gpu-bench.sh >&2
rm -rf .gpu && mkdir -p .gpu/lib
strip -o .gpu/cuda-test "$test_bin"
strip -o .gpu/elm-gpu-bench "${CARGO_TARGET_DIR:-target}/release/elm-gpu-bench"
for l in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
  cp -L "$(ldconfig -p | awk -v l="$l" '$1 == l {print $NF; exit}')" .gpu/lib/
done
xz -T2 -6 .gpu/lib/libopenblas.so.0
pwd > .gpu/built_at  # the test binary's CARGO_MANIFEST_DIR (where it looks for tests/fixtures)
du -sh .gpu
