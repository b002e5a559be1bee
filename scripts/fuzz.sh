#!/usr/bin/env bash
# Fuzzes the model-file readers (issue 59): the libFuzzer targets of fuzz/ (a cargo-fuzz crate
# outside the workspace), each for SECONDS_PER_TARGET seconds.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
#   scripts/fuzz.sh          the test tier: 30 s per target (~6 min with the build done)
#   scripts/fuzz.sh 1800     the long run: 30 minutes per target (3 hours)
#   scripts/fuzz.sh 120 gguf_reader tokenizer_json     some targets only
#
# Targets: gguf_reader gguf_tokenizer tokenizer_json hf_config safetensors tensor_file
# (fuzz/README.md says what each feeds and checks).
#
# Steps: installs cargo-fuzz if missing (`cargo install cargo-fuzz --locked`); builds the targets
# with the stable toolchain through RUSTC_BOOTSTRAP=1 (cargo-fuzz passes nightly-only flags:
# AddressSanitizer, coverage instrumentation; debug assertions and overflow checks are on);
# regenerates the seed corpora (fuzz/gen_seeds.rs -> fuzz/seeds/, plus git-ignored real-* seeds
# when the SmolLM2 GGUF is in $ELM_MODELS_DIR or models/); replays every saved reproducer of
# fuzz/regressions/<target>/; then fuzzes each target with
#   -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10   (override: ELM_FUZZ_ARGS)
# its growing corpus in fuzz/corpus/<target>/ (git-ignored, kept between runs) and what it
# finds in fuzz/artifacts/<target>/ (crash-*, timeout-*, oom-*; git-ignored).
#
# Prints per target: executions, coverage (libFuzzer's final `cov:` edges and `ft:` features),
# corpus size, and the crashes found; writes the same as JSON to target/fuzz-summary.json
# (ELM_FUZZ_SUMMARY overrides). Exits 1 if any target found a crash, timeout or OOM, or a saved
# reproducer still fails.
#
# ELM_FUZZ_KEEP_GOING=1 keeps fuzzing after a crash (libFuzzer -fork=1 -ignore_crashes=1
# -ignore_timeouts=1 -ignore_ooms=1), to collect several in one run; exit status as above.
# ELM_FUZZ_IGNORE_PANICS=substring,... looks past panics already reported (fuzz/src/lib.rs
# `guarded`: a panic whose `file:line:col: message` holds one of them is not a crash), with a
# corpus of its own (fuzz/corpus/<target>.ignoring-known), e.g.
#   ELM_FUZZ_IGNORE_PANICS="src/formats/gguf.rs:462,decoders/mod.rs:90,outside vocab_size"
# ELM_FUZZ_CGU: codegen units of the build (default 16: a 2-core machine builds elm in ~9 min
# instead of far longer with cargo-fuzz's default of 1; the fuzzing speed barely changes).
# To fuzz by hand with the same build: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run
# --codegen-units 16 gguf_reader corpus/gguf_reader seeds/gguf_reader -- -dict=dicts/gguf.dict`
# (another --codegen-units value rebuilds everything).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

secs=${1:-30}
shift || true
all_targets=(gguf_reader gguf_tokenizer tokenizer_json hf_config safetensors tensor_file)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
case "$secs" in '' | *[!0-9]*) echo "SECONDS_PER_TARGET must be a number, got '$secs'" >&2; exit 2 ;; esac
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "unknown target '$t' (${all_targets[*]})" >&2; exit 2; }
done

dict_of() {
  case "$1" in
    gguf_reader | gguf_tokenizer) echo gguf.dict ;;
    tokenizer_json) echo tokenizer_json.dict ;;
    hf_config) echo hf_config.dict ;;
    safetensors | tensor_file) echo safetensors.dict ;;
  esac
}

export CARGO_INCREMENTAL=0 RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version > /dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
cgu=${ELM_FUZZ_CGU:-16}
# AddressSanitizer always: its runtime also supplies the coverage hooks that the seed generator
# (a plain bin of the crate, built with the same instrumentation) links against, so `-s none`
# does not link. ELM_FUZZ_TARGET_DIR moves the build (default fuzz/target).
target_dir=${ELM_FUZZ_TARGET_DIR:-$root/fuzz/target}
(cd fuzz && cargo fuzz build --codegen-units "$cgu" --target-dir "$target_dir" 2>&1)
bin=$target_dir/x86_64-unknown-linux-gnu/release

# The binaries are ASan builds: leak checking at exit would report rayon's parked pool.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
export ELM_MODELS_DIR="${ELM_MODELS_DIR:-$root/models}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export ELM_FUZZ_TMP=$tmp
"$bin/gen_seeds" "$root/fuzz/seeds"

limits=${ELM_FUZZ_ARGS:--rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10}
keep_going=()
[ "${ELM_FUZZ_KEEP_GOING:-0}" = 1 ] && keep_going=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
summary=${ELM_FUZZ_SUMMARY:-$root/target/fuzz-summary.json}
logs=$root/target/fuzz-logs
mkdir -p "$logs" "$(dirname "$summary")"

