#!/usr/bin/env python3
"""Reference GSM8K answer extraction for tests/eval_answer.rs (run once; CI never runs it).

Python's own `re` applies lm-evaluation-harness's gsm8k (v3) rules: the strict-match and
flexible-extract regex filters (findall, group_select, non-empty group, strip, "[invalid]"
fallback, take_first) and exact_match with regexes_to_ignore [",", "\\$", "(?s).*#### ", "\\.$"]
and ignore_case. Output: tests/fixtures/eval/gsm8k_extract_ref.json
"""
import json
import os
import re

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "eval", "gsm8k_extract_ref.json")
STRICT = (r"#### (\-?[0-9\.\,]+)", 0)
FLEX = (r"(-?[$0-9.,]{2,})|(-?[0-9]+)", -1)
IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]


def regex_filter(resp, pattern, group_select):
    match = re.findall(pattern, resp)
    if not match:
        return "[invalid]"
    match = match[group_select]
    if isinstance(match, tuple):
        match = [m for m in match if m]
        match = match[0] if match else "[invalid]"
    return match.strip()


def norm(s):
    for r in IGNORE:
        s = re.sub(r, "", s)
    return s.lower()


REF = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nSo 48+24 = <<48+24=72>>72 clips.\n#### 1,072"
RESPONSES = [
    "#### 1,072", "#### 1072", "The answer is 1,072.", "so $1,072.00 in total", "#### -3", "x #### -", "####1072",
    "It is 1072 dollars", "1072 apples and 5 pears", "costs $1,072.", "-1072", "we get -5 then 1,072.\n",
    "#### 10 72", "#### 1.072", "no number here", "answer: 1072!!!", "1,0,7,2", "... 1072...", "1072.",
    "#### 5\n#### 1072", "####  1072", "1e3 or 1072", "x=7 y=1072$", "1 072", "-$1,072", "a-1072", "5 - 3 = 2\nSo 1072",
    "Ünïcode 1072 ✓", "1072\n\n", "#### 1,072.", "total: 1072 km/h",
]
REFS = [REF, "#### 18", "#### -3", "#### 0.5", "#### 1,000", "blah #### 5 more\n#### 7"]
cases = []
for ref in REFS:
    for resp in RESPONSES + ["18", "$18", "18.00", "-3", "0.5", ".5", "1000", "7", "5"]:
        s, f = regex_filter(resp, *STRICT), regex_filter(resp, *FLEX)
        cases.append({"response": resp, "reference": ref, "strict": s, "flexible": f,
                      "strict_correct": norm(s) == norm(ref), "flexible_correct": norm(f) == norm(ref)})
os.makedirs(os.path.dirname(OUT), exist_ok=True)
json.dump({"cases": cases}, open(OUT, "w"), indent=0, ensure_ascii=False)
print("wrote", OUT, len(cases), "cases")
