"""The analysis of `scripts/bf16-quality.sh`: models trained with f32 and with bf16 products,
each scored in f32 and paired, and across the ELM's seeds a Student t interval of the bf16 − f32
difference, the scale a bf16 difference is judged against. Writes OUT/summary.json,
OUT/bf16_quality.md and, with a page path, its `bf16-quality` block.

Usage: bf16_quality.py OUT LIMIT PAGE (as bf16-quality.sh calls it; PAGE may be empty)."""

import glob
import json
import math
import os
import re
import sys

# Student t 97.5% quantiles by degrees of freedom.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def paired(path):
    p = json.load(open(path))["metrics"]["answer_nll"]["paired"]
    return p["model"], p["reference"], p["delta"], p["verdict"]


def fmt(i):
    return f"{i['value']:.4f} [{i['lo']:.4f}, {i['hi']:.4f}]"


def seed_of(path):
    return int(re.search(r"seed(\d+)\.json$", path).group(1))


def across_seeds(seeds, f32, bf16):
    """The ELM's bf16 − f32 NLL differences over seeds: their mean, the 95% t interval over
    seeds (the interval that covers training), the f32 seed-to-seed sd, and the report's
    sentence."""
    diffs = [b - f for b, f in zip(bf16, f32)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1))
    half = T975[n - 1] * sd / math.sqrt(n)
    f32_mean = sum(f32) / n
    f32_sd = math.sqrt(sum((x - f32_mean) ** 2 for x in f32) / (n - 1))
    within = mean - half <= 0.0 <= mean + half
    worst = max(range(n), key=lambda i: abs(diffs[i]))
    summary = {"seeds": seeds, "f32_nll": f32, "bf16_nll": bf16, "bf16_minus_f32": diffs,
               "mean_difference": mean, "t_interval_95": [mean - half, mean + half],
               "f32_seed_sd": f32_sd, "zero_in_interval": within}
    sentence = (f"Across the {n} ELM seeds ({', '.join(str(s) for s in seeds)}): f32 NLL "
                f"{', '.join(f'{x:.4f}' for x in f32)} (seed-to-seed sd {f32_sd:.4f}); bf16 "
                f"{', '.join(f'{x:.4f}' for x in bf16)}. Mean bf16 − f32 difference {mean:+.4f}, 95% t interval "
                f"over seeds [{mean - half:+.4f}, {mean + half:+.4f}]: "
                + ("it contains 0, so bf16 training is not distinguishable from the training noise at this "
                   "number of seeds." if within else
                   "it excludes 0, so bf16 training moves the ELM's NLL by more than the training noise.")
                + (f" The largest single-seed shift, {diffs[worst]:+.4f} (seed {seeds[worst]}), is "
                   f"{abs(diffs[worst]) / f32_sd:.1f} times the f32 seed-to-seed sd." if f32_sd > 0 else ""))
    return summary, sentence


def main(argv):
    out, limit, readme = argv[1], argv[2], argv[3]
    rows = []
    for kind, label in (("elm", "ELM (start 12, M = 8), 300 steps"), ("lora", "LoRA-tuned dense, 300 steps")):
        for path in sorted(glob.glob(f"{out}/{kind}-bf16-seed*.json"), key=seed_of):
            rows.append((f"{label}, seed {seed_of(path)}: bf16 vs f32", *paired(path)))
        for path in sorted(glob.glob(f"{out}/{kind}-f32-seed*.json"), key=seed_of):
            rows.append((f"{label}: f32 seed {seed_of(path)} vs f32 seed 0 (training noise)", *paired(path)))

    lines = ["Written by `bash scripts/bf16-quality.sh` (SmolLM2-135M-Instruct Q4_1; each model trained with "
             "`--precision f32` and with `--precision bf16`, same seed and data; answer NLL on "
             f"{limit} held-out GSM8K problems, evaluated in f32; intervals: bootstrap 95% over problems).", "",
             "| model | reference (f32) NLL | compared model's NLL | Δ (compared − reference), paired | 0 in the paired interval? |",
             "|---|---|---|---|---|"]
    for label, m, r, d, verdict in rows:
        lines.append(f"| {label} | {fmt(r)} | {fmt(m)} | {d['value']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] | "
                     f"{'yes' if verdict == 'indistinguishable' else 'no (' + verdict + ')'} |")

    elm = sorted(glob.glob(f"{out}/elm-bf16-seed*.json"), key=seed_of)
    summary = {}
    if len(elm) >= 2:
        pairs = [paired(p) for p in elm]
        f32 = [r["value"] for _, r, _, _ in pairs]
        bf16 = [m["value"] for m, _, _, _ in pairs]
        summary, sentence = across_seeds([seed_of(p) for p in elm], f32, bf16)
        lines += ["", sentence]
    lines += ["", "Each paired interval covers the evaluation's sampling of problems, not training; the rows marked "
              "training noise, and for the ELM the interval over seeds, give the scale a bf16 difference is judged "
              "against. The main job (`small`, `long`) trains and scores with bf16 products since issue 40; `smoke` and `paper` with f32."]
    json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
    open(f"{out}/bf16_quality.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if readme:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from readme_block import rewrite

        rewrite(readme, "bf16-quality", lines)


if __name__ == "__main__":
    main(sys.argv)
