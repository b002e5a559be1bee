#!/usr/bin/env python3
"""Reference numbers from the real SmolLM2-135M-Instruct Q4_1 GGUF, read with the PyPI
`gguf` package (GGUFReader + gguf.quants.dequantize) -- independent of our Rust reader.

Writes tests/fixtures/io/smollm2_ref.json: metadata-derived config, and for a few tensors
(HF order, i.e. after undoing llama.cpp's Q/K RoPE permutation with numpy) the first
values of given rows plus f64 sums / sums of squares over the whole tensor.
Usage: ELM_MODELS_DIR=/work/models python3 scripts/ref_gguf_smollm.py
"""
import json
import os

import numpy as np
import gguf
from gguf.quants import dequantize

models = os.environ.get("ELM_MODELS_DIR", os.path.join(os.path.dirname(__file__), "..", "models"))
path = os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf")
r = gguf.GGUFReader(path)


def field(key):
    f = r.fields[key]
    return f.contents()


n_head = int(field("llama.attention.head_count"))
n_kv = int(field("llama.attention.head_count_kv"))
config = {
    "vocab_size": int(field("llama.vocab_size")),
    "hidden_size": int(field("llama.embedding_length")),
    "intermediate_size": int(field("llama.feed_forward_length")),
    "num_layers": int(field("llama.block_count")),
    "num_heads": n_head,
    "num_kv_heads": n_kv,
    "rope_theta": float(field("llama.rope.freq_base")),
    "rms_norm_eps": float(field("llama.attention.layer_norm_rms_epsilon")),
    "max_position_embeddings": int(field("llama.context_length")),
    "bos_token_id": int(field("tokenizer.ggml.bos_token_id")),
    "eos_token_id": int(field("tokenizer.ggml.eos_token_id")),
    "n_tensors": len(r.tensors),
}


def unpermute(w, heads):
    # convert_hf_to_gguf.permute: w.reshape(h, 2, D/2, C).swapaxes(1, 2).reshape(w.shape);
    # its inverse views rows as (h, D/2, 2) and swaps back.
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


tensors = {t.name: t for t in r.tensors}
checks = []
wanted = [
    ("token_embd.weight", None, [0, 1, 2, 49151]),
    ("output_norm.weight", None, None),
    ("blk.0.attn_q.weight", n_head, [0, 1, 32, 63, 575]),
    ("blk.0.attn_k.weight", n_kv, [0, 1, 32, 191]),
    ("blk.0.attn_v.weight", None, [0, 191]),
    ("blk.0.attn_norm.weight", None, None),
    ("blk.7.ffn_down.weight", None, [0, 575]),
    ("blk.29.attn_q.weight", n_head, [5, 33]),
    ("blk.29.ffn_gate.weight", None, [1535]),
]
for name, heads, rows in wanted:
    t = tensors[name]
    shape = [int(d) for d in reversed(t.shape)]  # numpy / HF order
    x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
    if heads is not None:
        x = unpermute(x, heads)
    entry = {
        "name": name,
        "type": t.tensor_type.name,
        "shape": shape,
        "sum": float(x.astype(np.float64).sum()),
        "sum_sq": float((x.astype(np.float64) ** 2).sum()),
    }
    if rows is None:
        entry["rows"] = {"0": x[:8].tolist()}
    else:
        entry["rows"] = {str(i): x[i, :8].tolist() for i in rows}
    checks.append(entry)

out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "io", "smollm2_ref.json")
with open(out, "w") as f:
    json.dump({"config": config, "tensors": checks}, f, indent=1)
print("wrote", out)
