#!/usr/bin/env bash
# A non-finite gradient on one rank only (issue 17). The test hook KILTER_TEST_FAIL_MODE=nonfinite
# makes one rank's gradient of step 3 NaN (loss scale NaN: its loss stays finite), as an overflow
# in one rank's backward would. Each rank checks its own gradient before the reduction and the
# ranks agree in the step's allreduce, so:
#   train.on_nonfinite = skip -> every rank skips that update together and the run goes on in
#     step: every rank trains every step, the summary counts one skipped step, every tensor stays
#     finite, and the 3-rank run (NaN on rank 1) has the losses and weights of a 1-rank run that
#     skipped the same step (world-size invariance: a rank out of step would change them);
#   train.on_nonfinite = stop -> every rank stops with exit 1 and a first line naming rank 1.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
# Whole pieces: a NaN in rank 1's gradient stays rank 1's (a cut piece's dK/dV would carry it to
# the ranks holding the piece's earlier parts, and the warning would name them too).
COMMON=(--data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=6 --train.lr=3e-3 --output.log_every=1
        --output.trace_steps=0 --data.cut_pieces=false --comm.timeout_s=30)
inject() {  # inject NP RANK LOG [train args]: RANK's gradient of step 3 is NaN
  local np=$1 rank=$2 log=$3 rc=0; shift 3
  KILTER_TEST_FAIL_RANK=$rank KILTER_TEST_FAIL_STEP=3 KILTER_TEST_FAIL_MODE=nonfinite \
    timeout 120 "${MPIRUN[@]}" -np "$np" -x KILTER_TEST_FAIL_RANK -x KILTER_TEST_FAIL_STEP -x KILTER_TEST_FAIL_MODE \
    "$KILTER" train "${COMMON[@]}" "$@" > "$log" 2>&1 || rc=$?
  [ $rc -ne 124 ] || { cat "$log"; fail "$log: hung until the timeout"; }
  return $rc
}

# skip: the run ends normally, every rank in step.
inject 1 0 one.log --train.on_nonfinite=skip --output.dir=runs/one || { cat one.log; fail "1 rank: the run failed"; }
inject 3 1 skip.log --train.on_nonfinite=skip --output.dir=runs/skip || { cat skip.log; fail "skip: the run failed"; }
grep -q "kilter: warning: step 3: non-finite gradient on rank 1 (loss .*, grad norm nan): update skipped on every rank" skip.log \
  || { cat skip.log; fail "skip: no warning naming rank 1"; }
grep -m1 "warning: step 3" skip.log
for r in 0 1 2; do
  [ "$(tail -n +2 runs/skip/metrics/rank-0000$r.csv | cut -d, -f1 | tr '\n' ' ')" = "0 1 2 3 4 5 " ] \
    || fail "skip: rank $r did not train steps 0-5"
done
"$PY" - "$SRC/tests/python" <<'PY'
import json, sys, h5py, numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses, params, compare_to_reference
s = json.load(open("runs/skip/summary.json"))
assert s["nonfinite_steps_skipped"] == 1, s["nonfinite_steps_skipped"]
assert s["steps"] == 6
with h5py.File("runs/skip/checkpoints/step-00000006.h5", "r") as f:
    for group in ["params", "adam/m", "adam/v"]:
        for k in f[group]:
            assert np.isfinite(f[group][k][...]).all(), f"/{group}/{k} is not finite"
assert json.load(open("runs/one/summary.json"))["nonfinite_steps_skipped"] == 1
compare_to_reference("skip", losses("one"), params("one"), 6 * 3e-3, "3 ranks (NaN on rank 1) vs 1 rank")
print("skip: 1 step skipped on every rank, every tensor finite, ranks in step")
PY

# stop: every rank ends, exit 1, rank 1 named.
rc=0; inject 3 1 stop.log --train.on_nonfinite=stop --output.dir=runs/stop || rc=$?
[ $rc -ne 0 ] || { cat stop.log; fail "stop: the run exited 0"; }
grep -q "train failed: rank [0-2]: step 3: non-finite gradient on rank 1 (loss .*, grad norm nan); every rank stops" stop.log \
  || { cat stop.log; fail "stop: no message naming rank 1"; }
grep -m1 "train failed" stop.log
[ -n "$(kilter_procs_here)" ] && fail "stop: kilter processes left behind"
[ -f runs/stop/checkpoints/step-00000003.h5 ] && fail "stop: a checkpoint of the failed step was written"
echo "fault_nonfinite: 1 passed, 0 failed"
