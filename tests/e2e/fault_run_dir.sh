#!/usr/bin/env bash
# The run directory at start (issue 17): `--resume` with nothing to resume from, and a run
# directory that holds a run of another config. Each is refused on every rank, before any work,
# with a first line naming the folder and what to do, and the folder is left as it was:
#   --resume on a folder that does not exist    -> "... does not exist", the folder not created;
#   --resume on a folder without checkpoints    -> "no checkpoint in DIR/checkpoints";
#   ... whose only file is an unfinished write  -> names the temp file;
#   a new run into the folder of another config -> refused before MPI (exit 2), names the keys,
#                                                  config.ini and checkpoints kept;
#   --resume with another config                -> names the keys (and fault_bad_checkpoint.sh);
#   a re-run into a folder of the same config   -> continues from its checkpoint (tests/e2e/rerun.sh).
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=2 --output.trace_steps=0
        --comm.timeout_s=30)
refused() {  # refused NAME PATTERN [train args]: non-zero exit (not a timeout), PATTERN in the log
  local name=$1 pattern=$2 rc=0; shift 2
  timeout 120 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" "$@" > "$name.log" 2>&1 || rc=$?
  [ $rc -ne 0 ] || { cat "$name.log"; fail "$name: the run was not refused"; }
  [ $rc -ne 124 ] || { cat "$name.log"; fail "$name: hung until the timeout"; }
  grep -q -- "$pattern" "$name.log" || { cat "$name.log"; fail "$name: message lacks '$pattern'"; }
  grep -m1 "train failed\|kilter train:" "$name.log"
}

refused missing "train failed: rank 0: --resume runs/none: the run directory runs/none does not exist; name the output.dir of the run to continue, or start a new run without --resume" \
  --resume runs/none
[ ! -e runs/none ] || fail "missing: the refused resume created runs/none"

mkdir -p runs/empty
refused empty "train failed: rank 0: --resume runs/empty: no checkpoint in runs/empty/checkpoints (no step-NNNNNNNN.h5 file); start the run anew without --resume" \
  --resume runs/empty
[ -z "$(ls -A runs/empty)" ] || fail "empty: the refused resume wrote into runs/empty"

mkdir -p runs/unfinished/checkpoints
: > runs/unfinished/checkpoints/.step-00000002.h5.tmp
refused unfinished "only runs/unfinished/checkpoints/.step-00000002.h5.tmp, a write that did not finish" --resume runs/unfinished
[ -f runs/unfinished/checkpoints/.step-00000002.h5.tmp ] || fail "unfinished: the temp file was removed by a refused resume"

# A run of 2 steps, then a new run of another model into the same folder.
train first.log 2 --output.dir=runs/a
cp runs/a/config.ini first.ini
ls runs/a/checkpoints > first.list
refused other_config "kilter train: output.dir runs/a holds a run of another config (1 checkpoint(s), the newest runs/a/checkpoints/step-00000002.h5; 1 key(s) differ); --force starts over" \
  --output.dir=runs/a --train.lr=0.01
grep -q "    train.lr = .* vs 0.01" other_config.log || { cat other_config.log; fail "other_config: the key is not named"; }
cmp -s first.ini runs/a/config.ini || fail "other_config: config.ini of the existing run was overwritten"
[ "$(ls runs/a/checkpoints)" = "$(cat first.list)" ] || fail "other_config: the existing checkpoints changed"

refused resume_other "checkpoint runs/a/checkpoints/step-00000002.h5 was written with a different config (1 key(s) differ); resume with the run's own config" \
  --resume runs/a --train.lr=0.01
grep -q "    train.lr = " resume_other.log || { cat resume_other.log; fail "resume_other: the key is not named"; }

# The same config again without --resume, 1 step more: it continues from step 2.
COMMON=("${COMMON[@]/--train.steps=2/--train.steps=3}")
train same.log 2 --output.dir=runs/a
grep -q "kilter: output.dir runs/a holds checkpoints of this config: continuing from runs/a/checkpoints/step-00000002.h5 (step 2)" same.log \
  || { cat same.log; fail "same: no note that the run continues"; }
grep -q "resumed from runs/a/checkpoints/step-00000002.h5 at step 2" same.log || { cat same.log; fail "same: did not resume"; }
echo "fault_run_dir: 1 passed, 0 failed"
