#!/usr/bin/env python3
"""Reference fixtures for GGUF dequantization and parsing (run once; CI never runs it).

Writes tests/fixtures/io/:
  quants.json     per type: raw quantized bytes (hex) from gguf.quants.quantize and the
                  f32 bit patterns of gguf.quants.dequantize(bytes) -- the bit-exact reference.
  ref_small.gguf  a tiny GGUF written by gguf.GGUFWriter (independent writer): metadata of
                  every value type incl. arrays, general.alignment = 64, and tensors of each
                  supported type; quants.json["file_tensors"] lists their dequantized values.
Usage: python3 scripts/ref_gguf_quants.py   (pip install numpy gguf)
"""
import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize, dequantize

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "io")
rng = np.random.default_rng(1234)


def sample(shape):
    x = rng.standard_normal(shape).astype(np.float32) * 2.0
    x[0, :32] = 0.0                       # an all-zero block (scale 0)
    x[0, 32:64] = np.linspace(-1e-3, 5e-3, 32, dtype=np.float32)  # tiny values
    if shape[0] > 1:
        x[1, :32] = 60000.0 * np.sign(rng.standard_normal(32)).astype(np.float32)  # near f16 max
    return x


def entry(qtype, x):
    raw = quantize(x, qtype)
    deq = dequantize(raw, qtype).astype(np.float32)
    assert deq.shape == x.shape
    return {
        "type": qtype.name,
        "shape": list(x.shape),
        "bytes_hex": raw.tobytes().hex(),
        "dequant_bits": deq.view(np.uint32).ravel().tolist(),
    }


types = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1]
fixture = {"blocks": [entry(t, sample((4, 96))) for t in types]}

# A tiny GGUF written by the reference writer.
path = os.path.join(OUT, "ref_small.gguf")
w = gguf.GGUFWriter(path, arch="llama")
w.data_alignment = 64
w.add_uint32("general.alignment", 64)
w.add_uint8("test.u8", 200)
w.add_int8("test.i8", -100)
w.add_uint16("test.u16", 60000)
w.add_int16("test.i16", -30000)
w.add_uint32("test.u32", 4000000000)
w.add_int32("test.i32", -2000000000)
w.add_float32("test.f32", 0.15625)
w.add_bool("test.bool", True)
w.add_string("test.str", "héllo 🙂")
w.add_uint64("test.u64", 2**63 + 5)
w.add_int64("test.i64", -(2**62))
w.add_float64("test.f64", 1e-300)
w.add_array("test.arr_i32", [1, -2, 3])
w.add_array("test.arr_str", ["a", "", "ü"])
file_tensors = []
for t in types:
    x = sample((2, 64))
    raw = quantize(x, t)
    name = f"t_{t.name.lower()}"
    w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=t)
    file_tensors.append({"name": name, "type": t.name, "shape": [2, 64],
                         "dequant_bits": dequantize(raw, t).astype(np.float32).view(np.uint32).ravel().tolist()})
v = rng.standard_normal((3,)).astype(np.float32)
w.add_tensor("t_vec", v)
file_tensors.append({"name": "t_vec", "type": "F32", "shape": [3], "dequant_bits": v.view(np.uint32).tolist()})
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
fixture["file_tensors"] = file_tensors

# Cross-check with the reference reader: data offsets must be 64-aligned.
r = gguf.GGUFReader(path)
assert all(t.data_offset % 64 == 0 for t in r.tensors)

with open(os.path.join(OUT, "quants.json"), "w") as f:
    json.dump(fixture, f)
print("wrote", OUT)
