#!/usr/bin/env bash
# Resume on another world size (issue 8): steps do not depend on the world size, so a run of
# train.steps = 8 on 2 ranks, preempted after 4 steps (SIGUSR1 drill) and resumed on 1 and on 3
# ranks gives the losses and weights of 8 steps straight
# on 2 ranks, to float tolerance (reduction order differs, so not bit for bit).
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.warmup=2 --train.lr=3e-3
        --train.steps=8 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60 --comm.algo=flat)

train straight.log 2 --output.dir=runs/straight
stop_after part.log 2 4 --output.dir=runs/p1
cp -r runs/p1 runs/p3
cp runs/p1/metrics/rank-00000.csv part.csv  # kept aside: whether or not a resume appends to it
train resume1.log 1 --resume runs/p1
train resume3.log 3 --resume runs/p3
grep -q "resumed from runs/p3/checkpoints/step-00000004.h5" resume3.log || { cat resume3.log; fail "no resume on 3 ranks"; }

"$PY" - "$SRC/tests/python" <<'PY'
import sys
import h5py, numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses_of

def losses(*files):
    return losses_of(files, 8)

ref = losses("runs/straight/metrics/rank-00000.csv")
fa = h5py.File("runs/straight/checkpoints/step-00000008.h5", "r")
for run, ranks in [("p1", 1), ("p3", 3)]:
    l = losses("part.csv", f"runs/{run}/metrics/rank-00000.csv")
    rel = np.max(np.abs(l - ref) / np.abs(ref))
    print(f"resumed on {ranks} rank(s): max relative loss difference {rel:.2e}")
    assert rel < 1e-5, f"{run}: losses differ by {rel}"
    fb = h5py.File(f"runs/{run}/checkpoints/step-00000008.h5", "r")
    assert fb.attrs["world_size"] == ranks, fb.attrs["world_size"]
    assert fb.attrs["step_in_epoch"] == fa.attrs["step_in_epoch"] and fb.attrs["epoch"] == fa.attrs["epoch"]
    for name in fa["params"]:
        x, y = fa["params"][name][...], fb["params"][name][...]
        scale = max(1e-3, float(np.max(np.abs(x))))
        d = float(np.max(np.abs(x - y)))
        assert d / scale < 1e-4, f"{run}: {name} differs by {d} (scale {scale})"
PY
echo "resume_world_size: 1 passed, 0 failed"
