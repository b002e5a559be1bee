#!/usr/bin/env python3
"""PyTorch eager reference for scripts/gpu-bench.sh: a small Llama/Qwen2 decoder with a preallocated
KV cache, timed exactly like `elm::cuda::bench::run_bench` (same shapes, same protocol):

  * prefill: batch 1, `--prefill-len` tokens; one warm-up, then the median of `--reps` runs;
  * decode: for each batch size, prefill `--decode-prompt-len` tokens, 2 warm-up steps, then
    `--steps` timed steps of one token per sequence.
Every timed region ends with the logits copied to the host (as in real generation).

Weights are seeded random values of the model's exact shapes (timing does not depend on values).
f32 throughout; `--tf32 1` allows TF32 matmuls (compare with elm's TF32 run only).
Prints one JSON object on stdout.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

CONFIGS = {
    # SmolLM2-135M(-Instruct)
    "smollm2-135m": dict(vocab=49152, hidden=576, inter=1536, layers=30, heads=9, kv_heads=3,
                         head_dim=64, theta=100000.0, eps=1e-5, bias=False, tied=True),
    # Qwen2.5-1.5B (q/k/v bias, tied embeddings)
    "qwen2.5-1.5b": dict(vocab=151936, hidden=1536, inter=8960, layers=28, heads=12, kv_heads=2,
                         head_dim=128, theta=1000000.0, eps=1e-6, bias=True, tied=True),
}


class Decoder:
    def __init__(self, cfg, device, seed, attn):
        self.cfg = cfg
        self.attn = attn
        g = torch.Generator(device="cpu").manual_seed(seed)
        a = 0.02 * math.sqrt(3.0)

        def mat(*shape):
            return ((torch.rand(*shape, generator=g) * 2 - 1) * a).to(device)

        c, i, v = cfg["hidden"], cfg["inter"], cfg["vocab"]
        hd, kvd = cfg["heads"] * cfg["head_dim"], cfg["kv_heads"] * cfg["head_dim"]
        self.embed = mat(v, c)
        self.lm_head = self.embed if cfg["tied"] else mat(v, c)
        self.final_norm = torch.ones(c, device=device)
        self.layers = []
        for _ in range(cfg["layers"]):
            self.layers.append(dict(
                attn_norm=torch.ones(c, device=device),
                wq=mat(hd, c), wk=mat(kvd, c), wv=mat(kvd, c), wo=mat(c, hd),
                bq=mat(hd) if cfg["bias"] else None,
                bk=mat(kvd) if cfg["bias"] else None,
                bv=mat(kvd) if cfg["bias"] else None,
                mlp_norm=torch.ones(c, device=device),
                w_gate=mat(i, c), w_up=mat(i, c), w_down=mat(c, i),
            ))
        self.device = device
        self.k_cache = self.v_cache = None

    def alloc_cache(self, batch, max_seq):
        cfg = self.cfg
        shape = (batch, cfg["kv_heads"], max_seq, cfg["head_dim"])
        self.k_cache = [torch.zeros(shape, device=self.device) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=self.device) for _ in self.layers]
        half = cfg["head_dim"] // 2
        inv_freq = 1.0 / (cfg["theta"] ** (torch.arange(0, half, device=self.device).float() * 2 / cfg["head_dim"]))
        ang = torch.arange(max_seq, device=self.device).float()[:, None] * inv_freq[None, :]
        self.cos = torch.cat([ang.cos(), ang.cos()], dim=-1)  # [T_max, D]
        self.sin = torch.cat([ang.sin(), ang.sin()], dim=-1)

    @staticmethod
    def rmsnorm(x, w, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(self, x, start, t):  # x: [B, heads, T, D], half-split (HF rotate_half)
        cos = self.cos[start:start + t][None, None]
        sin = self.sin[start:start + t][None, None]
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    @torch.no_grad()
    def forward(self, tokens, start):
        """tokens: [B, T] (all sequences at the same position `start`), B at most the cache's batch
        (its first B rows are used); returns last-position logits [B, V]."""
        cfg = self.cfg
        b, t = tokens.shape
        h, kv, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        x = self.embed[tokens]
        for li, lw in enumerate(self.layers):
            xn = self.rmsnorm(x, lw["attn_norm"], cfg["eps"])
            q = F.linear(xn, lw["wq"], lw["bq"]).view(b, t, h, d).transpose(1, 2)
            k = F.linear(xn, lw["wk"], lw["bk"]).view(b, t, kv, d).transpose(1, 2)
            v = F.linear(xn, lw["wv"], lw["bv"]).view(b, t, kv, d).transpose(1, 2)
            q, k = self.rope(q, start, t), self.rope(k, start, t)
            self.k_cache[li][:b, :, start:start + t] = k
            self.v_cache[li][:b, :, start:start + t] = v
            keys = self.k_cache[li][:b, :, :start + t].repeat_interleave(h // kv, dim=1)
            vals = self.v_cache[li][:b, :, :start + t].repeat_interleave(h // kv, dim=1)
            if self.attn == "sdpa":
                # Causal mask aligned to the end (queries are the last t of start+t keys).
                mask = None
                if t > 1:
                    mask = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(diagonal=start)
                o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
            else:
                s = (q @ keys.transpose(-1, -2)) / math.sqrt(d)
                if t > 1:
                    mask = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(diagonal=start)
                    s = s.masked_fill(~mask, float("-inf"))
                o = s.softmax(-1) @ vals
            x = x + F.linear(o.transpose(1, 2).reshape(b, t, h * d), lw["wo"])
            xn = self.rmsnorm(x, lw["mlp_norm"], cfg["eps"])
            x = x + F.linear(F.silu(F.linear(xn, lw["w_gate"])) * F.linear(xn, lw["w_up"]), lw["w_down"])
        last = self.rmsnorm(x[:, -1], self.final_norm, cfg["eps"])
        return F.linear(last, self.lm_head)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(CONFIGS), required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--decode-prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tf32", type=int, default=0)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--bf16", action="store_true", help="CPU autocast to bf16 (oneDNN AVX-512 BF16)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    cfg = CONFIGS[args.model]
    dev = torch.device(args.device)
    model = Decoder(cfg, dev, args.seed, args.attn)
    batches = [int(x) for x in args.batches.split(",") if x]
    warmup_steps = 2
    max_batch = max(batches + [1])
    max_seq = max(args.prefill_len, args.decode_prompt_len + warmup_steps + args.steps)
    model.alloc_cache(max_batch, max_seq)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    # No-grad inference; on the CPU optionally under bf16 autocast (what PyTorch users run).
    torch.set_grad_enabled(False)
    if args.bf16:
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()

    prompt = torch.randint(0, cfg["vocab"], (1, args.prefill_len), generator=gen).to(dev)
    model.forward(prompt, 0).cpu()  # warm-up
    times = []
    for _ in range(args.reps):
        sync()
        t0 = time.perf_counter()
        model.forward(prompt, 0).cpu()
        times.append(time.perf_counter() - t0)
    times.sort()
    prefill_s = times[len(times) // 2]

    decode = []
    for b in batches:
        prompts = torch.randint(0, cfg["vocab"], (b, args.decode_prompt_len), generator=gen).to(dev)
        model.forward(prompts, 0).cpu()
        step_tok = torch.arange(b, device=dev)[:, None]
        pos = args.decode_prompt_len
        for _ in range(warmup_steps):
            model.forward(step_tok, pos).cpu()
            pos += 1
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            model.forward(step_tok, pos).cpu()
            pos += 1
        secs = time.perf_counter() - t0
        decode.append(dict(batch=b, steps=args.steps, seconds=secs, tok_s=b * args.steps / secs))

    print(json.dumps(dict(
        label=args.model, impl=f"torch {torch.__version__} eager ({args.attn})",
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        tf32=bool(args.tf32), bf16=args.bf16,
        prefill_len=args.prefill_len, prefill_seconds=prefill_s,
        prefill_tok_s=args.prefill_len / prefill_s, decode=decode,
    )))


if __name__ == "__main__":
    main()
