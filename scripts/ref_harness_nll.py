#!/usr/bin/env python3
"""Independent reference for the NLL tasks (tests/eval_nll.rs; run once, CI never runs it).

llama.cpp (llama-cpp-python) scores the same GGUF with lm-evaluation-harness's rule for a
log-likelihood request, written here from the harness's `_encode_pair`: the context's trailing
whitespace moves onto the continuation, `context + continuation` is encoded once, and the
scored tokens are those after the first `len(encode(context))`. Tokenization is llama.cpp's own
(GGUF vocabulary, special tokens parsed), the chat template is the GGUF's own Jinja template
rendered by jinja2, the log-softmax is taken in float64 here. Nothing of the Rust crate is used.

Tasks: humaneval-nll (all 164 problems: prompt -> canonical_solution) and gsm8k-nll (the first
100 test problems: chat prompt of the question -> answer + "<|im_end|>\\n", the continuation
`elm eval` and `elm train` use).
Output: tests/fixtures/eval/harness_nll_smollm2.json
Usage: python3 scripts/ref_harness_nll.py [MODEL.gguf]   (pip install llama-cpp-python numpy jinja2)
"""
import hashlib
import json
import os
import sys

import jinja2
import numpy as np
from llama_cpp import Llama

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.environ.get("ELM_MODELS_DIR", os.path.join(ROOT, "models")), "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "fixtures", "eval", "harness_nll_smollm2.json")
GSM8K_N = 100
ANSWER_SUFFIX = "<|im_end|>\n"

llm = Llama(model_path=MODEL, n_ctx=2048, n_batch=2048, logits_all=True, n_threads=os.cpu_count(),
            verbose=False)


def encode(text):
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def harness_pair(context, continuation):
    """lm-evaluation-harness `TemplateLM._encode_pair`."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(context + continuation)
    n_context = len(encode(context))
    return whole, n_context


def score(context, continuation):
    tokens, n_context = harness_pair(context, continuation)
    llm.reset()
    llm.eval(tokens)
    logits = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    # Row t predicts token t + 1.
    rows = logits[n_context - 1: len(tokens) - 1]
    m = rows.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True)))[:, 0]
    targets = np.asarray(tokens[n_context:])
    nll = lse - rows[np.arange(len(targets)), targets]
    return {"tokens": len(tokens), "first_scored": n_context, "nll_sum": float(nll.sum()),
            "scored": int(len(targets))}


template = jinja2.Environment().from_string(llm.metadata["tokenizer.chat_template"])


def chat_prompt(question):
    return template.render(messages=[{"role": "user", "content": question}], add_generation_prompt=True)


items = []
for line in open(os.path.join(ROOT, "data", "humaneval", "HumanEval.jsonl")):
    p = json.loads(line)
    items.append({"task": "humaneval-nll", "id": p["task_id"], **score(p["prompt"], p["canonical_solution"])})
with open(os.path.join(ROOT, "data", "gsm8k", "test.jsonl")) as f:
    for i, line in zip(range(GSM8K_N), f):
        e = json.loads(line)
        items.append({"task": "gsm8k-nll", "id": str(i),
                      **score(chat_prompt(e["question"]), e["answer"] + ANSWER_SUFFIX)})

summary = {}
for task in ("humaneval-nll", "gsm8k-nll"):
    rows = [r for r in items if r["task"] == task]
    summary[task] = {"n": len(rows), "nll_per_token": sum(r["nll_sum"] for r in rows) / sum(r["scored"] for r in rows)}
sha = hashlib.sha256(open(MODEL, "rb").read()).hexdigest()
out = {"reference": "llama-cpp-python " + __import__("llama_cpp").__version__ + ", lm-evaluation-harness split",
       "model": os.path.basename(MODEL), "model_sha256": sha, "summary": summary, "items": items}
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump(out, f, indent=0)
print(json.dumps(summary))
