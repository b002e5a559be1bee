"""The README blocks that scripts write: `rewrite(readme, name, lines)` replaces what stands
between `<!-- name:begin -->` and `<!-- name:end -->` with `lines` (through a temporary file and
a rename, so an interrupted run leaves the old README whole). Figures in the README come from
the scripts that measure them, never from a hand edit."""

import os
import sys


def rewrite(readme, name, lines):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = open(readme).read()
    if begin not in text or end not in text:
        sys.exit(f"{readme}: no {begin} ... {end} block to rewrite")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(readme + ".tmp", "w") as f:
        f.write(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)
    os.replace(readme + ".tmp", readme)
