#!/usr/bin/env python3
"""Reference fixture for the block formats added with Gemma 3 (run once; CI never runs it).

Writes tests/fixtures/io/kquants.json:
  blocks       per type (Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): random blocks (random bytes
               for every packed field, finite random f16 scales) plus an all-zero block and one
               with the largest packed scales, their hex bytes, and the f32 bit patterns of
               gguf.quants.dequantize -- the bit-exact reference for elm's decoders.
  real_file    per type present in gemma-3-270m-q4_k_m.gguf: its first tensor of that type,
               with the element count, the FNV-1a 64 hash of the dequantized f32 values (their
               little-endian bytes, in file order) and the first 64 values' bits.
Usage: python3 scripts/ref_gguf_kquants.py [models/gemma-3-270m-q4_k_m.gguf]
       (pip install numpy gguf; gguf 0.19.0 made the committed fixture)
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "io", "kquants.json")
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "models", "gemma-3-270m-q4_k_m.gguf")
rng = np.random.default_rng(20261127)

# (type, block bytes, byte offsets of its f16 scale fields)
LAYOUT = {
    T.Q5_0: (22, [0]),
    T.Q5_1: (24, [0, 2]),
    T.Q2_K: (84, [80, 82]),
    T.Q3_K: (110, [108]),
    T.Q4_K: (144, [0, 2]),
    T.Q5_K: (176, [0, 2]),
    T.Q6_K: (210, [208]),
}


def random_blocks(qtype, n):
    size, scales = LAYOUT[qtype]
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in scales:
        # Finite scales over a wide range (random f16 bits could be NaN or inf).
        v = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 1, n)).astype(np.float16)
        raw[:, off:off + 2] = v.view(np.uint8).reshape(n, 2)
    raw[0] = 0                      # all zero: every value 0
    raw[1] = 0xFF                   # every packed scale / min / bit at its largest...
    for off in scales:              # ...with finite f16 scales
        raw[1, off:off + 2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    return raw


def f32_bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32).ravel().tolist()


def fnv64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


blocks = []
for qtype, (size, _) in LAYOUT.items():
    n = 16 if qtype in (T.Q5_0, T.Q5_1) else 6
    raw = random_blocks(qtype, n)
    deq = dequantize(raw, qtype)
    blocks.append({"type": qtype.name, "blocks": n, "bytes_hex": raw.tobytes().hex(),
                   "dequant_bits": f32_bits(deq)})

real = []
if os.path.exists(MODEL):
    r = gguf.GGUFReader(MODEL)
    smallest = {}
    for t in r.tensors:
        ty = T(t.tensor_type)
        if ty not in (T.F32, T.F16, T.BF16) and (ty not in smallest or t.n_elements < smallest[ty].n_elements):
            smallest[ty] = t
    for ty, t in sorted(smallest.items(), key=lambda kv: kv[0].name):
        deq = dequantize(t.data, ty).astype(np.float32).ravel()
        h = fnv64(deq.tobytes())
        real.append({"name": t.name, "type": ty.name, "elements": int(deq.size),
                     "fnv64": f"{h:016x}", "first_bits": f32_bits(deq[:64])})
        print(t.name, ty.name, deq.size, f"{h:016x}", file=sys.stderr)
else:
    print(f"{MODEL} absent: real_file left empty", file=sys.stderr)

with open(OUT, "w") as f:
    json.dump({"blocks": blocks, "real_file": real}, f)
    f.write("\n")
print(OUT, os.path.getsize(OUT), "bytes", file=sys.stderr)
