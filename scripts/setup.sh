#!/usr/bin/env bash
# System needs of the project on a fresh Debian machine (as root): OpenBLAS + LAPACK for
# ndarray/ndarray-linalg, bubblewrap (the HumanEval sandbox's boundary), libfiu's fiu-run (the
# fault-injection tests), python3-venv (the Python package's tests), the real checkpoints (SmolLM2 135M Q4_1, Gemma 3 270M Q4_K_M) and
# HumanEval (data/humaneval/).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for pkg in libopenblas-dev pkg-config bubblewrap fiu-utils python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
bash scripts/fetch-smollm2.sh
bash scripts/fetch-gemma3.sh
bash scripts/fetch-humaneval.sh
