#!/usr/bin/env bash
# Training speed against PyTorch on this CPU (issue 25), in one invocation and with the same
# threads: the ELM training step (distillation phase, CE phase, each with and without the
# teacher cache; examples/train_profile.rs), the LoRA SFT step, and PyTorch eager's same steps in f32 and bf16
# autocast (scripts/torch_train_ref.py, same shapes and supervised-token count). Prints one JSON
# object: both sides' tok/s and ours over theirs. Needs `torch` (TORCH_PY: a python that has it;
# default: a venv in target/torch-venv made on first use). Also writes the object to
# results/bench_train.json (OUT= to change), which docs/performance.md points to.
# The training steps, ours and PyTorch's, run in REPS rounds (default 3), both sides in every
# round, and each phase reports its median over the rounds: this VM's speed drifts by 10-30%
# over minutes, and a ratio of two single runs minutes apart carried that drift.
# About 9 minutes on 2 cores once built.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${THREADS:-2}"
steps="${STEPS:-4}"
reps="${REPS:-3}"
rounds=$(mktemp -d)
trap 'rm -rf "$rounds"' EXIT
py="${TORCH_PY:-}"
if [ -z "$py" ]; then
  py=target/torch-venv/bin/python
  if ! [ -x "$py" ] || ! "$py" -c "import torch" 2>/dev/null; then
    python3 -m venv target/torch-venv
    target/torch-venv/bin/pip install -q torch numpy >&2
  fi
fi
cargo build --release --example train_profile --example gemm_bench --bin elm >&2
model="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || bash scripts/fetch-smollm2.sh >&2
gemm=$(OPENBLAS_NUM_THREADS="$threads" RAYON_NUM_THREADS="$threads" target/release/examples/gemm_bench)
# OpenBLAS's threads are left to the example (one when our GEMM carries the large products).
export RAYON_NUM_THREADS="$threads"
# The same with glibc's default of returning freed blocks to the kernel (src/heap.rs).
glibc=$(ELM_KEEP_HEAP=0 target/release/examples/train_profile --steps "$steps" --json)
# The same on the linked BLAS for every product (OpenBLAS with a thread per core).
blas=$(ELM_GEMM=blas OPENBLAS_NUM_THREADS="$threads" target/release/examples/train_profile --steps "$steps" --json)
sup=$(echo "$glibc" | "$py" -c "import json,sys; print(round(json.load(sys.stdin)['supervised_tokens']))")
# Dense prefill of 256 tokens (f32 weights), ours and PyTorch's, f32 and bf16.
pre() { RAYON_NUM_THREADS="$threads" target/release/elm bench --model "$model" --prompt-len 256 --decode-steps 4 --json "$@"; }
p32=$(pre); pbf=$(pre --precision bf16 2>/dev/null || echo null)
# The evaluation's teacher-forced answer NLL over 300 GSM8K test problems (dense model).
nll=$(RAYON_NUM_THREADS="$threads" target/release/elm eval --model "$model" --task gsm8k-nll --limit 300 --json)
tpre() { "$py" scripts/torch_ref_bench.py --model smollm2-135m --device cpu --prefill-len 256 --batches 1 --steps 2 --reps 5 --threads "$threads" "$@"; }
tp32=$(tpre); tpbf=$(tpre --bf16)
ref() { "$py" scripts/torch_train_ref.py --threads "$threads" --steps "$steps" --supervised "$sup" "$@"; }
for r in $(seq "$reps"); do
  target/release/examples/train_profile --steps "$steps" --json > "$rounds/ours-$r.json"
  # bf16 mode where the CPU has AVX-512 BF16 (else null).
  target/release/examples/train_profile --steps "$steps" --precision bf16 --json 2>/dev/null \
    > "$rounds/bf16-$r.json" || echo null > "$rounds/bf16-$r.json"
  ref --dtype f32 > "$rounds/t32-$r.json"
  ref --dtype f32 --teacher-cache --phases distill,ce > "$rounds/t32c-$r.json"
  ref --dtype bf16 > "$rounds/tbf-$r.json"
  ref --dtype bf16 --teacher-cache --phases distill,ce > "$rounds/tbfc-$r.json"
done
"$py" - "${OUT:-results/bench_train.json}" "${README:-}" "threads=$threads steps=$steps rounds=$reps" "$rounds" "$nll" "$p32" "$pbf" "$tp32" "$tpbf" "$gemm" "$blas" "$glibc" <<'PY'
import glob, json, os, statistics, sys
out, readme, how, rounds = sys.argv[1:5]
threads = how.split()[0].split("=")[1]
nll, p32, pbf, tp32, tpbf, gemm, blas, glibc = (json.loads(a) for a in sys.argv[5:])

