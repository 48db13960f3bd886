"""Shared by tests/e2e/invariance.sh and tests/cluster/train.sh: the losses and final weights of
training runs under runs/NAME (relative to the working directory), and the comparison of a run
to a reference run.

Losses must agree to 1e-5 relative. Weights must agree to 1% of the most Adam can move a weight
in the run (lr_sum = train.steps x train.lr bounds the sum of the schedule's learning rates):
Adam moves a coordinate by lr * m / (sqrt(v) + eps), about lr per step whatever the gradient's
size, so a coordinate whose gradient is near eps or cancels to rounding level (the key bias's is
exactly 0) moves by a fraction of lr that rounding decides; and packing micro-batches per rank
changes the summation order. The losses, which such coordinates do not affect, stay within 1e-5.
"""
import csv
import glob

import h5py
import numpy as np


def losses(run):
    with open(f"runs/{run}/metrics/rank-00000.csv") as f:
        return np.array([float(r["loss"]) for r in csv.DictReader(f)])


def losses_of(files, steps):
    """Per-step losses of steps 0..steps-1 from metrics CSVs read in order (a run's first part,
    then its resume): a later row of a step wins."""
    rows = {}
    for name in files:
        with open(name) as f:
            for r in csv.DictReader(f):
                rows[int(r["step"])] = float(r["loss"])
    return np.array([rows[s] for s in range(steps)])


def params(run):
    files = sorted(glob.glob(f"runs/{run}/checkpoints/step-*.h5"))
    assert files, f"no checkpoint in runs/{run}"
    with h5py.File(files[-1], "r") as f:
        return {k: f["params"][k][...] for k in f["params"]}


def compare_to_reference(run, ref_l, ref_p, lr_sum, label=None):
    """Asserts that run's losses and final weights match the reference's (see above)."""
    label = label or run
    l, p = losses(run), params(run)
    assert len(l) == len(ref_l), (run, l)
    rel = np.max(np.abs(l - ref_l) / np.abs(ref_l))
    print(f"{label}: max relative loss difference {rel:.2e}")
    assert rel < 1e-5, f"{run}: losses differ from 1 rank by {rel}"
    worst = max((np.max(np.abs(p[k] - ref_p[k])), k) for k in ref_p)
    print(f"{label}: largest weight difference {worst[0]:.2e} ({worst[1]}), bound {1e-2 * lr_sum:.2e}")
    assert worst[0] < 1e-2 * lr_sum, f"{run}: {worst[1]} differs by {worst[0]}"
