#!/usr/bin/env bash
# README table "fault -> what happens", regenerated from the fault-injection test's own results:
# runs tests/io_faults.rs (libfiu's fiu-run makes fsync, rename and open fail, always or at random,
# and a size-limited tmpfs inside bubblewrap fills the disk, during `elm train`, `elm lora` and
# `elm search --method gppo|enumerate`) with ELM_FAULT_REPORT set, and rewrites the README block
# between <!-- faults:begin --> and <!-- faults:end -->. Random faults land on different saves in
# every run, so the table shows what this run hit.
#   bash scripts/fault-table.sh [README.md]
set -euo pipefail
cd "$(dirname "$0")/.."
readme=${1:-docs/faults.md}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
ELM_FAULT_REPORT="$out" cargo test --quiet --test io_faults >&2
python3 - "$out" "$readme" <<'PY'
import glob, json, os, re, sys
out, readme = sys.argv[1], sys.argv[2]
rows = [r for f in sorted(glob.glob(out + "/*.json")) for r in json.load(open(f))]
def short(msg):
    # Paths of the test's temporary directory reduced to the run directory's own names.
    msg = re.sub(r"/\S*?/(Train|Lora|Gppo|Enumerate)-(case|disk)-\d+/(run/)?", "OUT/", msg or "")
    return re.sub(r"/\S*?-faults/", "", msg).replace("|", "\\|")
lines = ["| command | fault (libfiu `fiu-run -x -c`, or a full tmpfs) | what the run did | then | finished run vs uninterrupted run |",
         "|---|---|---|---|---|"]
for r in rows:
    did = "exit 1, JSON error `" + short(r["error"]["message"]) + "`" if r["failed"] else "finished (fault not hit)"
    same = "bit-identical, no temporary left" if r["result_equals_uninterrupted_run"] and r["temporaries_left"] == 0 else "DIFFERS"
    lines.append(f"| `{r['command']}` | `{r['fault']}` | {did} | {r['recovery']} | {same} |")
sys.path.insert(0, "scripts")
from readme_block import rewrite
rewrite(readme, "faults", ["*Written by `bash scripts/fault-table.sh` from `tests/io_faults.rs`'s results.*", ""] + lines)
print(f"{len(rows)} cases written to {readme}")
PY
