#!/usr/bin/env bash
# System needs of the project on a fresh Debian machine (as root): OpenBLAS + LAPACK for
# ndarray/ndarray-linalg, the default SmolLM2 checkpoint and HumanEval (data/humaneval/).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! dpkg -s libopenblas-dev >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev pkg-config >/dev/null
fi
bash scripts/fetch-smollm2.sh
bash scripts/fetch-humaneval.sh
