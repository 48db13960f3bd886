#!/usr/bin/env bash
# A checkpoint written before the architecture keys existed (tests/e2e/fixtures/gpt2-before-arch:
# kilter 295ebd4, issue 38) resumes with this kilter, as gpt2: the config hash does not refuse it
# (the new model.* keys at their defaults stay out of the hash) and the checkpoint reads without an
# `arch` attribute. The resumed steps are bit for bit those resumed from the same checkpoint with
# the architecture attributes this build writes added, so a missing attribute means gpt2 and
# nothing else. The fixture's first two steps were computed on whatever CPU made it, so against a
# straight run of this build on this CPU the losses agree to rounding, not to the bit.
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
train straight.log 1 --output.dir=runs/straight
cp -r runs/old runs/marked
"$PY" - <<'PY'
import h5py
new = h5py.File("runs/straight/checkpoints/step-00000004.h5", "r")
with h5py.File("runs/marked/checkpoints/step-00000002.h5", "r+") as f:
    added = sorted(set(new.attrs) - set(f.attrs))
    assert "arch" in added, added
    for k in added:
        f.attrs[k] = new.attrs[k]
print("marked the fixture with", ", ".join(added))
PY
train resumed.log 1 --resume runs/old
grep -q "resumed from runs/old/checkpoints/step-00000002.h5 at step 2" resumed.log || { cat resumed.log; fail "no resume"; }
train marked.log 1 --resume runs/marked
grep -q "resumed from runs/marked/checkpoints/step-00000002.h5 at step 2" marked.log || { cat marked.log; fail "no resume of the marked copy"; }
"$PY" - <<'PY'
import csv, h5py, numpy as np
def losses(path):
    return {int(r["step"]): r["loss"] for r in csv.DictReader(open(path))}
old, marked = losses("runs/old/metrics/rank-00000.csv"), losses("runs/marked/metrics/rank-00000.csv")
straight = losses("runs/straight/metrics/rank-00000.csv")
for step in (2, 3):
    assert old[step] == marked[step], f"step {step}: resumed {old[step]} vs resumed-with-arch {marked[step]}"
    rel = abs(float(old[step]) - float(straight[step])) / abs(float(straight[step]))
    assert rel < 1e-4, f"step {step}: resumed {old[step]} vs straight {straight[step]} (rel {rel:.2e})"
a = h5py.File("runs/old/checkpoints/step-00000004.h5", "r")
b = h5py.File("runs/marked/checkpoints/step-00000004.h5", "r")
assert a.attrs["arch"] == "gpt2", a.attrs["arch"]
names = []
b.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
assert any(n.startswith("params/") for n in names) and any(n.startswith("adam/") for n in names), names
for k in names:
    assert np.array_equal(a[k][...].view(np.uint8), b[k][...].view(np.uint8)), k
print("a checkpoint from before the arch keys resumed as gpt2: steps 2-3 and the weights bit-identical "
      "to the same checkpoint with arch attributes; losses match a straight run to rounding")
PY
echo "resume_old_checkpoint: 1 passed, 0 failed"
