#!/usr/bin/env python3
"""Reference token ids for the SmolLM2 GGUF tokenizer (run once; CI never runs it).

Two independent references, asserted equal on every string:
  A. a from-scratch Python port of llama.cpp's BPE tokenizer for LLAMA_VOCAB_PRE_TYPE_SMOLLM:
     control tokens (token_type 3) split out first, then the two split regexes applied in
     sequence ("\\p{N}", then the GPT-2 regex; unmatched text kept), GPT-2 byte->unicode
     mapping, and rank-ordered BPE merges from tokenizer.ggml.merges;
  B. transformers' GGUF tokenizer converter (transformers.integrations.gguf), which builds a
     HF `tokenizers` BPE from the same metadata. transformers (5.23) has no split regex for
     pre "smollm" and falls back to the plain GPT-2 one (digit runs not split first); we set
     llama.cpp's SMOLLM split on it. Its ids without that fix are recorded under
     "transformers_default_ids": they agree on every string here, because the SmolLM2 merges
     contain no digit-digit or space-digit merges.
`AutoTokenizer.from_pretrained(dir, gguf_file=...)` itself needs torch (not installed), hence
the direct converter call. Chat prompts are rendered with jinja2 from the GGUF's
tokenizer.chat_template. Writes tests/fixtures/io/tokenizer_ref.json.
Usage: ELM_MODELS_DIR=/work/models python3 scripts/ref_tokenizer.py
"""
import json
import os

import gguf
import jinja2
import regex

models = os.environ.get("ELM_MODELS_DIR", os.path.join(os.path.dirname(__file__), "..", "models"))
r = gguf.GGUFReader(os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf"))
f = lambda k: r.fields[k].contents()
tokens, token_type, merges = f("tokenizer.ggml.tokens"), f("tokenizer.ggml.token_type"), f("tokenizer.ggml.merges")
assert f("tokenizer.ggml.model") == "gpt2" and f("tokenizer.ggml.pre") == "smollm"
vocab = {t: i for i, t in enumerate(tokens)}
ranks = {tuple(m.split(" ")): i for i, m in enumerate(merges)}
control = sorted((t for t, ty in zip(tokens, token_type) if ty == 3), key=len, reverse=True)

# --- A: llama.cpp port -------------------------------------------------------------------
SPLITS = [r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE = bytes_to_unicode()


def regex_split(pieces, pattern):
    out = []
    for p in pieces:
        last = 0
        for m in regex.finditer(pattern, p):
            if m.start() > last:
                out.append(p[last:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            last = m.end()
        if last < len(p):
            out.append(p[last:])
    return out


def bpe(word):
    syms = [BYTE[b] for b in word.encode("utf-8")]
    while len(syms) > 1:
        best = min(range(len(syms) - 1), key=lambda i: (ranks.get((syms[i], syms[i + 1]), 1 << 60), i))
        if (syms[best], syms[best + 1]) not in ranks:
            break
        syms[best:best + 2] = [syms[best] + syms[best + 1]]
    return [vocab[s] for s in syms]


def encode_llama_cpp(text, splits=SPLITS):
    frags = [(False, text)]
    for tok in control:
        nxt = []
        for special, s in frags:
            if special:
                nxt.append((special, s))
                continue
            parts = s.split(tok)
            for k, part in enumerate(parts):
                if part:
                    nxt.append((False, part))
                if k + 1 < len(parts):
                    nxt.append((True, tok))
        frags = nxt
    ids = []
    for special, s in frags:
        if special:
            ids.append(vocab[s])
            continue
        pieces = [s]
        for pat in splits:
            pieces = regex_split(pieces, pat)
        for w in pieces:
            ids.extend(bpe(w))
    return ids


TEXTS = [
    "12345 6789",
    "héllo wörld 你好 🙂",
    "a   b\n\n\tc",
    'fn main() { println!("hi"); }',
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Hello, world!",
    "  leading and trailing   ",
    "I'm sure they'll say we've done it, isn't it?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. #### 72",
    "line1\r\nline2\n\n\n",
    "ÅÉÎ ß ø Ωμέγα Привет мир مرحبا",
    "👍🏽 family: 👨‍👩‍👧",
    "x = 3.14159e-10; y = 1_000_000",
    "<|endoftext|>text<file_sep>more<|im_end|>",
    "",
    " ",
    "\t\t",
]


def main():
    # --- B: transformers' converter ------------------------------------------------------------
    from tokenizers import Regex, pre_tokenizers  # noqa: E402
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer  # noqa: E402

    tdict = {"tokenizer_type": "gpt2", "pre_tokenizer_type": "smollm", "tokens": tokens,
             "token_type": token_type, "merges": merges, "bos_token_id": 1, "eos_token_id": 2,
             "unk_token_id": 0, "pad_token_id": 2}
    hf_default, _ = convert_gguf_tokenizer("llama", tdict)
    hf_fixed, _ = convert_gguf_tokenizer("llama", tdict)
    hf_fixed.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLITS[0]), behavior="isolated"),
        pre_tokenizers.Split(Regex(SPLITS[1]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])

    cases = []
    for t in TEXTS:
        a = encode_llama_cpp(t)
        b = hf_fixed.encode(t, add_special_tokens=False).ids
        assert a == b, (t, a, b)
        assert hf_fixed.decode(a, skip_special_tokens=False) == t, t
        cases.append({"text": t, "ids": a, "transformers_default_ids": hf_default.encode(t, add_special_tokens=False).ids})

    template = jinja2.Environment().from_string(f("tokenizer.chat_template"))
    CHATS = [
        ([("user", "What is 2+2?")], True),
        ([("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")], True),
        ([("system", "You are terse."), ("user", "12 * 7 = ?")], False),
        ([("system", "S"), ("user", "héllo 🙂")], True),
    ]
    chats = []
    for msgs, gen in CHATS:
        text = template.render(messages=[{"role": ro, "content": c} for ro, c in msgs], add_generation_prompt=gen)
        ids = encode_llama_cpp(text)
        assert ids == hf_fixed.encode(text, add_special_tokens=False).ids
        chats.append({"messages": msgs, "add_generation_prompt": gen, "rendered": text, "ids": ids})

    out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "io", "tokenizer_ref.json")
    with open(out, "w") as fh:
        json.dump({"bos": 1, "eos": 2, "control_tokens": control, "cases": cases, "chats": chats}, fh,
                  indent=1, ensure_ascii=False)
    print("wrote", out)
    for c in cases[:3]:
        print(repr(c["text"]), c["ids"], "(transformers default:", c["transformers_default_ids"], ")")


if __name__ == "__main__":
    main()
