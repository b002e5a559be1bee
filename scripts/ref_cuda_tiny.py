#!/usr/bin/env python3
"""Writes tests/fixtures/cuda/tiny_models.json: two tiny seeded random decoders (a tied Llama and a
Qwen2 with q/k/v bias and an untied LM head), prompts, and a float64 numpy forward's last-position
logits and greedy continuations. tests/cuda.rs checks its own CPU reference (always) and the GPU
path (with a device) against these numbers.

The forward is written from the HF modelling code: RMSNorm, half-split RoPE (rotate_half),
grouped-query causal attention with softmax(q k^T / sqrt(D)), SwiGLU MLP, final norm, LM head.
Run once: python3 scripts/ref_cuda_tiny.py
"""
import json
import os

import numpy as np

STEPS = 4  # greedy continuation length


def make_model(rng, arch):
    cfg = dict(arch=arch, vocab_size=40, hidden_size=24, intermediate_size=36, num_layers=2,
               num_heads=4, num_kv_heads=2, head_dim=8,
               rope_theta=10000.0 if arch == "llama" else 1000000.0,
               rms_norm_eps=1e-5 if arch == "llama" else 1e-6,
               max_position_embeddings=64, tie_word_embeddings=arch == "llama",
               attention_bias=arch == "qwen2", bos_token_id=1, eos_token_id=2)
    c, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, kvd = cfg["num_heads"] * cfg["head_dim"], cfg["num_kv_heads"] * cfg["head_dim"]

    def mat(r, k, scale=None):
        s = 1.0 / np.sqrt(k) if scale is None else scale
        return (rng.standard_normal((r, k)) * s).astype(np.float32)

    def vec(n, mean=0.0, s=0.3):
        return (mean + rng.standard_normal(n) * s).astype(np.float32)

    w = dict(embed=mat(v, c, 0.3), layers=[], final_norm=vec(c, 1.0, 0.1),
             lm_head=None if cfg["tie_word_embeddings"] else mat(v, c))
    for _ in range(cfg["num_layers"]):
        bias = cfg["attention_bias"]
        w["layers"].append(dict(
            attn_norm=vec(c, 1.0, 0.2), wq=mat(hd, c), wk=mat(kvd, c), wv=mat(kvd, c), wo=mat(c, hd),
            bq=vec(hd) if bias else None, bk=vec(kvd) if bias else None, bv=vec(kvd) if bias else None,
            mlp_norm=vec(c, 1.0, 0.2), w_gate=mat(i, c), w_up=mat(i, c), w_down=mat(c, i)))
    return cfg, w


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope(x, theta):  # x: [T, heads, D], HF rotate_half convention
    t, _, d = x.shape
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


def forward_last(cfg, w, tokens):
    f = lambda a: None if a is None else a.astype(np.float64)
    h, kv, d = cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    t = len(tokens)
    x = f(w["embed"])[tokens]
    for lw in w["layers"]:
        xn = rmsnorm(x, f(lw["attn_norm"]), cfg["rms_norm_eps"])
        lin = lambda m, b: xn @ f(m).T + (0.0 if b is None else f(b))
        q = rope(lin(lw["wq"], lw["bq"]).reshape(t, h, d), cfg["rope_theta"])
        k = rope(lin(lw["wk"], lw["bk"]).reshape(t, kv, d), cfg["rope_theta"])
        v = lin(lw["wv"], lw["bv"]).reshape(t, kv, d)
        k = np.repeat(k, h // kv, axis=1)
        v = np.repeat(v, h // kv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(d)
        s = np.where(np.tril(np.ones((t, t), bool))[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", p, v).reshape(t, h * d)
        x = x + o @ f(lw["wo"]).T
        xn = rmsnorm(x, f(lw["mlp_norm"]), cfg["rms_norm_eps"])
        g = xn @ f(lw["w_gate"]).T
        x = x + (g / (1 + np.exp(-g)) * (xn @ f(lw["w_up"]).T)) @ f(lw["w_down"]).T
    last = rmsnorm(x[-1], f(w["final_norm"]), cfg["rms_norm_eps"])
    head = f(w["embed"] if w["lm_head"] is None else w["lm_head"])
    return head @ last


def tolist(a):
    return None if a is None else a.tolist()


def main():
    rng = np.random.default_rng(2026)
    prompts = [[1, 5, 9, 33, 2, 17, 7], [4], [8, 8, 3, 39]]
    models = []
    for arch in ["llama", "qwen2"]:
        cfg, w = make_model(rng, arch)
        logits, greedy = [], []
        for p in prompts:
            seq = list(p)
            steps_logits = []
            for _ in range(STEPS + 1):
                lg = forward_last(cfg, w, seq)
                steps_logits.append(lg.tolist())
                seq.append(int(np.argmax(lg)))
            logits.append(steps_logits)
            greedy.append(seq[len(p):len(p) + STEPS])
        weights = dict(
            embed=tolist(w["embed"]), final_norm=tolist(w["final_norm"]), lm_head=tolist(w["lm_head"]),
            layers=[{k: tolist(v) for k, v in lw.items()} for lw in w["layers"]])
        models.append(dict(config=cfg, weights=weights, logits=logits, greedy=greedy))
    out = dict(prompts=prompts, steps=STEPS, models=models,
               note="written by scripts/ref_cuda_tiny.py (float64 numpy forward)")
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "cuda", "tiny_models.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh)
    print(f"wrote {os.path.normpath(path)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