def median_of(name):
    """The rounds of one side: the first round's report with every phase's tok/s replaced by
    its median over the rounds (and the rounds' values kept beside it)."""
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{rounds}/{name}-*.json"))]
    if not runs or runs[0] is None:
        return None
    merged = dict(runs[0])
    merged["phases"] = {}
    for phase in runs[0]["phases"]:
        values = [r["phases"][phase]["tok_s"] for r in runs]
        merged["phases"][phase] = {"tok_s": statistics.median(values), "rounds_tok_s": values}
    return merged

ours, ours_bf16, t32, t32c, tbf, tbfc = (median_of(n) for n in ("ours", "bf16", "t32", "t32c", "tbf", "tbfc"))
prefill = {
    "elm_f32_tok_s": p32["prefill_tok_s"],
    "elm_bf16_tok_s": pbf["prefill_tok_s"] if pbf else None,
    "torch_f32_tok_s": tp32["prefill_tok_s"],
    "torch_bf16_tok_s": tpbf["prefill_tok_s"],
}
def row(key, phase, f32, bf16):
    """One step's row: our phase `key` (of train_profile) against PyTorch's `phase`, f32 and bf16."""
    mine = ours["phases"][key]["tok_s"]
    mine_bf16 = ours_bf16["phases"][key]["tok_s"] if ours_bf16 else None
    return {
        "elm_f32_tok_s": mine,
        "elm_bf16_tok_s": mine_bf16,
        "ratio_bf16_vs_torch_bf16": mine_bf16 / bf16["phases"][phase]["tok_s"] if mine_bf16 else None,
        "torch_f32_tok_s": f32["phases"][phase]["tok_s"],
        "torch_bf16_tok_s": bf16["phases"][phase]["tok_s"],
        "ratio_vs_torch_f32": mine / f32["phases"][phase]["tok_s"],
        "ratio_vs_torch_bf16": mine / bf16["phases"][phase]["tok_s"],
        "rounds_tok_s": {"elm_f32": ours["phases"][key]["rounds_tok_s"],
                         "elm_bf16": ours_bf16["phases"][key]["rounds_tok_s"] if ours_bf16 else None,
                         "torch_f32": f32["phases"][phase]["rounds_tok_s"],
                         "torch_bf16": bf16["phases"][phase]["rounds_tok_s"]},
    }

rows = {}
for phase in ("distill", "ce"):
    for cached, (f32, bf16) in ((False, (t32, tbf)), (True, (t32c, tbfc))):
        key = phase + ("_teacher_cache" if cached else "")
        rows[key] = row(key, phase, f32, bf16)
rows["lora"] = row("lora", "lora", t32, tbf)
report = json.dumps({"threads": ours["threads"], "batch": ours["batch"], "seq_len": ours["seq_len"],
                     "supervised_tokens": ours["supervised_tokens"], "torch": t32["torch"],
                     "elm_peak_rss_bytes": ours["peak_rss_bytes"],
                     "freed_memory_kept": ours["freed_memory_kept"],
                     "minor_faults_and_system_seconds": ours["minor_faults_and_system_seconds"],
                     "gemm_kernel": ours["gemm_kernel"], "openblas_threads": ours["openblas_threads"],
                     "blas_kernel": {"phases": blas["phases"]}, "gemm_shapes": gemm,
                     "glibc_default": {"phases": glibc["phases"], "minor_faults_and_system_seconds":
                                       glibc["minor_faults_and_system_seconds"]},
                     "dense_prefill_256": prefill,
                     "gsm8k_nll_300_seconds": nll["seconds"], "phases": rows}, indent=1)
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out + ".tmp", "w") as f:
    f.write(report + "\n")
