#!/usr/bin/env bash
# Resume equality (docs/design.md invariant 3, issue 8): a run of train.steps = 8 straight == the same
# run stopped after 3 steps, resumed and stopped after 5, resumed to 8 — bit-identical parameters and AdamW moments in the final checkpoints, identical
# losses step by step, and the same data-plan position. The dataset has 5 steps per epoch, so one
# resume lands mid-epoch and the other exactly on the epoch boundary. The stops are preemptions
# (SIGUSR1 at an exact step, via the test hook), so the learning-rate schedule, which depends on
# train.steps, is the straight run's.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.warmup=2 --train.lr=3e-3
        --train.steps=8 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60)

train straight.log 2 --output.dir=runs/straight
# Each part's metrics are kept aside: the losses are compared whether or not a resumed run
# appends to metrics/rank-00000.csv.
stop_after part1.log 2 3 --output.dir=runs/part && cp runs/part/metrics/rank-00000.csv part1.csv
stop_after part2.log 2 5 --resume runs/part && cp runs/part/metrics/rank-00000.csv part2.csv
train part3.log 2 --resume runs/part && cp runs/part/metrics/rank-00000.csv part3.csv
grep -q "resumed from runs/part/checkpoints/step-00000003.h5" part2.log || { cat part2.log; fail "part2 did not resume from step 3"; }
grep -q "resumed from runs/part/checkpoints/step-00000005.h5" part3.log || { cat part3.log; fail "part3 did not resume from step 5"; }

"$PY" - <<'PY'
import csv
import h5py, numpy as np

def losses(*files):
    rows = {}
    for name in files:
        with open(name) as f:
            for r in csv.DictReader(f):
                rows[int(r["step"])] = r["loss"]  # a later row of a step wins
    return rows

a = losses("runs/straight/metrics/rank-00000.csv")
b = losses("part1.csv", "part2.csv", "part3.csv")
assert sorted(a) == list(range(8)), sorted(a)
assert sorted(b) == list(range(8)), sorted(b)
for s in range(8):
    assert a[s] == b[s], f"step {s}: loss {a[s]} (straight) != {b[s]} (resumed)"

fa = h5py.File("runs/straight/checkpoints/step-00000008.h5", "r")
fb = h5py.File("runs/part/checkpoints/step-00000008.h5", "r")
for key in ["step", "epoch", "step_in_epoch", "tokens_seen", "config_hash", "seed"]:
    assert fa.attrs[key] == fb.attrs[key], f"attribute {key}: {fa.attrs[key]} != {fb.attrs[key]}"
assert fa.attrs["epoch"] == 1, "the run was meant to cross an epoch boundary"
n = 0
for group in ["params", "adam/m", "adam/v"]:
    assert sorted(fa[group]) == sorted(fb[group]), group
    for name in fa[group]:
        x, y = fa[group][name][...], fb[group][name][...]
        assert x.dtype == np.float32 and x.shape == y.shape
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), f"/{group}/{name} differs"
        n += 1
print(f"resume equality: {n} tensors bit-identical, losses of 8 steps identical")
PY
echo "resume_equality: 1 passed, 0 failed"
