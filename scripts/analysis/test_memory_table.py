"""memory_table.table against rows worked by hand."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from memory_table import table  # noqa: E402


def row(label, total, peak, parts):
    return {"label": label, "peak_rss_bytes": peak,
            "estimate": {"total_bytes": total, "held": parts[:1],
                         "phases": [{"parts": parts[1:]}]}}


def test_ratio_largest_part_and_worst_deviation():
    mib = 2**20
    rows = [row("a", 120 * mib, 100 * mib, [{"name": "weights", "bytes": 80 * mib},
                                            {"name": "kv", "bytes": 30 * mib}]),
            row("b", 90 * mib, 100 * mib, [{"name": "weights", "bytes": 10 * mib},
                                           {"name": "acts", "bytes": 60 * mib}])]
    lines, worst = table(rows)
    assert lines[2] == "| `a` | 120 | weights 80 | 100 | 1.20 |"
    assert lines[3] == "| `b` | 90 | acts 60 | 100 | 0.90 |"
    assert abs(worst - 0.2) < 1e-12
    assert [r["ratio"] for r in rows] == [1.2, 0.9]
