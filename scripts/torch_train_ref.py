#!/usr/bin/env python3
"""PyTorch eager reference for `elm bench-train` (issue 25): one ELM training step on the
SmolLM2-135M shapes, the same work as `elm::equilibrium::train::Trainer::train_step` with the
benchmark's fixed rule:

  * teacher (no grad): embedding, layers [0, l) -> h, layers [l, l+M) -> target; skipped with
    --teacher-cache (h, target precomputed, as our teacher cache reads them from disk);
  * module phi(z, h) = block(W_z z + W_h h + b), block = one Llama decoder layer (RMSNorm,
    RoPE, GQA causal attention, SwiGLU, residuals); z0 = 0; `--no-grad-iters` iterations
    without gradient, then `--grad-iters` differentiable ones (SJFB with fixed counts);
  * loss: masked MSE(z*, target) (the distillation phase); in the CE phase also the frozen
    back layers [l+M, L), final norm, LM head and cross-entropy at the supervised positions
    only (`--supervised` of the B*T tokens, the first ones of each row after the prompt);
  * backward, global-norm clip, AdamW on the module's parameters;
  * phase `lora`: the LoRA SFT step of `elm lora` (rank 16, alpha 16, dropout 0.05 on the seven
    linear maps of all 30 frozen layers; CE at the supervised positions; AdamW on the adapters).

Weights are seeded random values of the model's exact shapes (timing does not depend on
values). `--dtype bf16` runs under CPU autocast (bf16 matmuls through oneDNN, f32 master
weights), the mode PyTorch users reach for. One warm-up step, then the mean of `--steps`.
Prints one JSON object on stdout.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

C, I, V, L, HEADS, KV, HD, THETA, EPS = 576, 1536, 49152, 30, 9, 3, 64, 100000.0, 1e-5


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x, cos, sin):
    # Half-split rotation (the HF layout our loader converts GGUF rows to).
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Layer:
    def __init__(self, g, grad):
        a = 0.02 * math.sqrt(3.0)

        def mat(*shape):
            t = (torch.rand(*shape, generator=g) * 2 - 1) * a
            return t.requires_grad_(grad)

        self.attn_norm = torch.ones(C).requires_grad_(grad)
        self.wq, self.wk, self.wv = mat(HEADS * HD, C), mat(KV * HD, C), mat(KV * HD, C)
        self.wo = mat(C, HEADS * HD)
        self.mlp_norm = torch.ones(C).requires_grad_(grad)
        self.w_gate, self.w_up, self.w_down = mat(I, C), mat(I, C), mat(C, I)

    def params(self):
        return [self.attn_norm, self.wq, self.wk, self.wv, self.wo, self.mlp_norm,
                self.w_gate, self.w_up, self.w_down]

    def add_lora(self, g, rank, alpha, dropout):
        """Rank-`rank` adapters on the seven linear maps (A random, B = 0), as `elm lora`."""
        self.lora = {}
        self.lora_scale, self.lora_dropout = alpha / rank, dropout
        for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            out_dim, in_dim = getattr(self, name).shape
            a = ((torch.rand(rank, in_dim, generator=g) * 2 - 1) / math.sqrt(in_dim)).requires_grad_(True)
            self.lora[name] = (a, torch.zeros(out_dim, rank).requires_grad_(True))

    def lora_params(self):
        return [p for ab in getattr(self, "lora", {}).values() for p in ab]

    def lin(self, name, x):
        y = x @ getattr(self, name).T
        ab = getattr(self, "lora", {}).get(name)
        if ab is not None:
            a, b = ab
            y = y + (F.dropout(x, self.lora_dropout) @ a.T @ b.T) * self.lora_scale
        return y

    def __call__(self, x, cos, sin):  # x: [B, T, C]
        b, t, _ = x.shape
        n = rms(x, self.attn_norm)
        q = self.lin("wq", n).view(b, t, HEADS, HD).transpose(1, 2)
        k = self.lin("wk", n).view(b, t, KV, HD).transpose(1, 2)
        v = self.lin("wv", n).view(b, t, KV, HD).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = k.repeat_interleave(HEADS // KV, dim=1)
        v = v.repeat_interleave(HEADS // KV, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.lin("wo", a.transpose(1, 2).reshape(b, t, HEADS * HD))
        n = rms(x, self.mlp_norm)
        return x + self.lin("w_down", F.silu(self.lin("w_gate", n)) * self.lin("w_up", n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--start", type=int, default=12)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--no-grad-iters", type=int, default=2)
    ap.add_argument("--grad-iters", type=int, default=2)
    ap.add_argument("--supervised", type=int, default=128, help="supervised tokens per batch")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--phases", default="distill,ce,lora")
    ap.add_argument("--teacher-cache", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    embed = (torch.rand(V, C, generator=g) * 2 - 1) * 0.05
    layers = [Layer(g, grad=False) for _ in range(L)]
    final_norm = torch.ones(C)
    block = Layer(g, grad=True)
    w_z = (torch.rand(C, C, generator=g) * 2 - 1).mul_(0.01).requires_grad_(True)
    w_h = torch.eye(C).requires_grad_(True)
    bias = torch.zeros(C).requires_grad_(True)
    params = block.params() + [w_z, w_h, bias]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)

    b, t = args.batch, args.seq
    pos = torch.arange(t, dtype=torch.float32)
    inv = 1.0 / THETA ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD)
    ang = torch.outer(pos, inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    tokens = torch.randint(0, V, (b, t), generator=g)
    targets = torch.randint(0, V, (b, t), generator=g)
    # Supervised positions: the last `per_row` tokens of each row (the answer after the prompt).
    per_row = max(1, min(t, args.supervised // b))
    sup = torch.zeros(b, t, dtype=torch.bool)
    sup[:, t - per_row:] = True
    ac = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def teacher():
        with torch.no_grad(), ac:
            x = embed[tokens]
            for lyr in layers[: args.start]:
                x = lyr(x, cos, sin)
            h = x
            for lyr in layers[args.start: args.start + args.m]:
                x = lyr(x, cos, sin)
            return h.float(), x.float()

    cached = teacher() if args.teacher_cache else None

    def step(ce):
        h, target = cached if cached is not None else teacher()
        with ac:
            def phi(z):
                return block(z @ w_z.T + h @ w_h.T + bias, cos, sin)
            with torch.no_grad():
                z = torch.zeros_like(h)
                for _ in range(args.no_grad_iters):
                    z = phi(z)
            for _ in range(args.grad_iters):
                z = phi(z)
            loss = (z.float() - target).pow(2).sum(-1).mean()
            if ce:
                x = z
                for lyr in layers[args.start + args.m:]:
                    x = lyr(x, cos, sin)
                n = rms(x[sup], final_norm)
                logits = n @ embed.T
                loss = loss + F.cross_entropy(logits.float(), targets[sup])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    def lora_steps():
        """The LoRA SFT step: adapters on every layer, frozen base, CE at the supervised
        positions, AdamW on the adapters (a fresh copy of the model's layers' adapters)."""
        for lyr in layers:
            lyr.add_lora(g, 16, 16.0, 0.05)
        lparams = [p for lyr in layers for p in lyr.lora_params()]
        lopt = torch.optim.AdamW(lparams, lr=2e-4, weight_decay=0.0)

        def lstep():
            with ac:
                x = embed[tokens]
                for lyr in layers:
                    x = lyr(x, cos, sin)
                n = rms(x[sup], final_norm)
                loss = F.cross_entropy((n @ embed.T).float(), targets[sup])
            lopt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(lparams, 1.0)
            lopt.step()
        lstep()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            lstep()
        for lyr in layers:
            lyr.lora = {}
        return (time.perf_counter() - t0) / args.steps

    out = {"torch": torch.__version__, "threads": args.threads, "dtype": args.dtype,
           "batch": b, "seq_len": t, "teacher_cache": args.teacher_cache,
           "supervised_tokens": int(sup.sum()), "phases": {}}
    for phase in args.phases.split(","):
        if phase == "lora":
            s = lora_steps()
            out["phases"][phase] = {"seconds_per_step": s, "tok_s": b * t / s}
            continue
        ce = phase == "ce"
        step(ce)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(ce)
        s = (time.perf_counter() - t0) / args.steps
        out["phases"][phase] = {"seconds_per_step": s, "tok_s": b * t / s}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
