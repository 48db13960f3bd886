#!/usr/bin/env bash
# A checkpoint written before the architecture keys existed (tests/e2e/fixtures/gpt2-before-arch:
# kilter 295ebd4, issue 38) resumes with this kilter, as gpt2: the config hash does not refuse it
# (the new model.* keys at their defaults stay out of the hash), the checkpoint reads without an
# `arch` attribute, and the resumed steps are bit for bit those of a straight run of this build.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 40 --lengths lognormal:3.5,0.8,100 --vocab 61 --shards 1 --seed 11 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=32
        --data.max_tokens=64 --train.tokens_per_step=128 --train.steps=4 --train.warmup=1 --output.log_every=1
        --output.trace_steps=0)
mkdir -p runs
cp -r "$SRC/tests/e2e/fixtures/gpt2-before-arch" runs/old
"$PY" - <<'PY'
import h5py
f = h5py.File("runs/old/checkpoints/step-00000002.h5", "r")
assert "arch" not in f.attrs and "n_kv_head" not in f.attrs, "the fixture is not from before the arch keys"
PY
grep -q "^arch" runs/old/config.ini && fail "the fixture's config.ini names model.arch"
train resumed.log 1 --resume runs/old
grep -q "resumed from runs/old/checkpoints/step-00000002.h5 at step 2" resumed.log || { cat resumed.log; fail "no resume"; }
train straight.log 1 --output.dir=runs/straight
"$PY" - <<'PY'
import csv, h5py, numpy as np
def losses(path):
    return {int(r["step"]): r["loss"] for r in csv.DictReader(open(path))}
old, new = losses("runs/old/metrics/rank-00000.csv"), losses("runs/straight/metrics/rank-00000.csv")
for step in (2, 3):
    assert old[step] == new[step], f"step {step}: resumed {old[step]} vs straight {new[step]}"
a = h5py.File("runs/old/checkpoints/step-00000004.h5", "r")
b = h5py.File("runs/straight/checkpoints/step-00000004.h5", "r")
assert a.attrs["arch"] == "gpt2", a.attrs["arch"]
for k in b["params"]:
    assert np.array_equal(a["params"][k][...].view(np.uint32), b["params"][k][...].view(np.uint32)), k
print("a checkpoint from before the arch keys resumed as gpt2: steps 2-3 and the weights bit-identical")
PY
echo "resume_old_checkpoint: 1 passed, 0 failed"
