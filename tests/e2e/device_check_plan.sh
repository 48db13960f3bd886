#!/usr/bin/env bash
# The device check's parts a CPU can check (tests/gpu/device-check.sh): its plan fits 8 minutes on
# an H100 with stage A (correctness, the op table and the SDPA test first) within 4 and stage B
# (speed against torch.compile) within 3; the build-only gate refuses a folder where any GPU test,
# the SDPA test included, was not built; and --build-only refuses a tree without the cudnn-frontend
# headers before compiling anything. Then a rehearsal of a run with fake binaries (scripts that
# log their calls): a cuDNN refusal in the SDPA test is rerun, that case alone, with cuDNN's
# logging on; a failing or skipped test ends stage A with its table and B does not run; a passing A
# goes on to B.
source "$(dirname "$0")/lib.sh"
check="$SRC/tests/gpu/device-check.sh"

# The plan.
plan=$(bash "$check" --dry-run) || fail "the dry run's plan does not fit: $plan"
echo "$plan"
total=$(sed -n 's/^total: \([0-9]*\) s at most of 480 s.*: fits$/\1/p' <<<"$plan")
[[ -n "$total" && $total -le 480 ]] || fail "no total within 480 s in the plan"
stage_budget() { sed -n "s/^stage $1: .*; budget \([0-9]*\) s.*/\1/p" <<<"$plan"; }
[[ $(stage_budget A) -le 240 ]] || fail "stage A's budget $(stage_budget A) s is over 4 minutes"
[[ $(stage_budget B) -le 180 ]] || fail "stage B's budget $(stage_budget B) s is over 3 minutes"
# Stage A's order: the versions, the op table, the SDPA test, then the rest; B compares with torch.compile.
steps=$(awk '/^stage A/ {a = 1} /^stage B/ {a = 0} a && /^  [a-z0-9_]+ +[0-9]+ s/ {print $1}' <<<"$plan" | tr '\n' ' ')
[[ "$steps" == "versions op_table sdpa sdpa_refusal_log sdpa_initcheck model bf16_model cut loss_curve " ]] ||
  fail "stage A's steps: $steps"
for want in 'kilter_gpu_op_table_test' 'tool initcheck' 'CUDNN_LOGLEVEL_DBG=2' 'CUDNN_LOGDEST_DBG=stderr' \
            'gpu_step.sh $bin/kilter_bench_gpu_step --core' 'torch_gpu_step.py --compile'; do
  grep -qF -- "$want" <<<"$plan" || fail "the plan does not hold '$want'"
done
grep -q 'kilter_gpu_ops_test\|kilter_gpu_bf16_ops_test' <<<"$plan" && fail "the plan still names the old op tests"

# The gate on a folder: every binary present passes; one missing (the SDPA test) is a failure.
mkdir fake
for b in kilter_gpu_op_table_test kilter_gpu_sdpa_test kilter_gpu_model_test kilter_gpu_bf16_model_test \
         kilter_gpu_cut_test kilter_gpu_versions kilter_gpu_loss_curve kilter_bench_gpu_step; do
  printf '#!/bin/sh\n' >"fake/$b" && chmod +x "fake/$b"
done
bash "$check" --verify-built fake >/dev/null || fail "--verify-built refused a folder with every binary"
rm fake/kilter_gpu_sdpa_test
set +e
out=$(bash "$check" --verify-built fake 2>&1)
rc=$?
set -e
[[ $rc -ne 0 ]] || fail "--verify-built passed without kilter_gpu_sdpa_test"
grep -qE 'kilter_gpu_sdpa_test +NOT BUILT' <<<"$out" || fail "the gate does not name the missing test: $out"

# --build-only in a tree whose cudnn-frontend headers cannot be found: refused at configure time.
mkdir no-headers
set +e
out=$(CUDNN_FRONTEND_INCLUDE_DIR=$WORK/no-headers KILTER_GPU_BUILD=$WORK/build KILTER_GPU_CARRY=$WORK/carry \
      bash "$check" --build-only 2>&1)
