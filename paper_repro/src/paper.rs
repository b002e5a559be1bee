//! What the paper reports for each table, as printed beside ours in `OUT/README.md`. These
//! are the paper's figures (Qwen2.5-1.5B-Instruct and larger models, full MetaMathQA training on
//! GPUs), quoted from the official repository's results as summarised in
//! `shared/notes/elm-reference.md` §9; the paper's ablation tables are not in that repository
//! and could not be retrieved offline, so for those only the claim the table tests is stated,
//! never a number.

/// Table 1 (main table, `assets/performance.png` of the official repository).
pub const MAIN: &str = "Qwen2.5-1.5B-Instruct, M = 8 of 28 layers (the paper states a 28.6% parameter ratio = 8/28 layers; \
the non-embedding reduction is 24.6%): ELM GSM8K 71.8 vs dense (LoRA-tuned) 72.4, MATH 30.5 vs 32.2, average over 8 \
benchmarks 68.1 vs 68.9, retention RP 98.9%; Llama3.2-3B-Instruct RP 99.0%, Qwen2.5-7B-Instruct RP 99.0%. \
Claim checked here: the ELM retains the dense model's quality better than depth-compression baselines at the same M.";

/// Table 2.
pub const KV: &str = "one-step KV keeps one cache for the fixed-point block, so the ELM stores N − M + 1 layer caches \
against N (Qwen2.5-1.5B: 21 against 28, −25%), with no loss against multi-step KV (one cache per iteration). \
The paper's accuracy figures for this ablation are not available offline; the claim checked is the byte ratio \
(measured here, expected (N − M + 1)/N) and equal quality.";

/// Table 3.
pub const SOLVERS: &str = "Anderson acceleration reaches the tolerance in fewer block evaluations than Picard (simple) \
iteration at equal quality, and a looser early-exit threshold trades quality for compute. The paper's figures for this \
ablation are not available offline; the claim checked is the sign of Anderson's saving and the quality at equal δ.";

/// Table 4.
pub const GRAD: &str = "stochastic Jacobian-free backprop (SJFB) trains at a fraction of the time and memory of \
backpropagation through the iterations, with comparable quality. The paper's figures for this ablation are not \
available offline; the claim checked is SJFB's time and peak memory against unroll and implicit differentiation.";

/// Table 5.
pub const SWEEP: &str =
    "the paper reports M = 8 of 28 layers for its main results; quality falls as M grows, and the \
ELM stays above the baselines. The paper's per-M figures are not available offline.";

/// Table 6.
pub const WHERE: &str = "GPPO learns a policy over the start layer of the replaced window (L − M + 1 = 21 candidates for \
Qwen2.5-1.5B, M = 8) from the CE reward of candidate modules trained as it samples; the official ELM run uses the start \
layer s = 2 (layers 2–9), an early window. The paper does not publish an exhaustive enumeration to check the policy against; \
here every selector's choice is placed in one.";

/// Table 7.
pub const SPECTRAL: &str = "the fixed-point iteration converges because the trained map is contractive around its \
fixed point (ρ < 1 is the local condition; Picard's error shrinks by about ρ per iteration). The canonical \
problems check the solvers themselves against closed-form solutions.";

/// Closing note on the scales.
pub const CURVES: &str = "no learning curve: the ELM is trained for two epochs of MetaMathQA on 8 GPUs and compared with \
baselines at that one budget only.";
pub const SEEDS: &str = "one run per configuration; no spread over seeds is reported.";
pub const SCALES: &str = "## Scales and run times\n\n\
- `smoke` (CI, part of `cargo test -p paper_repro`): every table at toy sizes (2 training steps, 1–2 problems); \
about 2 minutes on 2 cores; checks that every table is filled, not the figures.\n\
- `small` (the main job): SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to f32 weights, bf16 products) on the CPU; the \
compute time of this run is stated at the top of this page (main results and the LoRA reference: 300 steps × 2 × 128 \
tokens per trained model; ablations: 60 steps; table 6: GPPO 100 steps, enumeration of every 2nd start × 8 steps; a \
seeded sample of 300 test problems for table 1's NLL and its 60 first for the ablations, 100 validation problems for \
every selection, 16 test problems for exact match). The stage cache makes a rerun after a kill resume where it stopped.\n\
- `long` (`SCALE=long bash scripts/main.sh`, into `results/long/`): `small`'s tables (read from `small`'s stage \
records when it ran first, with table 1's two extra rows) plus table 1b (the headline rows and the controls on all 1,319 \
test problems), table 8 (learning curves at 75, 150, 300 and 600 steps, the reference ELM, the best healed baseline and \
the tuned dense model also at 1,200 and 2,400: a 32× span), table 9 (three seeds of the headline rows), table 6b (every \
start trained) and table 10 (the collapse diagnosis); its own compute time is stated at the top of its page.\n\
- `paper`: `--model` pointing at a local HF directory of Qwen2.5-1.5B-Instruct (config.json, safetensors, \
tokenizer.json), the full GSM8K test set, 2000 steps × 8 × 256 tokens; days on a CPU (training runs on the CPU \
library; a GPU speeds up only dense decoding and benchmarks).\n";

/// The paper's Anderson saving over Picard at M = 14 (the claims table's threshold).
pub const ANDERSON_SAVING: f64 = 0.386;

/// The paper's claims the claims table checks, each with the paper's figure (quoted from
/// `shared/notes/elm-reference.md` §9 where it gives one; otherwise only the claim, and
/// "not available offline"), in the order `claims::paper_claims_table` fills them.
pub const CLAIMS: [(&str, &str); 8] = [
    (
        "parameters removed",
        "M = 8 of 28 layers of Qwen2.5-1.5B-Instruct (28.6% of the layers, 24.6% of the non-embedding parameters)",
    ),
    (
        "KV cache saved",
        "one-step KV: N − M + 1 layer caches of N (21 of 28, −25%), no loss against multi-step KV",
    ),
    (
        "retention (RP) against the LoRA-tuned dense model",
        "RP 98.9% (Qwen2.5-1.5B; GSM8K 71.8 vs 72.4), 99.0% (Llama3.2-3B, Qwen2.5-7B)",
    ),
    (
        "the ELM against depth-compression baselines at the same M",
        "the ELM retains more than every baseline of the main table",
    ),
    (
        "Anderson's compute saving over Picard",
        "38.6% less computation at M = 14",
    ),
    (
        "decode speed",
        "faster decoding than the dense model (figure not available offline)",
    ),
    (
        "SJFB's training time and memory",
        "a fraction of the time and memory of backpropagating through the iterations (figures not available offline)",
    ),
    (
        "GPPO finds where to prune",
        "a learned policy over the start layer picks the window (the official run: s = 2)",
    ),
];
