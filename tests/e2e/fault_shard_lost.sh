#!/usr/bin/env bash
# A shard changed under a running job (issue 17):
#   truncated mid-run -> the rank whose prefetch read hits the missing bytes fails, every rank
#     ends (exit 1, no hang), and the first line names the rank, the shard file and what to do;
#     the run's checkpoints stay as they were;
#   deleted mid-run   -> nothing changes for the running job (every rank holds the shard open
#     since the start, and Linux keeps a deleted file's data while it is open), so it ends
#     normally; the next run is refused at start naming the missing file.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
cp -r data data2
COMMON=(--model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --output.log_every=50
        --output.trace_steps=0 --comm.timeout_s=30 --output.checkpoint_every=2 --output.keep_checkpoints=1
        --data.cost_calibration=off)
last_step() { [ -f "$1" ] && tail -n +2 "$1" | cut -d, -f1 | sort -n | tail -1 || echo -1; }
start_and_wait() {  # start_and_wait LOG DATA RUN: a run in the background ($pid), at step >= 3
  timeout 300 "${MPIRUN[@]}" -np 3 "$KILTER" train "${COMMON[@]}" --train.steps=1000 --data.dir="$2" --output.dir="$3" > "$1" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ "$(last_step "$3/metrics/rank-00000.csv")" -ge 3 ] 2>/dev/null && return 0; sleep 0.1; done
  cat "$1"; fail "$1: the run did not reach step 3"
}

# Truncated to its header: any read of its tokens fails. (The offset is found before the run, so
# the cut comes right after step 3, far from the run's end at step 1000.)
TOKENS_AT=$("$PY" -c "import h5py; print(h5py.File('data/shard-00001.h5','r')['tokens'].id.get_offset())")
start_and_wait truncated.log data runs/t
truncate -s "$TOKENS_AT" data/shard-00001.h5
rc=0; wait $pid || rc=$?
[ $rc -ne 0 ] || { cat truncated.log; fail "truncated: the run exited 0"; }
[ $rc -ne 124 ] || { cat truncated.log; fail "truncated: hung until the timeout"; }
grep -q "train failed: rank [0-2]: shard data/shard-00001.h5 was truncated while the run read it: restore the dataset (kilter prep validate names damaged shards), then continue the run with --resume" truncated.log \
  || { cat truncated.log; fail "truncated: no message naming the rank and the shard"; }
[ -z "$(kilter_procs_here)" ] || fail "truncated: kilter processes left behind: $(kilter_procs_here)"
grep -m1 "train failed" truncated.log
kept=$(ls runs/t/checkpoints | grep '^step-.*\.h5$' | tail -1)
[ -n "$kept" ] || fail "truncated: the run's checkpoint is gone"
"$PY" -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); assert len(f['params']) > 0" "runs/t/checkpoints/$kept" \
  || fail "truncated: the kept checkpoint $kept does not open"
# A checkpoint write in flight when the job was aborted may leave its hidden temp file, as a kill
# mid-write does (docs/checkpoints.md: --resume ignores it and the next run removes it,
# e2e_fault_kill_write); it is never the kept checkpoint's.
for t in $(ls -a runs/t/checkpoints | grep '\.tmp$' || true); do
  step=$(sed 's/.*step-\([0-9]*\)\.h5.*/\1/' <<< "$t")
  (( 10#$step > 10#$(sed 's/.*step-\([0-9]*\)\.h5.*/\1/' <<< "$kept") )) || fail "truncated: temp file $t beside the newer $kept"
  echo "truncated: the abort left $t (a write in flight; the next run removes it)"
done

# Deleted: the running job finishes; the next one names the missing file.
start_and_wait deleted.log data2 runs/d
rm data2/shard-00000.h5
rc=0; wait $pid || rc=$?
[ $rc -eq 0 ] || { cat deleted.log; fail "deleted: the running job failed (exit $rc)"; }
rc=0
timeout 120 "${MPIRUN[@]}" -np 3 "$KILTER" train "${COMMON[@]}" --data.dir=data2 --resume runs/d --train.steps=1002 > after.log 2>&1 || rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat after.log; fail "after deletion: exit $rc, expected a refusal"; }
grep -q "data2/shard-00000.h5" after.log || { cat after.log; fail "after deletion: the missing shard is not named"; }
grep -m1 "train failed\|kilter train:" after.log
echo "fault_shard_lost: 1 passed, 0 failed"
