#!/usr/bin/env bash
# The sharded optimizer (ZeRO-1, train.shard_optimizer, issue 24) end to end:
# - sharded vs unsharded on 2 and 4 ranks, and on 4 as 2 nodes x 2 (hierarchical and flat):
#   losses within 1e-6 relative over 20 steps, final weights and AdamW moments within the
#   invariance.sh tolerance (tests/python/run_compare.py);
# - clipping from the shards' global norm, with a clip small enough to act on every step;
# - a checkpoint written by 4 sharded ranks holds the whole optimizer state, and resumes on 1, 2
#   and 3 ranks, sharded or not: each sharded resume is bit-identical to the unsharded resume on
#   the same ranks, and all match 8 steps straight.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 600 --lengths lognormal:4,0.9,300 --vocab 97 --shards 3 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=20 --train.warmup=2
        --train.lr=3e-3 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60)
UNSHARDED=--train.shard_optimizer=false

train s2.log 2 --output.dir=runs/s2
train u2.log 2 --output.dir=runs/u2 $UNSHARDED
train s4.log 4 --output.dir=runs/s4
train u4.log 4 --output.dir=runs/u4 $UNSHARDED
train s22.log 4 --output.dir=runs/s22 --comm.ranks_per_node=2 --comm.algo=hierarchical
train u22.log 4 --output.dir=runs/u22 --comm.ranks_per_node=2 --comm.algo=hierarchical $UNSHARDED
train s22f.log 4 --output.dir=runs/s22f --comm.ranks_per_node=2 --comm.algo=flat
# Gradient norms here are 0.2-0.3: a clip of 0.05 scales every step's gradient.
train c4.log 4 --output.dir=runs/c4 --comm.ranks_per_node=2 --train.grad_clip=0.05
train uc4.log 4 --output.dir=runs/uc4 --comm.ranks_per_node=2 --train.grad_clip=0.05 $UNSHARDED

# Resume across world sizes: 4 sharded ranks stop after 4 of 8 steps (the SIGUSR1 drill).
COMMON=("${COMMON[@]/--train.steps=20/--train.steps=8}")
train straight.log 4 --output.dir=runs/straight $UNSHARDED
stop_after part.log 4 4 --output.dir=runs/part
stop_after upart.log 4 4 --output.dir=runs/upart $UNSHARDED
for r in r1 r2 u2r r3 u3r; do cp -r runs/part runs/$r; done
train r1.log 1 --resume runs/r1
train r2.log 2 --resume runs/r2
train u2r.log 2 --resume runs/u2r $UNSHARDED
train r3.log 3 --resume runs/r3
train u3r.log 3 --resume runs/u3r $UNSHARDED
grep -q "resumed from runs/r3/checkpoints/step-00000004.h5" r3.log || { cat r3.log; fail "no resume on 3 ranks"; }

"$PY" - "$SRC/tests/python" <<'PY'
import csv, glob, json, sys
import h5py
import numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses

def state(path):
    """params and AdamW moments of a checkpoint file, by dataset path."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...])
                     if isinstance(obj, h5py.Dataset) and name.split("/")[0] in ("params", "adam") else None)
    assert any(k.startswith("adam") for k in out), f"{path}: no optimizer state"
    return out

def last(run):
    return sorted(glob.glob(f"runs/{run}/checkpoints/step-*.h5"))[-1]

def summary(run):
    return json.load(open(f"runs/{run}/summary.json"))

def close(a, b, bound, label):
    """Weights within run_compare's bound (1% of lr x steps); moments to 1e-4 of their scale."""
    for k in a:
        d = float(np.max(np.abs(a[k] - b[k])))
        limit = bound if k.startswith("params") else 1e-4 * max(1e-12, float(np.max(np.abs(a[k]))))
        assert d <= limit, f"{label}: {k} differs by {d} (bound {limit})"

LR_SUM = 20 * 3e-3
for sharded, plain in [("s2", "u2"), ("s4", "u4"), ("s22", "u22"), ("s22f", "u22"), ("c4", "uc4")]:
    assert summary(sharded)["shard_optimizer"] is True and summary(plain)["shard_optimizer"] is False
    ls, lu = losses(sharded), losses(plain)
    assert len(ls) == len(lu) == 20, (len(ls), len(lu))
    rel = float(np.max(np.abs(ls - lu) / np.abs(lu)))
    print(f"{sharded} vs {plain}: max relative loss difference {rel:.2e}")
    assert rel < 1e-6, f"{sharded}: losses differ from {plain} by {rel}"
    close(state(last(sharded)), state(last(plain)), 1e-2 * LR_SUM, f"{sharded} vs {plain}")

# Clipping acted: every step's norm is above the clip, and the clipped run took other steps.
import re
norms = [float(m) for m in re.findall(r"grad norm ([0-9.]+)", open("c4.log").read())]
assert len(norms) == 20 and min(norms) > 0.05, norms
assert not np.allclose(losses("c4")[1:], losses("s22")[1:], rtol=1e-6), "grad_clip=0.05 changed nothing"

# The sharded checkpoint is the whole state: the unsharded run's at the same step.
close(state("runs/part/checkpoints/step-00000004.h5"), state("runs/upart/checkpoints/step-00000004.h5"),
      1e-2 * 4 * 3e-3, "sharded vs unsharded checkpoint at step 4")
# Resumes: sharded == unsharded bit for bit on the same ranks; all match 8 steps straight.
ref_l, ref = losses("straight"), state(last("straight"))
def resumed_losses(run):
    rows = {}
    for name in ["runs/part/metrics/rank-00000.csv", f"runs/{run}/metrics/rank-00000.csv"]:
        for r in csv.DictReader(open(name)):
            rows[int(r["step"])] = float(r["loss"])
    return np.array([rows[s] for s in range(8)])
for sharded, plain, ranks in [("r2", "u2r", 2), ("r3", "u3r", 3)]:
    a, b = state(last(sharded)), state(last(plain))
    for k in a:
        assert np.array_equal(a[k], b[k]), f"resume on {ranks} ranks: {k} differs sharded vs unsharded"
    assert np.array_equal(resumed_losses(sharded), resumed_losses(plain)), f"resume on {ranks}: losses differ"
    print(f"resume on {ranks} ranks: sharded == unsharded, bit for bit")
for run in ["r1", "r2", "r3"]:
    rel = float(np.max(np.abs(resumed_losses(run) - ref_l) / np.abs(ref_l)))
    print(f"{run}: max relative loss difference to 8 steps straight {rel:.2e}")
    assert rel < 1e-5, f"{run}: {rel}"
    close(state(last(run)), ref, 1e-2 * 8 * 3e-3, f"{run} vs straight")
PY
echo "shard_optimizer: 1 passed, 0 failed"
