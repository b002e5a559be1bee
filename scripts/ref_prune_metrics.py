"""Reference values for elm::compress::metrics (tests/compress.rs), computed with numpy in float64.

Writes tests/fixtures/compress/metrics_ref.json: random residual-stream states h_0..h_N
(float32-representable, with one zero vector to exercise the zero-norm rule) and
  - block influence  BI_i = mean_t (1 - cos(h_i, h_{i+1}))            (ShortGPT)
  - window cosine    S(s) = mean_t cos(h_s, h_{s+M})                   (LLM-Streamline)
  - angular distance d(s) = mean_chunks arccos(cos(last tokens)) / pi   (ReplaceMe / UIDL)
Run once: python3 scripts/ref_prune_metrics.py
"""
import json
import pathlib

import numpy as np

rng = np.random.default_rng(7)
N, CHUNKS, T, C, M = 5, 3, 4, 6, 2
states = rng.normal(size=(N + 1, CHUNKS, T, C)).astype(np.float32)
# Make later layers closer to their inputs so the scores differ in a structured way.
for i in range(1, N + 1):
    states[i] = (0.6 * states[i - 1] + 0.4 * states[i]).astype(np.float32)
states[2, 1, 3, :] = 0.0  # a zero vector: its cosine counts as 0
s64 = states.astype(np.float64)


def cos(a, b):
    na = np.linalg.norm(a, axis=-1)
    nb = np.linalg.norm(b, axis=-1)
    dot = (a * b).sum(axis=-1)
    out = np.zeros_like(dot)
    ok = (na > 0) & (nb > 0)
    out[ok] = dot[ok] / (na[ok] * nb[ok])
    return out


bi = [float(np.mean(1.0 - cos(s64[i], s64[i + 1]))) for i in range(N)]
wc = [float(np.mean(cos(s64[s], s64[s + M]))) for s in range(N - M + 1)]
ang = [
    float(np.mean(np.arccos(np.clip(cos(s64[s][:, -1, :], s64[s + M][:, -1, :]), -1, 1)) / np.pi))
    for s in range(N - M + 1)
]
out = {
    "shape": [N + 1, CHUNKS, T, C],
    "m": M,
    "states": [float(x) for x in states.ravel()],
    "block_influence": bi,
    "window_cosine": wc,
    "angular_distance": ang,
}
path = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/compress/metrics_ref.json"
path.write_text(json.dumps(out, indent=1))
print(f"wrote {path}")