# One JSON list of already-formatted items.
join() { local IFS=,; echo "$*"; }
# Where FILE makes TARGET fail: `panic at FILE:LINE:COL`, libFuzzer's or ASan's error kind
# (timeout, out-of-memory, ...), or `did not fail on replay`.
where_fails() {
  local place
  # shellcheck disable=SC2086  # $limits is a list of flags
  place=$(timeout 60 "$bin/$1" $limits "$2" 2>&1 |
    sed -nE 's/.*panicked at ([^ ]+):$/panic at \1/p; s/.*ERROR: (libFuzzer|AddressSanitizer): ([a-z-]+).*/\1 \2/p' |
    head -n 1)
  echo "${place:-did not fail on replay}"
}

failed=0
json_targets=()
printf '%-15s %10s %8s %8s %7s  %s\n' target executions cov ft corpus crashes
for t in "${targets[@]}"; do
  corpus=$root/fuzz/corpus/$t
  # Inputs that hit an ignored panic stay in the corpus: keep them out of the normal one.
  [ -z "${ELM_FUZZ_IGNORE_PANICS:-}" ] || corpus=$root/fuzz/corpus/$t.ignoring-known
  artifacts=$root/fuzz/artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  dict=$root/fuzz/dicts/$(dict_of "$t")

  # Saved reproducers: each must now load (or fail with a typed error) without a crash.
  still_failing=()
  still_failing_json=()
  for f in fuzz/regressions/"$t"/*; do
    [ -f "$f" ] || continue
    # shellcheck disable=SC2086  # $limits is a list of flags
    if ! "$bin/$t" $limits "$f" > "$logs/$t.regression.log" 2>&1; then
      place=$(where_fails "$t" "$f")
      still_failing+=("$f")
      still_failing_json+=("$(printf '{"file": "%s", "where": "%s"}' "$f" "$place")")
      echo "regression still fails: $f: $place" >&2
    fi
  done

  before=$(ls "$artifacts" | sort)
  set +e
  # shellcheck disable=SC2086  # $limits is a list of flags
  "$bin/$t" "$corpus" "$root/fuzz/seeds/$t" -dict="$dict" -max_total_time="$secs" $limits \
    "${keep_going[@]}" -print_final_stats=1 -artifact_prefix="$artifacts/" > "$logs/$t.log" 2>&1
  rc=$?
  set -e
  after=$(ls "$artifacts" | sort)
  new=$(comm -13 <(echo "$before") <(echo "$after") | grep -E '^(crash|timeout|oom|leak)-' || true)

  # libFuzzer's last status line (`#N DONE cov: C ft: F corp: K/...`, or `#N: cov: ...` in fork
  # mode) and its final stats.
  status=$(grep -E '^#[0-9]+:?[[:space:]].*cov: ' "$logs/$t.log" | tail -n 1 || true)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<< "$status")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<< "$status")
  corp=$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<< "$status")
  # (Fork mode: the parent's count; the stats lines there are a crashed child's.)
  execs=$(sed -nE 's/^#([0-9]+):?[[:space:]].*/\1/p' <<< "$status")
  if [ ${#keep_going[@]} -eq 0 ]; then
    execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$logs/$t.log" | tail -n 1)
  fi
  n_new=$(grep -c . <<< "$new" || true)
  printf '%-15s %10s %8s %8s %7s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$n_new"
  # Where each new artifact fails (the first 50, replayed once), counted per place.
  crashes_json=()
  places=()
  for f in $(head -n 50 <<< "$new"); do
    place=$(where_fails "$t" "$artifacts/$f")
    places+=("$place")
    crashes_json+=("$(printf '{"file": "fuzz/artifacts/%s/%s", "where": "%s"}' "$t" "$f" "$place")")
    [ ${#places[@]} -gt 10 ] || echo "  fuzz/artifacts/$t/$f: $place"
  done
  if [ "$n_new" -gt 10 ]; then
    echo "  ... $((n_new - 10)) more in fuzz/artifacts/$t/; by place (first 50):"
    printf '%s\n' "${places[@]}" | sort | uniq -c | sort -rn | sed 's/^/    /'
  fi
  if [ "$n_new" -gt 0 ] || [ ${#still_failing[@]} -gt 0 ] || { [ $rc -ne 0 ] && [ ${#keep_going[@]} -eq 0 ]; }; then
    failed=1
    [ "$n_new" -gt 0 ] || [ ${#still_failing[@]} -gt 0 ] || echo "  libFuzzer exited with $rc (log: $logs/$t.log)"
  fi

  json_targets+=("$(printf '{"target": "%s", "seconds": %s, "executions": %s, "cov": %s, "ft": %s, "corpus": %s, "exit_code": %s, "crashes": [%s], "regressions_failing": [%s], "log": "%s"}' \
    "$t" "$secs" "${execs:-null}" "${cov:-null}" "${ft:-null}" "${corp:-null}" "$rc" \
    "$(join "${crashes_json[@]}")" "$(join "${still_failing_json[@]}")" "target/fuzz-logs/$t.log")")
done

{
  printf '{\n  "seconds_per_target": %s,\n  "ok": %s,\n  "targets": [\n' "$secs" "$([ $failed = 0 ] && echo true || echo false)"
  for i in "${!json_targets[@]}"; do
    printf '    %s%s\n' "${json_targets[$i]}" "$([ "$i" -lt $((${#json_targets[@]} - 1)) ] && echo ,)"
  done
  printf '  ]\n}\n'
} > "$summary"
echo "summary: $summary"
if [ $failed = 1 ]; then
  echo "fuzzing found crashes (reproduce: $bin/TARGET FILE;" \
    "minimize: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz tmin --codegen-units $cgu TARGET FILE)" >&2
  exit 1
fi
