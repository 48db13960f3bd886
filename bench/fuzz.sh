#!/usr/bin/env bash
# Fuzzing (issue 17): builds the libFuzzer harnesses of tests/fuzz in build-fuzz (clang,
# KILTER_FUZZ=ON, CUDA off; kilter's code under ASan+UBSan with fuzzer instrumentation) and runs
# each for N executions, one after the other, then prints a table: harness, executions, exec/s,
# coverage (cov: edges, ft: features), corpus entries, crashes. Findings (crash-*, timeout-*,
# oom-*, leak-* files) are kept in build-fuzz/fuzz-out/<harness>/ with the log; the grown corpora
# in build-fuzz/fuzz-corpus/<harness>/ (the seeds in tests/fuzz/corpus/ are never written to).
#
#   bench/fuzz.sh [--runs N] [--jobs J] [--seconds S] [--smoke] [--no-build] [harness...]
#     --runs N     executions per harness (default 1000000)
#     --seconds S  stop each harness after S seconds instead (with --runs: whichever comes first)
#     --jobs J     parallel build jobs (default 2); fuzzing itself runs one harness at a time
#     --smoke      CI smoke: every harness for a short time (30 s in all), exit 1 on any finding
#     --no-build   use the binaries already in build-fuzz
# Exit status: 0 when no harness found anything, 1 otherwise.
set -euo pipefail
# The whole script is one function, read before it runs: editing this file cannot derail a run.
main() {
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KILTER_FUZZ_BUILD:-$ROOT/build-fuzz}
ALL=(text jsonl fortune sentencepiece tokenizer_json bpe_encode config_ini config_override
     import_llmc import_nanogpt import_megatron import_npy dataset checkpoint safetensors)
RUNS=1000000 SECONDS_EACH=0 JOBS=2 SMOKE=0 BUILD_IT=1
HARNESSES=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) RUNS=$2; shift 2 ;;
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --no-build) BUILD_IT=0; shift ;;
    -h|--help) sed -n '2,17p' "$0"; return 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) HARNESSES+=("$1"); shift ;;
  esac
done
[[ ${#HARNESSES[@]} -gt 0 ]] || HARNESSES=("${ALL[@]}")
for h in "${HARNESSES[@]}"; do
  [[ " ${ALL[*]} " == *" $h "* ]] || { echo "fuzz.sh: unknown harness '$h' (known: ${ALL[*]})" >&2; exit 2; }
done
if [[ $SMOKE == 1 ]]; then
  # About 30 s of fuzzing in all, whatever the number of harnesses.
  # About 30 s in all: each harness also spends about a second starting and loading its corpus.
  SECONDS_EACH=$(( 30 / ${#HARNESSES[@]} - 1 ))
  [[ $SECONDS_EACH -ge 1 ]] || SECONDS_EACH=1
  RUNS=0
fi

if [[ $BUILD_IT == 1 ]]; then
  command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is missing (scripts/install-deps.sh --with-test-extras)" >&2; exit 2; }
  mkdir -p "$BUILD"
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DKILTER_FUZZ=ON -DENABLE_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" >"$BUILD/fuzz-configure.log" 2>&1 \
    || { cat "$BUILD/fuzz-configure.log" >&2; exit 2; }
  targets=()
  for h in "${HARNESSES[@]}"; do targets+=(--target "fuzz_$h"); done
  cmake --build "$BUILD" -j "$JOBS" "${targets[@]}" >"$BUILD/fuzz-build.log" 2>&1 \
    || { tail -50 "$BUILD/fuzz-build.log" >&2; exit 2; }
fi

# Per-harness limits: longest input, time per input, memory. Text-like inputs stay short; the
# importers and the HDF5 builders need room for headers and structure.
max_len() {
  case "$1" in
    text|jsonl|fortune|bpe_encode|config_ini|config_override) echo 4096 ;;
    sentencepiece|tokenizer_json) echo 16384 ;;
    import_*|safetensors) echo 8192 ;;
    dataset|checkpoint) echo 2048 ;;
  esac
}
dict_of() {
  case "$1" in
    config_ini|config_override) echo "$ROOT/tests/fuzz/config.dict" ;;
    jsonl|tokenizer_json|safetensors) echo "$ROOT/tests/fuzz/json.dict" ;;
  esac
}

