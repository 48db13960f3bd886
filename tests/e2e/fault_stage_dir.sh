#!/usr/bin/env bash
# data.stage_dir unwritable or too small (issue 17), on real file systems: tmpfs mounts in a
# private mount namespace (unshare -m; unmounted by the EXIT trap, and gone with the namespace).
#   a stage folder on a read-only file system (to create, or as is) -> refused before training on
#     every rank, the folder and the cause named;
#   a file in the way of the folder -> the same, "cannot create the directory";
#   a stage folder too small -> refused before a byte is copied, needed and free named (a write
#     that fails mid-copy gives the same first line: io_stage_test, StorageFaultMidCopy);
#   and `kilter prep` onto that full tmpfs: one plain first line, no partial dataset left.
# Every time: exit 1 (no hang), the first line says to point data.stage_dir elsewhere or leave it
# empty, no temp file is left in the stage folder, and the dataset is untouched (validates).
# Skipped (77) where a mount namespace cannot be made (not root, or no CAP_SYS_ADMIN).
source "$(dirname "$0")/mount_ns.sh"
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
trap 'umount "$WORK/ro" "$WORK/small" 2>/dev/null; rm -rf "$WORK"' EXIT

"$KILTER" prep synth --docs 400 --lengths lognormal:5,0.9,1000 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=2 --output.trace_steps=0
        --comm.timeout_s=30)
mkdir ro small
mount -t tmpfs -o size=1m,ro tmpfs ro
mount -t tmpfs -o size=16k tmpfs small
: > afile

refused() {  # refused NAME PATTERN STAGE_DIR
  local name=$1 pattern=$2 stage=$3 rc=0
  timeout 120 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" --data.stage_dir="$stage" \
    --output.dir=runs/$name > "$name.log" 2>&1 || rc=$?
  [ $rc -ne 0 ] || { cat "$name.log"; fail "$name: the run was not refused"; }
  [ $rc -ne 124 ] || { cat "$name.log"; fail "$name: hung until the timeout"; }
  grep -q -- "$pattern" "$name.log" || { cat "$name.log"; fail "$name: message lacks '$pattern'"; }
  grep -q -- "leave data.stage_dir empty to read data in place" "$name.log" || { cat "$name.log"; fail "$name: no advice"; }
  find "$stage" -name '*.tmp-*' 2>/dev/null | grep -q . && fail "$name: a temp file was left in $stage"
  [ ! -e runs/$name/checkpoints/step-00000002.h5 ] || fail "$name: trained anyway"
  grep -m1 "train failed: rank 0" "$name.log"
}
refused readonly "train failed: rank 0: data.stage_dir ro/stage: cannot create the directory (Read-only file system); set data.stage_dir to a writable node-local folder" ro/stage
refused readonly_root "train failed: rank 0: data.stage_dir ro: ro is on a read-only file system while copying shard-00000.h5; set data.stage_dir to a writable folder" ro
refused in_the_way "data.stage_dir afile/stage: cannot create the directory" afile/stage
grep -q "train failed: rank 1: node-local staging failed on this node's rank 0" in_the_way.log || { cat in_the_way.log; fail "rank 1 does not say rank 0 failed"; }
refused too_small "train failed: rank 0: data.stage_dir small is too small: staging needs .* free; free space there, or set data.stage_dir to a larger node-local disk" small
[ -z "$(ls -A small)" ] || { ls -la small; fail "too_small: something was copied into the small stage folder"; }

"$KILTER" prep validate data > validate.log 2>&1 || { cat validate.log; fail "the dataset was damaged"; }
# kilter prep onto the same full disk: one plain first line, HDF5's text once as the detail, no
# partial dataset left.
rc=0
"$KILTER" prep synth --docs 400 --lengths lognormal:5,0.9,1000 --vocab 97 --shards 2 --seed 7 --out small/d > prep.log 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat prep.log; fail "prep onto a full disk: exit $rc, expected 1"; }
grep -q "^kilter prep: error: .*/shard-0000[01].h5: cannot write /tokens.*: no space left on the file system of .*; free space there, or write the output elsewhere$" prep.log \
  || { cat prep.log; fail "prep onto a full disk: no plain first line"; }
[ "$(grep -c "errno = 28" prep.log)" -eq 1 ] || { cat prep.log; fail "prep onto a full disk: HDF5's text not exactly once"; }
[ -z "$(ls -A small)" ] || { ls -la small; fail "prep onto a full disk left files"; }
head -1 prep.log
# With room, the same run stages and trains.
mount -o remount,size=16m small
train ok.log 2 --data.stage_dir=small --output.dir=runs/ok
grep -q "staged small" ok.log || { cat ok.log; fail "no staging after the remount"; }
echo "fault_stage_dir: 1 passed, 0 failed"
