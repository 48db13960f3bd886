#!/usr/bin/env bash
# A full disk while writing checkpoints (issue 17), on a real small file system: a tmpfs mounted
# over the run's folder in a private mount namespace (unshare -m; gone with the namespace, and
# unmounted by the EXIT trap). Its size is 2.5 checkpoints, measured from a first run.
#   periodic checkpoint that does not fit -> a warning naming the cause, the checkpoint that stays
#     the latest, and training goes on (both ranks finish every step);
#   last checkpoint (end of run, or a stop signal) that does not fit -> exit 1 on every rank with
#     a first line naming the file, the cause and what to do; no HDF5 stack;
#   the disk filling up in the middle of a write (the writer stalls halfway through the tensor
#     data with the test hook KILTER_TEST_CHECKPOINT_DELAY_S while the test fills the disk) ->
#     the same first line, from the failed write itself, with HDF5's messages once as the detail;
#   every time: no temp file left, the previous checkpoints intact, and after space is freed the
#     run resumes and ends bit-identical to a run that never met a full disk.
# Skipped (77) where a mount namespace cannot be made (not root, or no CAP_SYS_ADMIN).
source "$(dirname "$0")/mount_ns.sh"
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
trap 'umount "$WORK/runs" 2>/dev/null; rm -rf "$WORK"' EXIT

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.warmup=2 --train.lr=3e-3
        --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=30
        --output.checkpoint_every=2)

# The run that never meets a full disk (on the ordinary disk); its checkpoint size sets the tmpfs.
train straight.log 2 --train.steps=8 --output.dir=straight
CKPT_KB=$(( $(stat -c %s straight/checkpoints/step-00000008.h5) / 1024 + 1 ))
mkdir runs
mount -t tmpfs -o size=$(( CKPT_KB * 5 / 2 ))k tmpfs runs
echo "tmpfs of $(( CKPT_KB * 5 / 2 )) kB for checkpoints of $CKPT_KB kB"

expect_exit() {  # expect_exit CODE LOG [env...] -- [train args]
  local want=$1 log=$2 rc=0; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local start=$SECONDS
  env KILTER_TEST_FAIL_RANK= KILTER_TEST_FAIL_STEP= KILTER_TEST_FAIL_MODE= KILTER_TEST_CHECKPOINT_DELAY_S= \
    "${envs[@]}" timeout 120 "${MPIRUN[@]}" -np 2 -x KILTER_TEST_FAIL_RANK -x KILTER_TEST_FAIL_STEP \
    -x KILTER_TEST_FAIL_MODE -x KILTER_TEST_CHECKPOINT_DELAY_S "$KILTER" train "${COMMON[@]}" "$@" > "$log" 2>&1 || rc=$?
  echo "$log: exit $rc after $((SECONDS - start)) s"
  [ $rc -ne 124 ] || { cat "$log"; fail "$log: hung until the timeout"; }
  [ $rc -eq "$want" ] || { cat "$log"; fail "$log: exit code $rc, expected $want"; }
}
no_stack() {  # no HDF5 stack printed, no temp file left
  grep -q "HDF5-DIAG\|#000:" "$1" && { cat "$1"; fail "$1: an HDF5 error stack was printed"; }
  ls -a runs/f/checkpoints | grep -q '\.tmp$' && fail "$1: temp file left in runs/f/checkpoints"
  return 0
}
CAUSE="not written: no space left on the file system of runs/f/checkpoints"

# 1. Steps 2 and 4 fit; 6 (periodic) does not: warning, training goes on; 8 (last) does not: exit 1.
expect_exit 1 full.log -- --train.steps=8 --output.dir=runs/f
grep -q "kilter: warning: checkpoint runs/f/checkpoints/step-00000006.h5 $CAUSE" full.log || { cat full.log; fail "no warning for step 6"; }
grep -q "the latest checkpoint stays runs/f/checkpoints/step-00000004.h5; training goes on" full.log || { cat full.log; fail "warning does not name the kept checkpoint"; }
grep -q "train failed: rank 0: checkpoint runs/f/checkpoints/step-00000008.h5 $CAUSE" full.log || { cat full.log; fail "no error for the last checkpoint"; }
grep -q "resume from it with --resume runs/f" full.log || { cat full.log; fail "the error does not say how to resume"; }
for r in 0 1; do
  [ "$(tail -n +2 runs/f/metrics/rank-0000$r.csv | wc -l)" -eq 8 ] || fail "rank $r did not train all 8 steps after the warning"
done
no_stack full.log
[ "$(ls runs/f/checkpoints)" = "$(printf 'step-00000002.h5\nstep-00000004.h5')" ] || { ls runs/f/checkpoints; fail "checkpoints changed"; }
grep -m1 "warning: checkpoint" full.log; grep -m1 "train failed: rank 0" full.log

# 2. A stop signal whose checkpoint does not fit: exit 1, not 85 (a requeue would meet the same disk).
expect_exit 1 stop.log KILTER_TEST_FAIL_RANK=1 KILTER_TEST_FAIL_STEP=5 KILTER_TEST_FAIL_MODE=sigusr1 -- --train.steps=8 --resume runs/f
grep -q "checkpoint runs/f/checkpoints/step-00000006.h5 $CAUSE" stop.log || { cat stop.log; fail "no error for the signal checkpoint"; }
grep -q "stop signal received: checkpoint" stop.log && { cat stop.log; fail "claims a checkpoint was written"; }
no_stack stop.log

# 3. The disk fills up while the last checkpoint (step 6) is being written: HDF5's metadata flush
#    or the tensor data's write() fails with ENOSPC (whichever comes first; the same first line).
mount -o remount,size=$(( CKPT_KB * 4 ))k runs
expect_exit 1 midway.log KILTER_TEST_CHECKPOINT_DELAY_S=5 -- --resume runs/f --train.steps=6 &
pid=$!
tmp=runs/f/checkpoints/.step-00000006.h5.tmp
for _ in $(seq 600); do [ -f $tmp ] && break; sleep 0.1; done
[ -f $tmp ] || { wait $pid; cat midway.log; fail "the slowed writer never created $tmp"; }
dd if=/dev/zero of=runs/filler bs=64k 2>/dev/null || true   # until ENOSPC
wait $pid
grep -q "checkpoint runs/f/checkpoints/step-00000006.h5 $CAUSE" midway.log || { cat midway.log; fail "no error for the half-written checkpoint"; }
grep -q "detail: checkpoint .*No space left on device" midway.log || { cat midway.log; fail "the failed write is not in the detail"; }
no_stack midway.log
grep -m1 "train failed: rank 0" midway.log

# 4. Space freed: the run resumes from step 4 and ends as if nothing happened.
rm runs/filler
mount -o remount,size=$(( CKPT_KB * 8 ))k runs
train resume.log 2 --train.steps=8 --resume runs/f
grep -q "resumed from runs/f/checkpoints/step-00000004.h5" resume.log || { cat resume.log; fail "did not resume from step 4"; }
"$PY" - <<'PY'
import h5py, numpy as np
fa = h5py.File("straight/checkpoints/step-00000008.h5", "r")
fb = h5py.File("runs/f/checkpoints/step-00000008.h5", "r")
for group in ["params", "adam/m", "adam/v"]:
    for k in fa[group]:
        assert np.array_equal(fa[group][k][...].view(np.uint32), fb[group][k][...].view(np.uint32)), f"/{group}/{k}"
print("full disk three times + resumed == straight: bit-identical")
PY
echo "fault_disk_full: 1 passed, 0 failed"
