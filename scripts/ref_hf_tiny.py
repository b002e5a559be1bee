#!/usr/bin/env python3
"""Tiny HF checkpoints for the safetensors/config.json loader (run once; CI never runs it).

config.json files are written by transformers' own LlamaConfig / Qwen2Config (so the key set
is whatever the real library emits); weights by the `safetensors` numpy API:
  tests/fixtures/io/hf_tiny_llama/  tied, sharded in 2 files + model.safetensors.index.json,
                                    mixed F16 / BF16 / F32 tensors
  tests/fixtures/io/hf_tiny_qwen2/  untied, q/k/v biases, single BF16 model.safetensors
  tests/fixtures/io/hf_tiny_*_expected.safetensors: the same tensors as exact f32 (numpy
  f16->f32 cast; bf16 is the top 16 bits of an f32, widened by a shift).
Usage: python3 scripts/ref_hf_tiny.py   (pip install numpy safetensors transformers)
"""
import json
import os

import numpy as np
from safetensors.numpy import save_file
from transformers import LlamaConfig, Qwen2Config

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "io")
rng = np.random.default_rng(99)
V, C, I, L, H, KV, D = 64, 32, 48, 2, 4, 2, 8


def to_bf16_bits(x):
    """Round-to-nearest-even f32 -> bf16 bit pattern (uint16)."""
    b = x.astype(np.float32).view(np.uint32)
    rounded = b + 0x7FFF + ((b >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def tensors(bias, tied):
    t = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not tied:
        t["lm_head.weight"] = (V, C)
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = (C,)
        t[p + "self_attn.q_proj.weight"] = (H * D, C)
        t[p + "self_attn.k_proj.weight"] = (KV * D, C)
        t[p + "self_attn.v_proj.weight"] = (KV * D, C)
        t[p + "self_attn.o_proj.weight"] = (C, H * D)
        if bias:
            t[p + "self_attn.q_proj.bias"] = (H * D,)
            t[p + "self_attn.k_proj.bias"] = (KV * D,)
            t[p + "self_attn.v_proj.bias"] = (KV * D,)
        t[p + "post_attention_layernorm.weight"] = (C,)
        t[p + "mlp.gate_proj.weight"] = (I, C)
        t[p + "mlp.up_proj.weight"] = (I, C)
        t[p + "mlp.down_proj.weight"] = (C, I)
    return t


def encode(name, shape, dtype):
    x = rng.standard_normal(shape).astype(np.float32) * 0.5
    if dtype == "f16":
        stored = x.astype(np.float16)
        return stored, stored.astype(np.float32)
    if dtype == "bf16":
        bits = to_bf16_bits(x)
        # safetensors.numpy has no bfloat16 dtype: written below via raw bytes.
        return bits, bf16_to_f32(bits)
    return x, x


def write_safetensors(path, arrays):
    """Writes F32/F16 via numpy and BF16 (uint16 bit patterns) by patching the header."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (arr, dt) in sorted(arrays.items()):
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def build(name, config, bias, tied, dtype_of, shards):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    config.save_pretrained(d)
    expected, stored = {}, {}
    for tname, shape in tensors(bias, tied).items():
        dt = dtype_of(tname)
        arr, f32 = encode(tname, shape, dt)
        expected[tname] = f32
        stored[tname] = (arr, {"f16": "F16", "bf16": "BF16", "f32": "F32"}[dt])
    save_file(expected, os.path.join(OUT, f"{name}_expected.safetensors"))
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), stored)
    else:
        names = sorted(stored)
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: stored[n] for n in names[s::shards]}
            write_safetensors(os.path.join(d, fname), part)
            weight_map.update({n: fname for n in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=1)


common = dict(vocab_size=V, hidden_size=C, intermediate_size=I, num_hidden_layers=L,
              num_attention_heads=H, num_key_value_heads=KV, max_position_embeddings=128)
build("hf_tiny_llama",
      LlamaConfig(**common, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2),
      bias=False, tied=True,
      dtype_of=lambda n: "f32" if "norm" in n else ("f16" if "mlp" in n or "embed" in n else "bf16"),
      shards=2)
build("hf_tiny_qwen2",
      Qwen2Config(**common, tie_word_embeddings=False, bos_token_id=5, eos_token_id=[6, 7]),
      bias=True, tied=False, dtype_of=lambda n: "bf16", shards=1)
print("wrote", OUT)
