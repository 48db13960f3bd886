#!/usr/bin/env bash
# Activation recomputation (train.recompute, issue 24) end to end: 2 ranks, 6 steps, each mode
# against none, BIT FOR BIT (losses of every step, final weights and AdamW moments):
# - recompute = gelu, attention and block, fp32;
# - recompute = block with pieces longer than data.max_tokens, cut between the ranks (the K/V
#   exchange of issue 23: a later part's recomputed attention reads its prefix again), sharded;
# - recompute = block in bf16 (skipped without bf16 GEMM instructions).
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 400 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 5 --out data >/dev/null
BASE=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --train.steps=6 --train.warmup=2
      --train.lr=3e-3 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60)
COMMON=("${BASE[@]}" --model.block_size=64 --data.max_tokens=256 --train.tokens_per_step=1024)
PAIRS=()
for mode in none gelu attention block; do train $mode.log 2 --output.dir=runs/$mode --train.recompute=$mode; done
PAIRS+=(gelu:none attention:none block:none)
COMMON=("${BASE[@]}" "${CUT[@]}")
train cut_none.log 2 --output.dir=runs/cut_none
train cut_block.log 2 --output.dir=runs/cut_block --train.recompute=block
COMMON=("${BASE[@]}" --model.block_size=64 --data.max_tokens=256 --train.tokens_per_step=1024)
PAIRS+=(cut_block:cut_none)
if grep -q -m1 -E 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  train bf16_none.log 2 --output.dir=runs/bf16_none --train.precision=bf16
  train bf16_block.log 2 --output.dir=runs/bf16_block --train.precision=bf16 --train.recompute=block
  PAIRS+=(bf16_block:bf16_none)
else
  echo "recompute: no bf16 GEMM instructions here; the bf16 pair is skipped"
fi

"$PY" - "${PAIRS[@]}" <<'PY'
import csv, glob, json, sys
import h5py
import numpy as np

def column(run, rank, key):
    with open(f"runs/{run}/metrics/rank-{rank:05d}.csv") as f:
        return [r[key] for r in csv.DictReader(f)]

def state(run):
    path = sorted(glob.glob(f"runs/{run}/checkpoints/step-*.h5"))[-1]
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...])
                     if isinstance(obj, h5py.Dataset) and name.split("/")[0] in ("params", "adam") else None)
    return out

for pair in sys.argv[1:]:
    run, ref = pair.split(":")
    for rank in (0, 1):
        got, want = column(run, rank, "loss"), column(ref, rank, "loss")
        assert len(got) == len(want) == 6, (run, len(got), len(want))
        assert got == want, f"{run} rank {rank}: losses {got} differ from {ref}'s {want}"
    a, b = state(run), state(ref)
    assert a.keys() == b.keys() and any(k.startswith("adam") for k in a), (run, sorted(a))
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{run}: {k} differs from {ref}'s"
    print(f"{run} == {ref}: losses of 6 steps on both ranks, weights and moments, bit for bit")
PY
echo "recompute: 1 passed, 0 failed"
