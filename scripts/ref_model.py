#!/usr/bin/env python3
"""Reference logits + greedy continuations of SmolLM2-135M-Instruct (Q4_1 GGUF) for tests/model_real.rs.

Independent of the Rust code: weights are dequantized by the PyPI `gguf` package
(`gguf.quants.dequantize`) and the Llama forward is plain numpy in float64, applied to the
RAW GGUF Q/K weights with llama.cpp's interleaved ("NORM") RoPE — so the Rust loader's
un-permutation to HF half-split order is checked too.

Prompt token ids come from the `transformers` GGUF tokenizer conversion and are stored in the
fixture, so the Rust test does not depend on any tokenizer.

Usage: python3 scripts/ref_model.py [MODEL.gguf] [OUT.json]
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

MODEL = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/model/smollm2_logits.json"
TOP_K = 20
N_GREEDY = 32

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n",
]


def field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def load(path):
    r = GGUFReader(path)
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF ne[0] is the fastest axis
        w[t.name] = a.reshape(shape)
    cfg = dict(
        n_layer=int(field(r, "llama.block_count")),
        n_head=int(field(r, "llama.attention.head_count")),
        n_kv=int(field(r, "llama.attention.head_count_kv")),
        theta=float(field(r, "llama.rope.freq_base")),
        eps=float(field(r, "llama.attention.layer_norm_rms_epsilon")),
    )
    return w, cfg


def rms_norm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope_interleaved(x, pos, theta):
    """llama.cpp NORM rope: rotates adjacent pairs (2i, 2i+1). x: [T, H, D]."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [D/2]
    ang = pos[:, None] * inv[None, :]  # [T, D/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x1 * c + x0 * s
    return out


class Model:
    def __init__(self, w, cfg):
        self.w, self.cfg = w, cfg
        self.emb = w["token_embd.weight"]  # [V, C]
        self.head = w.get("output.weight", self.emb)
        c = self.emb.shape[1]
        self.d = c // cfg["n_head"]

    def forward(self, tokens, cache):
        """Appends `tokens` to `cache` (list of (K, V) per layer); returns logits [T, V]."""
        cfg, w, d = self.cfg, self.w, self.d
        h, kv = cfg["n_head"], cfg["n_kv"]
        p0 = cache[0][0].shape[0] if cache else 0
        t = len(tokens)
        pos = np.arange(p0, p0 + t, dtype=np.float64)
        x = self.emb[tokens]
        for l in range(cfg["n_layer"]):
            p = f"blk.{l}."
            xn = rms_norm(x, w[p + "attn_norm.weight"], cfg["eps"])
            q = (xn @ w[p + "attn_q.weight"].T).reshape(t, h, d)
            k = (xn @ w[p + "attn_k.weight"].T).reshape(t, kv, d)
            v = (xn @ w[p + "attn_v.weight"].T).reshape(t, kv, d)
            q, k = rope_interleaved(q, pos, cfg["theta"]), rope_interleaved(k, pos, cfg["theta"])
            if len(cache) <= l:
                cache.append((k, v))
            else:
                cache[l] = (np.concatenate([cache[l][0], k]), np.concatenate([cache[l][1], v]))
            K, V = cache[l]
            n = K.shape[0]
            mask = np.arange(n)[None, :] <= (p0 + np.arange(t))[:, None]  # [T, N] causal
            out = np.empty((t, h, d))
            for hi in range(h):
                kh = hi // (h // kv)
                s = q[:, hi, :] @ K[:, kh, :].T / np.sqrt(d)
                s = np.where(mask, s, -np.inf)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                out[:, hi, :] = s @ V[:, kh, :]
            x = x + out.reshape(t, h * d) @ w[p + "attn_output.weight"].T
            xn = rms_norm(x, w[p + "ffn_norm.weight"], cfg["eps"])
            g = xn @ w[p + "ffn_gate.weight"].T
            u = xn @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        return rms_norm(x, w["output_norm.weight"], cfg["eps"]) @ self.head.T


def tokenize(prompts):
    """transformers' GGUF tokenizer converter (AutoTokenizer's gguf path needs torch)."""
    from tokenizers import Regex, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    r = GGUFReader(MODEL)
    f = lambda k: r.fields[k].contents()
    tdict = dict(tokenizer_type="gpt2", pre_tokenizer_type="smollm", tokens=f("tokenizer.ggml.tokens"),
                 token_type=f("tokenizer.ggml.token_type"), merges=f("tokenizer.ggml.merges"),
                 bos_token_id=1, eos_token_id=2, unk_token_id=0, pad_token_id=2)
    tok, _ = convert_gguf_tokenizer("llama", tdict)
    # llama.cpp's SMOLLM pre-tokenizer: digits split one by one, then the GPT-2 regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return [tok.encode(p, add_special_tokens=False).ids for p in prompts]


def main():
    w, cfg = load(MODEL)
    model = Model(w, cfg)
    cases = []
    for text, ids in zip(PROMPTS, tokenize(PROMPTS)):
        cache = []
        logits = model.forward(np.array(ids), cache)[-1]
        top = np.argsort(-logits)[:TOP_K]
        greedy, margins, step_logits = [], [], logits
        for _ in range(N_GREEDY):
            order = np.argsort(-step_logits)
            greedy.append(int(order[0]))
            margins.append(float(step_logits[order[0]] - step_logits[order[1]]))
            step_logits = model.forward(np.array([order[0]]), cache)[-1]
        cases.append(
            dict(
                text=text,
                tokens=[int(i) for i in ids],
                top_ids=[int(i) for i in top],
                top_logits=[float(logits[i]) for i in top],
                greedy=greedy,
                greedy_min_margin=min(margins),
            )
        )
        print(f"{text!r}: {len(ids)} tokens, top {top[:5]}, greedy margin {min(margins):.4f}", file=sys.stderr)
    meta = dict(
        model="SmolLM2-135M-Instruct.Q4_1.gguf",
        generator="scripts/ref_model.py (gguf.quants.dequantize + numpy float64, interleaved RoPE on raw GGUF Q/K)",
        top_k=TOP_K,
        n_greedy=N_GREEDY,
    )
    with open(OUT, "w") as f:
        json.dump(dict(meta=meta, cases=cases), f, indent=1)


if __name__ == "__main__":
    main()
