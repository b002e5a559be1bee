"""long_context.summarise and lines against rows worked by hand."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from long_context import lines, summarise, text  # noqa: E402


def row(binary, prefill, decode, kv, rss):
    return {"binary": binary, "model": "m.gguf", "file_bytes": 100_000_000, "target_tokens": 4096,
            "prompt_tokens": 3999, "prefill_tok_s": prefill, "decode_tok_s": decode,
            "kv_cache_bytes": kv, "peak_rss_bytes": rss}


def test_medians_per_binary_and_the_old_figures_beside_the_new():
    rows = [row("new", 100, 10, 4_000_000, 150_000_000), row("old", 90, 9, 8_000_000, 200_000_000),
            row("new", 300, 30, 4_000_000, 130_000_000), row("old", 70, 7, 8_000_000, 200_000_000),
            row("new", 200, 20, 4_000_000, 140_000_000)]
    summary = summarise(rows)
    new = next(s for s in summary if s["binary"] == "new")
    assert (new["reps"], new["prefill_tok_s"], new["decode_tok_s"]) == (3, 200, 20)
    assert new["peak_rss_bytes"] == 140_000_000
    table = lines(summary)
    assert table[2] == ("| m.gguf | 3999 | 200 (was 80) | 20.0 (was 8.0) | 4.0 (was 8.0) | 1000 "
                        "| 140.0 (was 200.0) | 1.40 |")
    assert "2/3 run(s)" in table[-1]


def test_the_prompt_text_has_the_words_asked_for():
    assert len(text(50).split()) == 50
