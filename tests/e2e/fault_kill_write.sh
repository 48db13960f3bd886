#!/usr/bin/env bash
# kill -9 during a checkpoint write (issue 8): the writer is slowed down with the test hook
# KILTER_TEST_CHECKPOINT_DELAY_S (it sleeps halfway through the tensor data), rank 0 is killed
# while the temp file is half written, and then: the previous checkpoint is still the latest and
# loads, the half file never appears under a final name, the next run removes it and resumes,
# and the result equals a straight run bit for bit.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.warmup=2 --train.lr=3e-3
        --train.steps=6 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60
        --output.checkpoint_every=2)

stop_after first.log 2 2 --output.dir=runs/k
[ -f runs/k/checkpoints/step-00000002.h5 ] || fail "no checkpoint of step 2"

# Resume towards step 6 with a writer that stalls halfway; kill -9 rank 0 while it does.
KILTER_TEST_CHECKPOINT_DELAY_S=120 timeout 300 "${MPIRUN[@]}" -np 2 -x KILTER_TEST_CHECKPOINT_DELAY_S \
  "$KILTER" train "${COMMON[@]}" --resume runs/k > killed.log 2>&1 &
pid=$!
tmp=runs/k/checkpoints/.step-00000004.h5.tmp
for _ in $(seq 600); do [ -f $tmp ] && break; sleep 0.2; done
[ -f $tmp ] || { cat killed.log; fail "the slowed writer never created $tmp"; }
sleep 1  # well inside the 120 s stall: the temp file is half written
mpid=$(pgrep -P $pid | head -1)
rank0=$(rank_pid "$mpid" 0) || { cat killed.log; fail "rank 0 not found"; }
kill -9 "$rank0"
rc=0; wait $pid || rc=$?
[ $rc -ne 0 ] || fail "the killed run exited 0"
[ $rc -ne 124 ] || fail "the killed run hung until timeout"
[ -f runs/k/checkpoints/step-00000004.h5 ] && fail "a half-written checkpoint appeared under its final name"
[ -f $tmp ] || fail "expected the half-written temp file to remain after kill -9"

# The previous checkpoint is the latest and loads: resume from it to the end.
timeout 300 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" --resume runs/k > resume.log 2>&1 \
  || { cat resume.log; fail "resume after kill -9 failed"; }
grep -q "resumed from runs/k/checkpoints/step-00000002.h5" resume.log || { cat resume.log; fail "did not resume from step 2"; }
grep -q "removed runs/k/checkpoints/.step-00000004.h5.tmp" resume.log || { cat resume.log; fail "stale temp file not removed"; }
timeout 300 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" --output.dir=runs/straight > straight.log 2>&1 \
  || { cat straight.log; fail "straight run failed"; }
"$PY" - <<'PY'
import h5py, numpy as np
fa = h5py.File("runs/straight/checkpoints/step-00000006.h5", "r")
fb = h5py.File("runs/k/checkpoints/step-00000006.h5", "r")
for group in ["params", "adam/m", "adam/v"]:
    for k in fa[group]:
        assert np.array_equal(fa[group][k][...].view(np.uint32), fb[group][k][...].view(np.uint32)), f"/{group}/{k}"
print("killed during a write + resumed == straight: bit-identical")
PY
echo "fault_kill_write: 1 passed, 0 failed"
