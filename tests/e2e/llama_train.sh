#!/usr/bin/env bash
# model.arch = llama end to end (issue 38): the invariants the GPT-2 runs hold, with grouped-query
# attention (4 query heads over 2 K/V heads), RoPE and an untied head.
#   - determinism: two 1-rank runs are bit-identical;
#   - world-size invariance: 2 ranks, and 4 as 2 nodes x 2 (hierarchical), give the 1-rank losses
#     (1e-5) and weights (run_compare.py's rule), sharded and unsharded;
#   - cut pieces (3 ranks, one context per rank) and a context longer than a micro-batch (4 ranks,
#     model.block_size 256 over data.max_tokens 96: every long piece cut in a chain) give the 1-rank
#     losses of the same config;
#   - bf16 with recompute=block on 2 ranks matches its 1-rank run (where the CPU has bf16);
#   - resume onto another world size: 8 steps on 2 ranks stopped after 4 and resumed on 3 give the
#     straight run's losses; the checkpoint records the architecture.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 400 --lengths lognormal:4.2,0.9,300 --vocab 97 --shards 2 --seed 5 --out data >/dev/null
LLAMA=(--model.arch=llama --model.n_layer=2 --model.n_head=4 --model.n_kv_head=2 --model.n_embd=32
       --model.ffn_hidden=64 --model.rope_theta=500)
COMMON=(--data.dir=data "${LLAMA[@]}" --train.warmup=2 --train.lr=3e-3 --output.log_every=1
        --output.trace_steps=0 --comm.timeout_s=60)
SHAPE=(--model.block_size=64 --data.max_tokens=128 --train.tokens_per_step=512 --train.steps=6)
train p1.log 1 "${SHAPE[@]}" --output.dir=runs/p1
train p1b.log 1 "${SHAPE[@]}" --output.dir=runs/p1b
train p2.log 2 "${SHAPE[@]}" --output.dir=runs/p2 --train.shard_optimizer=false
train p4h.log 4 "${SHAPE[@]}" --output.dir=runs/p4h --comm.ranks_per_node=2 --comm.algo=hierarchical
# One context per rank: the plan cuts pieces between the 3 ranks.
CUT=(--model.block_size=64 --data.max_tokens=128 --train.tokens_per_step=192 --train.steps=6)
train c1.log 1 "${CUT[@]}" --output.dir=runs/c1
train c3.log 3 "${CUT[@]}" --output.dir=runs/c3
# A context longer than a micro-batch: long pieces are always cut (context parallelism).
# (1 rank cannot cut: its reference holds a whole context per micro-batch; the steps do not
# depend on data.max_tokens.)
LONG=(--model.block_size=256 --train.tokens_per_step=768 --train.steps=6)
train l1.log 1 "${LONG[@]}" --output.dir=runs/l1 --data.max_tokens=256
train l4.log 4 "${LONG[@]}" --output.dir=runs/l4 --data.max_tokens=96
bf16=0
if grep -q -m1 -E 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  train b1.log 1 "${SHAPE[@]}" --output.dir=runs/b1 --train.precision=bf16 --train.recompute=block
  train b2.log 2 "${SHAPE[@]}" --output.dir=runs/b2 --train.precision=bf16 --train.recompute=block
  bf16=1
else
  echo "llama_train: no bf16 GEMM instructions here; the bf16 pair is skipped"
fi
COMMON+=(--model.block_size=64 --data.max_tokens=128 --train.tokens_per_step=512 --train.steps=8)
train straight.log 2 --output.dir=runs/straight
stop_after part.log 2 4 --output.dir=runs/part
cp runs/part/metrics/rank-00000.csv part.csv
train resume3.log 3 --resume runs/part
grep -q "resumed from runs/part/checkpoints/step-00000004.h5" resume3.log || { cat resume3.log; fail "no resume on 3 ranks"; }

"$PY" - "$SRC/tests/python" "$bf16" <<'PY'
import csv, glob, sys
import h5py, numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses, losses_of, params, compare_to_reference

ref_l, ref_p = losses("p1"), params("p1")
assert len(ref_l) == 6 and np.isfinite(ref_l).all(), ref_l
assert "model.layers.0.self_attn.k_proj.weight" in ref_p and "lm_head.weight" in ref_p, sorted(ref_p)[:5]
assert ref_p["model.layers.0.self_attn.k_proj.weight"].shape == (16, 32)  # 2 K/V heads of 8
l, p = losses("p1b"), params("p1b")
assert (l == ref_l).all() and all(np.array_equal(p[k], ref_p[k]) for k in ref_p), "determinism: runs differ"
for run in ["p2", "p4h"]:
    compare_to_reference(run, ref_l, ref_p, 6 * 3e-3)

def cuts(run):
    rows = [r for f in glob.glob(f"runs/{run}/metrics/rank-*.csv") for r in csv.DictReader(open(f))]
    return sum(float(r["kv_tokens"]) > 0 for r in rows)

for single, many in [("c1", "c3"), ("l1", "l4")]:
    a, b = losses(single), losses(many)
    rel = np.max(np.abs(a - b) / np.abs(a))
    print(f"{many}: {cuts(many)} (rank, step) rows received K/V; max relative loss difference {rel:.2e}")
    assert cuts(many) > 0, f"{many}: no piece was cut"
    assert rel < 1e-5, f"{many}: losses differ from 1 rank by {rel}"
if sys.argv[2] == "1":
    a, b = losses("b1"), losses("b2")
    rel = np.max(np.abs(a - b) / np.abs(a))
    print(f"bf16 + recompute=block, 2 ranks: max relative loss difference {rel:.2e}")
    assert rel < 1e-4, f"b2: losses differ from 1 rank by {rel}"

ref = losses_of(["runs/straight/metrics/rank-00000.csv"], 8)
got = losses_of(["part.csv", "runs/part/metrics/rank-00000.csv"], 8)
rel = np.max(np.abs(got - ref) / np.abs(ref))
print(f"resumed on 3 ranks: max relative loss difference {rel:.2e}")
assert rel < 1e-5, f"resume: losses differ by {rel}"
f = h5py.File("runs/part/checkpoints/step-00000008.h5", "r")
assert f.attrs["arch"] == "llama" and int(f.attrs["n_kv_head"]) == 2, dict(f.attrs)
PY
echo "llama_train: 1 passed, 0 failed"
