"""The Python snippets of the README and of docs/ run as written (each in a fresh namespace), so
an example a reader copies cannot rot. Rust snippets are doc-tests and shell snippets are parsed
by tests/docs.rs."""

import importlib.util
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def snippets():
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text[: m.start()].count("\n") + 1
            yield pytest.param(m.group(1), id=f"{page.relative_to(ROOT)}:{line}")


@pytest.mark.parametrize("code", list(snippets()))
def test_snippet_runs(code):
    # As tests/test_torch.py: a PyTorch snippet skips where PyTorch is not installed, unless
    # ELM_REQUIRE_TORCH=1 (scripts/python-test.sh) makes its absence a failure.
    if re.search(r"^\s*(import|from) torch\b", code, re.M) and importlib.util.find_spec("torch") is None:
        if os.environ.get("ELM_REQUIRE_TORCH") != "1":
            pytest.skip("PyTorch is not installed")
    exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})


def test_the_pages_have_python_snippets():
    assert len(list(snippets())) >= 2
