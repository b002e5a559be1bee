"""bf16_quality.across_seeds against a t interval worked by hand."""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bf16_quality import across_seeds  # noqa: E402


def test_t_interval_over_seeds():
    # Differences +0.01, −0.01, +0.03: mean 0.01, sd 0.02, half-width t(2) · 0.02 / √3.
    summary, sentence = across_seeds([0, 1, 2], [1.0, 1.1, 1.2], [1.01, 1.09, 1.23])
    half = 4.303 * 0.02 / math.sqrt(3)
    lo, hi = summary["t_interval_95"]
    assert abs(summary["mean_difference"] - 0.01) < 1e-12
    assert abs(lo - (0.01 - half)) < 1e-12 and abs(hi - (0.01 + half)) < 1e-12
    assert abs(summary["f32_seed_sd"] - 0.1) < 1e-12
    assert summary["zero_in_interval"]
    assert "it contains 0" in sentence and "(seed 2)" in sentence


def test_a_shift_beyond_the_noise_is_said():
    summary, sentence = across_seeds([0, 1, 2], [1.0, 1.1, 1.2], [1.10, 1.21, 1.29])
    assert not summary["zero_in_interval"]
    assert "it excludes 0" in sentence
