"""The analysis of `scripts/memory-table.sh`: each measured command's memory estimate (from its
`--json` report) against its peak RSS (from `/usr/bin/time`), as a table in
`results/memory/memory.{json,md}` and the `memory` block of a docs page. Exits 1 when an estimate
is more than 25% off its peak.

Usage: memory_table.py ROWS.jsonl PAGE.md (as memory-table.sh calls it)."""

import json
import os
import sys

# An estimate further than this from its measured peak fails the script.
TOLERANCE = 0.25


def mib(b):
    return f"{b / 2**20:,.0f}"


def table(rows):
    """The table's lines and the largest |estimate / peak − 1|; sets each row's `ratio`."""
    lines = ["| command | estimate (MiB) | largest part of it | measured peak RSS (MiB) | estimate / peak |",
             "|---|---|---|---|---|"]
    worst = 0.0
    for r in rows:
        e = r["estimate"]
        parts = e["held"] + [p for ph in e["phases"] for p in ph["parts"]]
        big = max(parts, key=lambda p: p["bytes"])
        ratio = e["total_bytes"] / r["peak_rss_bytes"]
        r["ratio"] = ratio
        worst = max(worst, abs(ratio - 1))
        lines.append(f"| `{r['label']}` | {mib(e['total_bytes'])} | {big['name']} {mib(big['bytes'])} | "
                     f"{mib(r['peak_rss_bytes'])} | {ratio:.2f} |")
    return lines, worst


def main(argv):
    rows_path, page = argv[1:3]
    rows = [json.loads(line) for line in open(rows_path)]
    lines, worst = table(rows)
    json.dump(rows, open("results/memory/memory.json", "w"), indent=1)
    open("results/memory/memory.md", "w").write("\n".join(lines) + "\n")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from readme_block import rewrite

    rewrite(page, "memory", ["*Written by `bash scripts/memory-table.sh` (real model, release build; peak RSS "
                             "from `/usr/bin/time -f %M`).*", ""] + lines)
    print(f"{len(rows)} commands; largest deviation of an estimate from its peak: {worst:.0%}")
    return 1 if worst > TOLERANCE else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