count_artifacts() { find "$1" -maxdepth 1 \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l; }

# Short allocation stacks and a smaller quarantine: a third less CPU per input in the HDF5
# harnesses, and reports still name the faulting access with its full stack.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:malloc_context_size=4:quarantine_size_mb=32}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
rows=()
found=0
start_all=$(date +%s)
for h in "${HARNESSES[@]}"; do
  out="$BUILD/fuzz-out$([[ $SMOKE == 1 ]] && echo -smoke || true)/$h"  # a smoke never clobbers a long run's log
  corpus="$BUILD/fuzz-corpus/$h"
  if [[ $SMOKE == 1 ]]; then  # from the seeds alone, like a fresh CI machine: same time every run
    corpus="$BUILD/fuzz-corpus-smoke/$h"
    rm -rf "$corpus"
  fi
  mkdir -p "$out" "$corpus"
  args=(-max_len="$(max_len "$h")" -timeout=10 -rss_limit_mb=2560 -malloc_limit_mb=2048
        -print_final_stats=1 -artifact_prefix="$out/" -close_fd_mask=1)
  [[ $RUNS -gt 0 ]] && args+=(-runs="$RUNS")
  [[ $SECONDS_EACH -gt 0 ]] && args+=(-max_total_time="$SECONDS_EACH")
  # The builders' programs need a few hundred bytes to reach deep structure: no slow length ramp.
  [[ $h == dataset || $h == checkpoint ]] && args+=(-len_control=0)
  dict=$(dict_of "$h")
  [[ -n $dict ]] && args+=(-dict="$dict")
  log="$out/fuzz.log"
  before=$(count_artifacts "$out")
  t0=$(date +%s.%N)
  set +e
  (cd "$out" && nice -n 10 "$BUILD/fuzz_$h" "${args[@]}" "$corpus" "$ROOT/tests/fuzz/corpus/$h") >"$log" 2>&1
  rc=$?
  set -e
  t1=$(date +%s.%N)
  execs=$(grep -aoP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -1 || true)
  rate=$(grep -aoP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" | tail -1 || true)
  last=$(grep -aE '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(grep -oP 'cov: \K[0-9]+' <<<"$last" || true)
  ft=$(grep -oP 'ft: \K[0-9]+' <<<"$last" || true)
  corp=$(grep -oP 'corp: \K[0-9]+' <<<"$last" || true)
  crashes=$(( $(count_artifacts "$out") - before ))
  if [[ $rc -ne 0 ]] || grep -aqE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|FUZZ FINDING' "$log"; then
    found=1
    [[ $crashes -gt 0 ]] || crashes=1
    echo "fuzz.sh: $h: FINDING (exit $rc), see $log" >&2
    grep -am5 -E 'ERROR:|runtime error:|FUZZ FINDING|SUMMARY' "$log" >&2 || true
  fi
  rows+=("$(printf '%-16s %12s %8s %7s %7s %6s %8s %7.1f' "$h" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" \
             "${corp:-?}" "$crashes" "$(echo "$t1 - $t0" | bc)")")
done
printf '%-16s %12s %8s %7s %7s %6s %8s %7s\n' harness executions exec/s cov ft corpus crashes seconds
printf '%s\n' "${rows[@]}"
echo "fuzz.sh: ${#HARNESSES[@]} harness(es), $(( $(date +%s) - start_all )) s of fuzzing; logs and findings in $BUILD/fuzz-out$([[ $SMOKE == 1 ]] && echo -smoke || true)/"
return $found
}
main "$@"
