#!/usr/bin/env bash
# One-command comparison with llama.cpp on the same GGUF and the same thread count, in one run:
# `elm bench --weights f32,auto [--elm CKPT]` then llama.cpp (llama-cpp-python) prefill and
# batch-1 decode, alternated REPS times so both see the same interference; prints one JSON
# object with every figure and the ratios ours / llama.cpp.
#
#   bash scripts/llama-cpp-compare.sh [MODEL.gguf]          (env: THREADS, REPS, ELM_CKPT,
#                                                             PROMPT_LEN, DECODE_STEPS, ROUNDS, LLAMA_VENV,
#                                                             LLAMA_PY, README, BLOCK)
#
# With README=PATH the table and the targets' verdicts (markdown, from this run's figures) also
# replace the block between `<!-- $BLOCK:begin -->` and `<!-- $BLOCK:end -->` of PATH (BLOCK
# defaults to `perf`, the SmolLM2 block; the Gemma 3 block is `perf-gemma3`).
#
# llama-cpp-python is installed with pip into $LLAMA_VENV (it builds llama.cpp from source:
# ~10-20 min on 2 busy cores the first time), unless LLAMA_PY names a Python that has it.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-${ELM_MODELS_DIR:-models}/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-3}  # ELM-vs-dense rounds per repetition (elm bench --rounds; with ELM_CKPT)
PROMPT_LEN=${PROMPT_LEN:-128}
DECODE_STEPS=${DECODE_STEPS:-64}
LLAMA_VENV=${LLAMA_VENV:-$HOME/.cache/elm-llama-venv}
LLAMA_PY=${LLAMA_PY:-$LLAMA_VENV/bin/python}
BLOCK=${BLOCK:-perf}

if ! "$LLAMA_PY" -c "import llama_cpp" 2>/dev/null; then
  echo "installing llama-cpp-python into $LLAMA_VENV (builds llama.cpp)..." >&2
  python3 -m venv "$LLAMA_VENV"
  CMAKE_BUILD_PARALLEL_LEVEL=$THREADS "$LLAMA_VENV/bin/pip" install -q llama-cpp-python >&2
  LLAMA_PY=$LLAMA_VENV/bin/python
fi
cargo build --release --bin elm >&2
ELM_BIN=${CARGO_TARGET_DIR:-target}/release/elm

OUT=$(mktemp -d)
ELM_ARGS=()
if [ -n "${ELM_CKPT:-}" ]; then ELM_ARGS=(--elm "$ELM_CKPT"); fi
for r in $(seq 1 "$REPS"); do
  echo "rep $r/$REPS: elm bench" >&2
  # The spin team uses one thread per available core: pin to THREADS cores.
  taskset -c "0-$((THREADS - 1))" "$ELM_BIN" bench --model "$MODEL" --weights f32,auto \
    --prompt-len "$PROMPT_LEN" --decode-steps "$DECODE_STEPS" "${ELM_ARGS[@]}" --rounds "$ROUNDS" --json > "$OUT/elm_$r.json"
  echo "rep $r/$REPS: llama.cpp" >&2
  "$LLAMA_PY" - "$MODEL" "$THREADS" "$PROMPT_LEN" "$DECODE_STEPS" > "$OUT/llama_$r.json" <<'EOF'
import json, sys, time
from llama_cpp import Llama
model, threads, prompt_len, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=prompt_len + steps + 32,
            n_batch=max(prompt_len, 32), verbose=False)
vocab = llm.n_vocab()
prompt = [(i * 7919 + 13) % vocab for i in range(prompt_len)]
best_prefill = float("inf")
for _ in range(3):
    llm.reset()
    t = time.perf_counter(); llm.eval(prompt); best_prefill = min(best_prefill, time.perf_counter() - t)
# Batch-1 decode after a 16-token prompt; per-step times (best and mean, like elm bench).
llm.reset(); llm.eval(prompt[:16])
times = []
tok = 1
for _ in range(steps):
    t = time.perf_counter(); llm.eval([tok]); times.append(time.perf_counter() - t)
    tok = (tok * 31 + 7) % vocab  # fixed token stream: decode cost does not depend on it
print(json.dumps({"prefill_tok_s": prompt_len / best_prefill, "decode_b1_tok_s": 1 / min(times),
                  "decode_b1_mean_tok_s": steps / sum(times), "threads": threads}))
EOF
done

python3 scripts/analysis/llama_cpp_compare.py "$OUT" "$REPS" "$MODEL" "$THREADS" "${README:-}" "${ELM_CKPT:-}" "$PROMPT_LEN" "$DECODE_STEPS" "$BLOCK"
