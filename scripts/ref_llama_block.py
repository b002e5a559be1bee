#!/usr/bin/env python3
"""Independent numpy (f64) reference for the tiny Llama/Qwen2 decoder used by tests/model_tape.rs.

Writes tests/fixtures/autograd/tiny_{llama,qwen2}.json holding: the config, token ids,
targets (one ignored), every weight (HF layout, values exactly representable in f32),
the logits, the mean cross-entropy loss, and d loss / d weight for every weight computed
by central differences in f64 (h = 1e-6). Also the gradient w.r.t. the embedded input of
the block stack (d loss / d h0, h0 = embedding output), by central differences too.

Run once:  python3 scripts/ref_llama_block.py   (needs numpy only)
"""
import json
import os
import sys

import numpy as np

IGNORE = -100


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope_half_split(x, theta):
    # x: [B, T, H, D]; HF rotate_half pairing (i, i + D/2), positions 0..T-1.
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(x.shape[1], dtype=np.float64)[:, None] * inv[None, :]
    cos = np.cos(ang)[None, :, None, :]
    sin = np.sin(ang)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def block(x, w, cfg):
    b, t, c = x.shape
    h, kv, d = cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    a = rmsnorm(x, w["attn_norm"], eps)
    q = a @ w["wq"].T + (w["bq"] if "bq" in w else 0.0)
    k = a @ w["wk"].T + (w["bk"] if "bk" in w else 0.0)
    v = a @ w["wv"].T + (w["bv"] if "bv" in w else 0.0)
    q = rope_half_split(q.reshape(b, t, h, d), theta)
    k = rope_half_split(k.reshape(b, t, kv, d), theta)
    v = v.reshape(b, t, kv, d)
    rep = h // kv
    k = np.repeat(k, rep, axis=2)  # head j uses kv head j // rep (HF repeat_kv)
    v = np.repeat(v, rep, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d)
    mask = np.triu(np.ones((t, t), dtype=bool), 1)
    s = np.where(mask[None, None], -np.inf, s)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(-1, keepdims=True)
    o = np.einsum("bhts,bshd->bthd", p, v).reshape(b, t, h * d)
    x = x + o @ w["wo"].T
    m = rmsnorm(x, w["mlp_norm"], eps)
    y = (silu(m @ w["w_gate"].T) * (m @ w["w_up"].T)) @ w["w_down"].T
    return x + y


def from_h0(h0, W, cfg, targets):
    x = h0
    for l in range(cfg["num_layers"]):
        x = block(x, W["layers"][l], cfg)
    x = rmsnorm(x, W["final_norm"], cfg["rms_norm_eps"])
    head = W["lm_head"] if "lm_head" in W else W["embed"]
    logits = x @ head.T
    flat = logits.reshape(-1, logits.shape[-1])
    tg = np.array(targets).reshape(-1)
    keep = tg != IGNORE
    mx = flat.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(flat - mx).sum(-1, keepdims=True)))[:, 0]
    nll = lse[keep] - flat[keep, tg[keep]]
    return logits, nll.mean()


def forward(W, cfg, ids, targets):
    h0 = W["embed"][np.array(ids)]
    return from_h0(h0, W, cfg, targets)


def leaves(W):
    """(name, array) for every weight, with names matching the Rust test."""
    out = [("embed", W["embed"])]
    for l, lw in enumerate(W["layers"]):
        for k in sorted(lw):
            out.append((f"layers.{l}.{k}", lw[k]))
    out.append(("final_norm", W["final_norm"]))
    if "lm_head" in W:
        out.append(("lm_head", W["lm_head"]))
    return out


def central_diff(f, arr, h=1e-6):
    g = np.zeros_like(arr)
    flat, gflat = arr.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        o = flat[i]
        flat[i] = o + h
        fp = f()
        flat[i] = o - h
        fm = f()
        flat[i] = o
        gflat[i] = (fp - fm) / (2 * h)
    return g


def make(arch, seed):
    rng = np.random.default_rng(seed)
    cfg = dict(arch=arch, vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=2,
               num_heads=4, num_kv_heads=2, head_dim=4, rope_theta=10000.0,
               # the f64 value of the f32 epsilon the Rust config stores
               rms_norm_eps=float(np.float32(1e-5)), max_position_embeddings=64,
               tie_word_embeddings=(arch == "llama"), attention_bias=(arch == "qwen2"),
               bos_token_id=1, eos_token_id=2)
    c, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, kvd = cfg["num_heads"] * cfg["head_dim"], cfg["num_kv_heads"] * cfg["head_dim"]

    def r(*shape, scale=1.0):
        # f32-representable so the Rust f32 weight store holds the exact same numbers
        return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np.float64)

    def f32(a):
        return a.astype(np.float32).astype(np.float64)

    W = {"embed": r(v, c), "layers": [], "final_norm": f32(1.0 + r(c, scale=0.1))}
    for _ in range(cfg["num_layers"]):
        lw = dict(attn_norm=f32(1.0 + r(c, scale=0.1)), wq=r(hd, c, scale=0.3), wk=r(kvd, c, scale=0.3),
                  wv=r(kvd, c, scale=0.3), wo=r(c, hd, scale=0.3), mlp_norm=f32(1.0 + r(c, scale=0.1)),
                  w_gate=r(i, c, scale=0.3), w_up=r(i, c, scale=0.3), w_down=r(c, i, scale=0.3))
        if cfg["attention_bias"]:
            lw.update(bq=r(hd, scale=0.1), bk=r(kvd, scale=0.1), bv=r(kvd, scale=0.1))
        W["layers"].append(lw)
    if not cfg["tie_word_embeddings"]:
        W["lm_head"] = r(v, c, scale=0.3)
    ids = [[int(x) for x in rng.integers(0, v, size=5)]]
    targets = [[int(x) for x in rng.integers(0, v, size=5)]]
    targets[0][2] = IGNORE

    logits, loss = forward(W, cfg, ids, targets)
    grads = {}
    for name, arr in leaves(W):
        grads[name] = central_diff(lambda: forward(W, cfg, ids, targets)[1], arr)
    h0 = W["embed"][np.array(ids)].copy()
    grad_h0 = central_diff(lambda: from_h0(h0, W, cfg, targets)[1], h0)
    enc = lambda a: {"shape": list(a.shape), "data": [float(x) for x in a.reshape(-1)]}
    return {
        "config": cfg,
        "ids": ids,
        "targets": targets,
        "weights": {n: enc(a) for n, a in leaves(W)},
        "logits": enc(logits),
        "loss": float(loss),
        "grads": {n: enc(g) for n, g in grads.items()},
        "grad_h0": enc(grad_h0),
    }


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "fixtures", "autograd")
    os.makedirs(out_dir, exist_ok=True)
    for arch, seed in [("llama", 1), ("qwen2", 2)]:
        fx = make(arch, seed)
        path = os.path.join(out_dir, f"tiny_{arch}.json")
        with open(path, "w") as f:
            json.dump(fx, f, separators=(",", ":"))
        print(path, os.path.getsize(path), "bytes, loss", fx["loss"])


if __name__ == "__main__":
    main()
