#!/usr/bin/env bash
# The test command (README, .ci/run): installs its own system needs, fetches the real
# SmolLM2 checkpoint, runs the whole suite, and checks that the `cuda` feature builds.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each part of the suite is timed (`part NAME CMD...`): its time is printed when it ends, and all
# of them again at the end (also on a failure, up to the part that failed).
part_times=()
part() {
  local name="$1"; shift
  local start=$SECONDS
  echo "== $name"
  "$@"
  part_times+=("$(printf '%5ds  %s' $((SECONDS - start)) "$name")")
  echo "== $name: $((SECONDS - start)) s"
}
finish() {
  if declare -F skip_summary > /dev/null; then skip_summary; fi
  echo "time of each part:"
  printf '  %s\n' "${part_times[@]}"
}
trap finish EXIT
part "system needs and models (scripts/setup.sh)" bash scripts/setup.sh
export ELM_MODELS_DIR="${ELM_MODELS_DIR:-$PWD/models}"
# A missing prerequisite (the real model, fiu-run, bwrap, AVX-512 where a test claims its
# kernel) fails its test instead of skipping it (tests/common/skip.rs; `CI` set does the same).
export ELM_REQUIRE_REAL_MODEL=1
# Every skip appends a line to this log: cleared now, counted (with its lines) when the script
# ends, also on a failure. Only optional skips (no GPU, no NVRTC, a busy thread team) can be
# there, since the required ones fail.
export ELM_SKIP_LOG="${ELM_SKIP_LOG:-$PWD/target/test-skips.log}"
mkdir -p "$(dirname "$ELM_SKIP_LOG")"
: > "$ELM_SKIP_LOG"
skip_summary() {
  local n optional
  n=$(wc -l < "$ELM_SKIP_LOG")
  optional=$(grep -c '(optional)' "$ELM_SKIP_LOG" || true)
  echo "$n tests skipped ($optional of them optional: hardware or tools a machine may lack)"
  sed 's/^/  /' "$ELM_SKIP_LOG"
}
# A clean checkout gains nothing from incremental compilation, which would keep a second copy of
# every test binary's code (4.7 GB on a clean run); the disk left is printed for a failure's sake.
export CARGO_INCREMENTAL=0
df -h . | tail -n 1 | awk '{print "disk: " $4 " free of " $2}'
# Style gates over the whole tree (library, binaries, tests, examples, benches; both CUDA twins).
part "cargo fmt --check" cargo fmt --all -- --check
part "clippy" cargo clippy --workspace --all-targets -- -D warnings 2>&1
part "clippy --features cuda" cargo clippy --workspace --all-targets --features cuda -- -D warnings 2>&1
part "cargo test --workspace" cargo test --workspace --all-targets --no-fail-fast 2>&1
# `--all-targets` leaves doc-tests out: the API's examples and the README's and docs/'s Rust
# snippets (src/lib.rs's doc_snippets) run here.
part "doc-tests (API, README.md, docs/)" cargo test --workspace --doc 2>&1
# The solver crate on its own: no BLAS, LAPACK or tokenizer crate in its tree, its tests built
# in a target dir of their own (so no workspace feature reaches them), and no test binary linked
# against OpenBLAS or LAPACK.
if cargo tree -p elm-solver -e normal --features serde | grep -iE 'blas|lapack|tokeniz'; then
  echo "elm-solver depends on a BLAS/LAPACK/tokenizer crate" >&2; exit 1
fi
part "elm-solver alone" env CARGO_TARGET_DIR=target-solver cargo test -p elm-solver --features serde 2>&1
for bin in $(find target-solver/debug/deps -maxdepth 1 -type f -executable -name '*-*'); do
  if ldd "$bin" | grep -iE 'openblas|lapack|blas'; then
    echo "$bin links a BLAS/LAPACK library" >&2; exit 1
  fi
done
# A solver written outside the library trains the DEQ example (forward and backward solver).
part "deq_classifier example" cargo run --quiet --example deq_classifier -- --solver adaptive-picard --steps 40 --check 2>&1
# The Python package: built from the repository into a venv, its pytest tests (python/tests).
part "Python package (scripts/python-test.sh)" bash scripts/python-test.sh
# The model-file readers under libFuzzer and AddressSanitizer (issue 59): every saved reproducer
# replayed, then each of the six targets fuzzed for 10 s (about 5 minutes of build on 2 cores).
# Panics inside the `tokenizers` crate itself (upstream bugs on malformed tokenizer.json
# sections; the ones found so far are refused before the crate sees them) are looked past here,
# so that a random 10 s run cannot fail CI on a third-party bug; every panic of ours still fails
# it, and the long run (`bash scripts/fuzz.sh 1800`, 30 minutes per target) reports them all.
part "fuzz, 10 s per target" env ELM_FUZZ_IGNORE_PANICS="tokenizers-0.21.4/src/" bash scripts/fuzz.sh 10
# CI has no GPU and no CUDA toolkit: the feature must still build (GPU tests skip themselves).
part "build --features cuda" cargo build --lib --features cuda 2>&1
part "CUDA tests (skip without a GPU)" cargo test --features cuda --test cuda 2>&1
# No required prerequisite was skipped (each would have failed its test; this guards the log).
if grep -v '(optional)' "$ELM_SKIP_LOG" | grep -q .; then
  echo "a test skipped a required prerequisite" >&2; exit 1
fi