rc=$?
set -e
echo "$out" | tail -5
[[ $rc -ne 0 ]] || fail "--build-only passed without the cudnn-frontend headers"
[[ ! -e "$WORK/carry/kilter_gpu_model_test" ]] || fail "--build-only left binaries to carry"
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  # With a CUDA toolkit the refusal is the SDPA engine's headers, not anything else.
  grep -q "ENABLE_SDPA=ON but cudnn-frontend" <<<"$out" || fail "the refusal does not name the cudnn-frontend headers"
fi
# The rehearsal.
mkdir carry out bin-path
for b in kilter_gpu_op_table_test kilter_gpu_sdpa_test kilter_gpu_model_test kilter_gpu_bf16_model_test \
         kilter_gpu_cut_test kilter_gpu_versions kilter_gpu_loss_curve kilter_bench_gpu_step; do
  cat >"carry/$b" <<'FAKE'
#!/bin/bash
name=$(basename "$0")
echo "$name $* CUDNN_LOGLEVEL_DBG=${CUDNN_LOGLEVEL_DBG:-}" >>"$FAKE_CALLS"
if [[ $name == kilter_gpu_sdpa_test && -n "${FAKE_REFUSE:-}" && -z "${CUDNN_LOGLEVEL_DBG:-}" ]]; then
  echo "  cuDNN refused case: head_dim 128, 4 over 1, cut"
  exit 1
fi
[[ " ${FAKE_SKIP:-} " == *" $name "* ]] && { echo "SKIPPED: no CUDA device (fake)"; exit 77; }
echo "$name ok"
FAKE
  chmod +x "carry/$b"
done
printf '#!/bin/bash\necho "compute-sanitizer $*" >>"$FAKE_CALLS"\n' >bin-path/compute-sanitizer
chmod +x bin-path/compute-sanitizer
rehearse() {  # rehearse NAME ENV...: a whole check on the fake binaries; its output in NAME.out
  set +e
  env "${@:2}" FAKE_CALLS="$WORK/$1.calls" OUT="$WORK/out" KILTER_GPU_CARRY="$WORK/carry" PATH="$WORK/bin-path:$PATH" \
    bash "$check" >"$1.out" 2>&1
  echo $? >"$1.rc"
  set -e
  touch "$1.calls"
}
rehearse refusal FAKE_REFUSE=1
[[ $(cat refusal.rc) -ne 0 ]] || fail "a cuDNN refusal passed the check"
grep -qE '^  sdpa +FAIL \(exit 1\)' refusal.out || fail "stage A's table does not show the SDPA failure: $(cat refusal.out)"
grep -qF 'kilter_gpu_sdpa_test --case head_dim 128, 4 over 1, cut CUDNN_LOGLEVEL_DBG=2' refusal.calls ||
  fail "the refused case was not rerun alone with cuDNN's logging: $(cat refusal.calls)"
grep -q 'stage A failed: stage B is not run' refusal.out || fail "stage B ran after a failed stage A"
grep -q 'kilter_bench_gpu_step' refusal.calls && fail "the benchmark ran after a failed stage A"
grep -qF 'compute-sanitizer --tool initcheck' refusal.calls || fail "the SDPA test did not run under initcheck"
rehearse skipped FAKE_SKIP=kilter_gpu_cut_test
[[ $(cat skipped.rc) -ne 0 ]] || fail "a skipped test passed the check"
grep -qE '^  cut +FAIL: skipped \(no usable device\)' skipped.out || fail "a skip is not a failure: $(cat skipped.out)"
rehearse passing
grep -q '^stage A: correctness' passing.out && grep -q '^stage B: speed' passing.out ||
  fail "a passing stage A did not go on to B with its table: $(cat passing.out)"
grep -q 'kilter_bench_gpu_step' passing.calls || fail "stage B did not run the benchmark"
echo "device check plan, gates and rehearsal: ok"
