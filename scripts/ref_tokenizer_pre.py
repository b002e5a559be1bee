#!/usr/bin/env python3
"""Reference ids for the GGUF pre-tokenizers `llama-bpe` (Llama 3) and `qwen2` (run once; CI never runs it).

There is no Llama-3 or Qwen2 GGUF here, so the SmolLM2 vocabulary and merges stand in: what is
tested is the split regex chosen by `tokenizer.ggml.pre`, which decides how text is cut before
the (file's own) BPE merges apply. Two references, asserted equal on every string:
  A. the llama.cpp port of scripts/ref_tokenizer.py with llama.cpp's regex for the type
     (LLAMA_VOCAB_PRE_TYPE_LLAMA3: digits in runs of 1-3; QWEN2: single digits), Python `regex`;
  B. transformers' GGUF converter (5.23), whose split regexes for these types come from the
     HF tokenizer.json files of Llama 3 / Qwen2.
Writes tests/fixtures/io/tokenizer_pre_ref.json.
Usage: ELM_MODELS_DIR=/work/models python3 scripts/ref_tokenizer_pre.py
"""
import json
import os

import ref_tokenizer
from ref_tokenizer import TEXTS, encode_llama_cpp, merges, token_type, tokens
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

# llama.cpp's regexes (llama-vocab.cpp) for the two pre-tokenizer types.
CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA_CPP = {
    "llama-bpe": CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + REST,
    "qwen2": CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + REST,
}
EXTRA = [
    "1234567 89 0",
    "I'M SURE THEY'LL, WE'VE; IT'S",
    "tabs\t\tand\n\n\nnewlines \n x",
    "trailing spaces   \n  next",
    "a+b=c; ++i; x->y",
]

# SmolLM2 has no merges between digits, so digit runs would tokenize alike under every split.
# These few (appended last, i.e. lowest rank) make `\p{N}{1,3}` vs `\p{N}` visible. The Rust
# test appends the same to the file it writes.
EXTRA_MERGES = ["1 2", "12 3", "4 5", "45 6", "7 8", "Ġ 1"]
for m in EXTRA_MERGES:
    merged = m.replace(" ", "")
    assert merged not in ref_tokenizer.vocab, merged
    ref_tokenizer.vocab[merged] = len(tokens)
    ref_tokenizer.ranks[tuple(m.split(" "))] = len(merges)
    tokens = tokens + [merged]
    token_type = list(token_type) + [1]
    merges = merges + [m]

out = {"extra_merges": EXTRA_MERGES}
for pre, split in LLAMA_CPP.items():
    tdict = {"tokenizer_type": "gpt2", "pre_tokenizer_type": pre, "tokens": tokens,
             "token_type": token_type, "merges": merges, "bos_token_id": 1, "eos_token_id": 2,
             "unk_token_id": 0, "pad_token_id": 2}
    hf, _ = convert_gguf_tokenizer("llama", tdict)
    cases = []
    for t in TEXTS + EXTRA:
        a = encode_llama_cpp(t, [split])
        b = hf.encode(t, add_special_tokens=False).ids
        assert a == b, (pre, t, a, b)
        cases.append({"text": t, "ids": a})
    out[pre] = cases

path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "io", "tokenizer_pre_ref.json")
with open(path, "w") as fh:
    json.dump(out, fh, indent=1, ensure_ascii=False)
print("wrote", path)
for pre in LLAMA_CPP:
    print(pre, [c["ids"] for c in out[pre] if c["text"] == "1234567 89 0"])
