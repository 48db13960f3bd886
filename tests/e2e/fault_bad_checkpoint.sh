#!/usr/bin/env bash
# Bad checkpoints and mismatched resumes are clear errors on every rank, never a hang (issue 8):
# a config change that alters the numbers (train.lr) names the key; another model shape names
# both shapes; a truncated file and a file with damaged tensor bytes name the file and the
# problem. Allowed changes (train.steps, output.*) resume fine.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.warmup=2
        --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=30)
SAME=(--model.n_head=2 --model.n_embd=32 --train.lr=3e-3)  # what the first run used
timeout 300 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" "${SAME[@]}" --train.steps=3 --output.dir=runs/b > first.log 2>&1 \
  || { cat first.log; fail "first run failed"; }
CKPT=runs/b/checkpoints/step-00000003.h5
cp $CKPT good.h5

expect_error() {  # expect_error NAME PATTERN [train args]: non-zero exit (not a timeout), PATTERN in the log
  local name=$1 pattern=$2; shift 2
  local rc=0
  timeout 120 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" --train.steps=5 --resume runs/b "$@" > "$name.log" 2>&1 || rc=$?
  [ $rc -ne 0 ] || { cat "$name.log"; fail "$name: resume succeeded, expected an error"; }
  [ $rc -ne 124 ] || { cat "$name.log"; fail "$name: hung until the timeout"; }
  grep -q -- "$pattern" "$name.log" || { cat "$name.log"; fail "$name: message lacks '$pattern'"; }
  echo "$name: $(grep -m1 -o -- "$pattern.*" "$name.log" | cut -c1-160)"
}

expect_error lr_changed "train.lr = " --model.n_head=2 --model.n_embd=32 --train.lr=0.01
grep -q "was written with a different config" lr_changed.log || fail "lr_changed: no config message"
expect_error model_changed "holds a model with n_layer=2 n_head=2 n_embd=32" --model.n_embd=64 --model.n_head=4 --train.lr=3e-3

"$PY" - $CKPT <<'PY'
import sys, h5py
path = sys.argv[1]
with h5py.File(path, "r") as f:
    offset = f["adam/m/transformer.h.1.mlp.c_fc.weight"].id.get_offset()
with open(path, "r+b") as f:
    f.seek(offset + 100)
    b = f.read(1)
    f.seek(offset + 100)
    f.write(bytes([b[0] ^ 0xFF]))
PY
expect_error damaged "fails its checksum" "${SAME[@]}"
grep -q "/adam/m/transformer.h.1.mlp.c_fc.weight" damaged.log || fail "damaged: tensor not named"

cp good.h5 $CKPT
truncate -s $(( $(stat -c %s $CKPT) / 2 )) $CKPT
expect_error truncated "truncated or corrupt" "${SAME[@]}"
grep -q "$CKPT" truncated.log || fail "truncated: file not named"

# An allowed change resumes: more steps, another output setting.
cp good.h5 $CKPT
timeout 300 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" "${SAME[@]}" --train.steps=5 --output.keep_checkpoints=5 \
  --resume runs/b > ok.log 2>&1 || { cat ok.log; fail "resume with allowed changes failed"; }
[ -f runs/b/checkpoints/step-00000005.h5 ] || fail "no step-5 checkpoint after the allowed resume"
echo "fault_bad_checkpoint: 1 passed, 0 failed"
