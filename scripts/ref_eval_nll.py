#!/usr/bin/env python3
"""Reference teacher-forced NLL for tests/eval_nll.rs (run once; CI never runs it).

The tiny HF Llama of tests/fixtures/io/hf_tiny_llama (its exact f32 tensors are in
hf_tiny_llama_expected.safetensors) run by a plain float64 numpy forward written here from the
Llama definition (RMSNorm, half-split RoPE, grouped-query causal attention, SwiGLU, tied head),
then -log softmax of each scored next token. Sequences have different lengths and different
first scored positions, so the Rust batched path (padding, sorting, gathering) is exercised.
Output: tests/fixtures/eval/nll_ref.json
Usage: python3 scripts/ref_eval_nll.py   (pip install numpy safetensors)
"""
import json
import os

import numpy as np
from safetensors.numpy import load_file

ROOT = os.path.join(os.path.dirname(__file__), "..")
IO = os.path.join(ROOT, "tests", "fixtures", "io")
OUT = os.path.join(ROOT, "tests", "fixtures", "eval", "nll_ref.json")

cfg = json.load(open(os.path.join(IO, "hf_tiny_llama", "config.json")))
w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(IO, "hf_tiny_llama_expected.safetensors")).items()}
H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
EPS, THETA = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]


def rms(x, g):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * g


def rope(x):
    """HF half-split RoPE; x: [T, heads, D]."""
    t = np.arange(x.shape[0])[:, None]
    inv = THETA ** (-np.arange(0, D, 2) / D)
    ang = t * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., : D // 2], x[..., D // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def logits(tokens):
    x = w["model.embed_tokens.weight"][tokens]
    T = len(tokens)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, D))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, D))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, D)
        out = np.zeros((T, H, D))
        for hh in range(H):
            g = hh // (H // KV)
            s = q[:, hh] @ k[:, g].T / np.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(T, H * D) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T


rng = np.random.default_rng(12)
items = []
for i, (length, first) in enumerate([(17, 9), (5, 1), (23, 20), (17, 3), (11, 6), (2, 1)]):
    tokens = rng.integers(0, cfg["vocab_size"], size=length).tolist()
    lg = logits(tokens)
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    nll = [float(lse[t - 1] - lg[t - 1, tokens[t]]) for t in range(first, length)]
    items.append({"id": str(i), "tokens": tokens, "first_scored": first, "nll_sum": sum(nll), "count": len(nll)})
os.makedirs(os.path.dirname(OUT), exist_ok=True)
json.dump({"model": "tests/fixtures/io/hf_tiny_llama", "items": items}, open(OUT, "w"), indent=1)
print("wrote", OUT)
