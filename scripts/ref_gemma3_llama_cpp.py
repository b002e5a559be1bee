#!/usr/bin/env python3
"""llama.cpp's view of the real Gemma 3 270M Q4_K_M file (run once; CI never runs it).

Writes tests/fixtures/gemma3/llama_cpp_ref.json with llama-cpp-python on
models/gemma-3-270m-q4_k_m.gguf (2 threads, n_ctx 2048):
  tokenizer  token ids of a corpus (GSM8K questions and answers, HumanEval prompts, unicode,
             emoji, runs of spaces / tabs / newlines, digits, text that needs byte fallback),
             `tokenize(text.encode(), add_bos=True, special=True)`, and each id's piece;
  logits     for 8 prompts (one longer than the 512-token sliding window): the prompt's ids and
             the last position's 5 largest logits (id, value);
  greedy     for 4 prompts: 32 greedy tokens (argmax of llama.cpp's logits each step) and the
             top-2 logit margin of each step (how near a tie the choice was).
Usage: python3 scripts/ref_gemma3_llama_cpp.py   (pip install llama-cpp-python)
"""
import json
import os

import numpy as np
from llama_cpp import Llama, __version__ as llama_cpp_version

ROOT = os.path.join(os.path.dirname(__file__), "..")
MODEL = os.path.join(os.environ.get("ELM_MODELS_DIR", os.path.join(ROOT, "models")),
                     "gemma-3-270m-q4_k_m.gguf")
OUT = os.path.join(ROOT, "tests", "fixtures", "gemma3", "llama_cpp_ref.json")


def jsonl(path, n):
    with open(path) as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


gsm = jsonl(os.path.join(ROOT, "data", "gsm8k", "test.jsonl"), 6)
he_path = os.path.join(ROOT, "data", "humaneval", "HumanEval.jsonl")
humaneval = jsonl(he_path, 3) if os.path.exists(he_path) else []

corpus = [
    "12345 6789", "héllo wörld 你好 🙂", "a   b\n\n\tc", 'fn main() { println!("hi"); }',
    "Hello, world!", "  leading and trailing   ", "I'm sure they'll say we've done it, isn't it?",
    "line1\r\nline2\n\n\n", "ÅÉÎ ß ø Ωμέγα Привет мир مرحبا", "👍🏽 family: 👨\u200d👩\u200d👧",
    "x = 3.14159e-10; y = 1_000_000", "", " ", "\t\t", "\t\t\tindented\n\t\tless", " " * 40 + "x",
    "\n" * 40 + "y", "a\u0001b\u0007c \ue000 \U0010fffd", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀𓁿", "0.000001 1,234,567 3/4 10%",
    "<start_of_turn>user\nhi<end_of_turn>\n", "<b>bold</b> <table><tr><td>1</td></tr></table>",
]
corpus += [g["question"] for g in gsm] + [g["answer"] for g in gsm]
corpus += [p["prompt"] for p in humaneval]

llm = Llama(model_path=MODEL, n_ctx=2048, n_threads=2, n_batch=512, logits_all=True,
            verbose=False, seed=0)
tok = lambda s: llm.tokenize(s.encode("utf-8"), add_bos=True, special=True)
fixture = {"llama_cpp_python": llama_cpp_version, "model": os.path.basename(MODEL),
           "tokenizer": [{"text": s, "ids": tok(s)} for s in corpus]}


def last_logits(ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[len(ids) - 1], dtype=np.float32)


long_prompt = " ".join(g["question"] + " " + g["answer"] for g in jsonl(
    os.path.join(ROOT, "data", "gsm8k", "train.jsonl"), 8))
prompts = [
    "The capital of France is", "def fibonacci(n):", "Question: " + gsm[0]["question"] + "\nAnswer:",
    "1, 2, 3, 4, 5,", "Once upon a time", "日本の首都は", "The quick brown fox", long_prompt,
]
fixture["logits"] = []
for p in prompts:
    ids = tok(p)
    z = last_logits(ids)
    top = np.argsort(-z, kind="stable")[:5]
    fixture["logits"].append({"prompt": p, "ids": ids,
                              "top5": [[int(i), float(z[i])] for i in top]})
    print(len(ids), "tokens; top", [int(i) for i in top])
assert max(len(x["ids"]) for x in fixture["logits"]) > 512, "one prompt must pass the window"

fixture["greedy"] = []
for p in prompts[:4]:
    ids = tok(p)
    llm.reset()
    llm.eval(ids)
    out, margins = [], []
    for _ in range(32):
        z = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top2 = np.sort(z)[-2:]
        nxt = int(np.argmax(z))
        out.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        llm.eval([nxt])
    fixture["greedy"].append({"prompt": p, "ids": ids, "continuation": out, "margins": margins,
                              "text": llm.detokenize(out).decode("utf-8", "replace")})
    print(repr(fixture["greedy"][-1]["text"]))

with open(OUT, "w") as f:
    json.dump(fixture, f, ensure_ascii=False)
    f.write("\n")
print(OUT, os.path.getsize(OUT), "bytes")