os.replace(out + ".tmp", out)
print(report)
if readme:
    # The README's block between the train-perf markers, rewritten from this run only.
    names = {"distill": "ELM step, distillation phase", "ce": "ELM step, CE phase (back layers, head, CE)",
             "lora": "LoRA SFT step (rank 16, 7 maps x 30 layers)"}
    lines = [f"Generated by `README={readme} bash scripts/bench-train.sh` ({how}; PyTorch "
             f"{t32['torch']}, eager; batch {ours['batch']} x {ours['seq_len']}, "
             f"{ours['supervised_tokens']:.0f} supervised tokens per batch; tok/s, each the median of "
             f"{how.split('rounds=')[1]} rounds that ran both sides; ratios ours / PyTorch).",
             "",
             "| step | elm f32 | PyTorch f32 | f32 ratio | elm bf16 | PyTorch bf16 autocast | bf16 ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, r in rows.items():
        phase = key.replace("_teacher_cache", "")
        label = names[phase] + (", teacher cache" if key.endswith("_teacher_cache") else "")
        eb = r["elm_bf16_tok_s"]
        lines.append(f"| {label} | {r['elm_f32_tok_s']:.0f} | {r['torch_f32_tok_s']:.0f} | "
                     f"{r['ratio_vs_torch_f32']:.2f}x | {'–' if eb is None else f'{eb:.0f}'} | "
                     f"{r['torch_bf16_tok_s']:.0f} | "
                     + ("– (no AVX-512 BF16)" if eb is None else f"{r['ratio_bf16_vs_torch_bf16']:.2f}x") + " |")
    pb = prefill["elm_bf16_tok_s"]
    lines.append(f"| dense prefill, 256 tokens | {prefill['elm_f32_tok_s']:.0f} | {prefill['torch_f32_tok_s']:.0f} | "
                 f"{prefill['elm_f32_tok_s'] / prefill['torch_f32_tok_s']:.2f}x | "
                 f"{'–' if pb is None else f'{pb:.0f}'} | {prefill['torch_bf16_tok_s']:.0f} | "
                 + ("–" if pb is None else f"{pb / prefill['torch_bf16_tok_s']:.2f}x") + " |")
    (f0, s0), (f1, s1) = (glibc["minor_faults_and_system_seconds"],
                          ours["minor_faults_and_system_seconds"])
    lines += ["", f"Teacher-forced answer NLL of the dense model over {nll['n']} GSM8K test problems "
              f"(`elm eval --task gsm8k-nll --limit 300`): {nll['seconds']:.1f} s."]
    lines += ["", f"GEMM kernel `{ours['gemm_kernel']}` (OpenBLAS {ours['openblas_threads']} thread(s) beside "
              f"it); every product on OpenBLAS instead (`ELM_GEMM=blas`, {threads} threads): "
              + ", ".join(f"{k.replace('_teacher_cache', ' cached')} {blas['phases'][k]['tok_s']:.0f}"
                          for k in rows) + " tok/s."]
    lines += ["", f"GEMM alone (`examples/gemm_bench.rs`, {gemm['threads']} threads, measured FMA peak "
              f"{gemm['peak_fma_gflop_s']:.0f} GFLOP/s):", "",
              "| shape | OpenBLAS GFLOP/s | ours GFLOP/s | ours / OpenBLAS | ours / peak | ours, B frozen / peak "
              "| ours bf16 GFLOP/s | bf16 / bf16 peak | bf16, B frozen / bf16 peak |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    opt = lambda v, fmt: "–" if v is None else format(v, fmt)
    lines += [f"| {r['shape']} | {r['blas_gflop_s']:.0f} | {r['avx512_gflop_s']:.0f} | {r['ratio']:.2f}x | "
              f"{r['avx512_fraction_of_peak']:.2f} | {opt(r.get('avx512_frozen_b_fraction_of_peak'), '.2f')} | "
              f"{opt(r.get('avx512_bf16_gflop_s'), '.0f')} | {opt(r.get('bf16_fraction_of_bf16_peak'), '.2f')} | "
              f"{opt(r.get('bf16_frozen_b_fraction_of_bf16_peak'), '.2f')} |" for r in gemm["shapes"]]
    lines += ["", "B frozen: the weight registered with `gemm::FrozenWeights` (packed once, as the trainers "
              "and NLL scoring do for weights they never change); the dW product's B is an activation. "
              "The bf16 peak is twice the FMA peak (two multiply-adds per lane per `vdpbf16ps`)."]
    lines += ["", f"Freed memory kept in the process (`src/heap.rs`) against glibc's default "
              f"(`ELM_KEEP_HEAP=0`), whole benchmark: {f0 / 1e6:.2f} M → {f1 / 1e6:.2f} M minor page "
              f"faults, {s0:.1f} s → {s1:.1f} s system time; CE phase {glibc['phases']['ce']['tok_s']:.0f}"
              f" → {ours['phases']['ce']['tok_s']:.0f} tok/s."]
    sys.path.insert(0, "scripts")
    from readme_block import rewrite
    rewrite(readme, "train-perf", lines)
PY
