#!/usr/bin/env bash
# The distributed optimizer (train.shard = optimizer under bf16 storage, Megatron's): each rank
# keeps the fp32 master of its own ranges only, with their moments, and the bf16 working copy is
# what is all-gathered after the update.
# - gpt2 and llama on 4 ranks (and 2 nodes x 2): the losses of `optimizer` are within 1e-4
#   relative of `none`'s (every weight, the norms' and the embeddings' too, is read through the
#   bf16 working copy: docs/comm.md), HSDP (groups of a node) too, with evaluation within 1e-4 and
#   training samples; fp32 `optimizer` still equals fp32 `none` within 1e-6;
# - train.grad_dtype: bf16 accumulation (auto under bf16 storage, or asked for under fp32) changes
#   the losses of fp32 accumulation, within 1e-3 relative on 1 rank of 4-5 micro-batches a step;
# - the checkpoint holds the fp32 master, not its bf16 rounding (most values have low bits), and
#   its weights are within the lr bound of `none`'s;
# - a distributed-optimizer checkpoint resumes on 4 ranks bit for bit as the run straight through,
#   and on 1 rank (none), 3 ranks (optimizer) and 2 ranks (parameters) within 1e-4;
# - the memory plan's per-rank figure is within 10% of the measured peak RSS on 4 ranks, and the
#   plan prices the master 1/G (kilter plan --memory --json).
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 600 --lengths lognormal:4,0.9,300 --vocab 97 --shards 3 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=8 --train.warmup=2
        --train.lr=3e-3 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60)
BF16=(--train.precision=bf16 --train.bf16_storage=on)
LLAMA=(--model.arch=llama --model.n_kv_head=1 --model.ffn_hidden=80 --model.rope_theta=10000
       --model.tie_embeddings=false)

train g_opt.log 4 --output.dir=runs/g_opt --train.shard=optimizer "${BF16[@]}"
train g_none.log 4 --output.dir=runs/g_none --train.shard=none "${BF16[@]}"
train l_opt.log 4 --output.dir=runs/l_opt --train.shard=optimizer "${LLAMA[@]}" "${BF16[@]}"
train l_none.log 4 --output.dir=runs/l_none --train.shard=none "${LLAMA[@]}" "${BF16[@]}"
train g_opt22.log 4 --output.dir=runs/g_opt22 --train.shard=optimizer --comm.ranks_per_node=2 --comm.algo=hierarchical "${BF16[@]}"
# HSDP (the master sharded inside each node of 2, replicated across), with evaluation and training
# samples (which read the working copy, widened), against none with the same evaluation.
EVAL=(--train.eval_every=4 --data.eval_fraction=0.1 --output.sample_every=4 --output.sample_tokens=8)
train g_hsdp.log 4 --output.dir=runs/g_hsdp --train.shard=optimizer --train.shard_group=node --comm.ranks_per_node=2 \
  "${EVAL[@]}" "${BF16[@]}"
train g_evnone.log 4 --output.dir=runs/g_evnone --train.shard=none --comm.ranks_per_node=2 "${EVAL[@]}" "${BF16[@]}"
train f_opt.log 4 --output.dir=runs/f_opt --train.shard=optimizer --train.precision=fp32 --train.bf16_storage=off
train f_none.log 4 --output.dir=runs/f_none --train.shard=none --train.precision=fp32 --train.bf16_storage=off

# train.grad_dtype on 1 rank (4-5 micro-batches a step): auto under bf16 storage accumulates in bf16,
# as does bf16 asked for under fp32; against fp32 accumulation.
train ga1.log 1 --output.dir=runs/ga1 "${BF16[@]}"
train gf1.log 1 --output.dir=runs/gf1 --train.grad_dtype=fp32 "${BF16[@]}"
train fb1.log 1 --output.dir=runs/fb1 --train.grad_dtype=bf16
train ff1.log 1 --output.dir=runs/ff1

# Resume: 4 ranks stop after 4 of 8 steps, then go on as 4 (optimizer), 3 (optimizer) and 1.
stop_after part.log 4 4 --output.dir=runs/part --train.shard=optimizer "${BF16[@]}"
for r in r4 r3 r1; do cp -r runs/part runs/$r; done
train r4.log 4 --resume runs/r4 --train.shard=optimizer "${BF16[@]}"
train r3.log 3 --resume runs/r3 --train.shard=optimizer "${BF16[@]}"
train r1.log 1 --resume runs/r1 "${BF16[@]}"
# And as parameters on 2 ranks (which needs whole pieces: data.cut_pieces = false from the start).
WHOLE=(--data.cut_pieces=false)
train pcs.log 4 --output.dir=runs/pcs --train.shard=optimizer "${WHOLE[@]}" "${BF16[@]}"
stop_after pc.log 4 4 --output.dir=runs/pc --train.shard=optimizer "${WHOLE[@]}" "${BF16[@]}"
train pcp.log 2 --resume runs/pc --train.shard=parameters "${WHOLE[@]}" "${BF16[@]}"

"$PY" - "$SRC/tests/python" <<'PY'
import csv, glob, sys
import h5py
import numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses, losses_of

def params(path):
    with h5py.File(path, "r") as f:
        out = {}
        f["params"].visititems(lambda n, o: out.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
        return out

def last(run):
    return sorted(glob.glob(f"runs/{run}/checkpoints/step-*.h5"))[-1]

def rel(a, b):
    return float(np.max(np.abs(a - b) / np.abs(b)))

# Measured: 2.3e-5 (gpt2), 7.4e-6 (llama), 2.3e-5 (2 x 2), 1.6e-5 (HSDP; evaluation 2.7e-6).
for opt, none, bound in [("g_opt", "g_none", 1e-4), ("l_opt", "l_none", 1e-4), ("g_opt22", "g_none", 1e-4),
                         ("g_hsdp", "g_evnone", 1e-4),
                         ("f_opt", "f_none", 1e-6)]:
    a, b = losses(opt), losses(none)
    assert len(a) == len(b) == 8, (len(a), len(b))
    print(f"{opt} vs {none}: max relative loss difference {rel(a, b):.2e} (bound {bound})")
    assert rel(a, b) < bound, f"{opt}: losses differ from {none} by {rel(a, b)}"
# bf16 accumulation moves the losses (it is in force), by little. Measured: 1.2e-5 and 7.3e-6.
for bf, fp in [("ga1", "gf1"), ("fb1", "ff1")]:
    d = rel(losses(bf), losses(fp))
    print(f"{bf} vs {fp} (bf16 vs fp32 gradient accumulation): max relative loss difference {d:.2e}")
    assert 0 < d < 1e-3, (bf, fp, d)

def eval_losses(run):
    with open(f"runs/{run}/metrics/train.csv") as f:
        return np.array([float(r["eval_loss"]) for r in csv.DictReader(f) if r["eval_loss"]])
ev, en = eval_losses("g_hsdp"), eval_losses("g_evnone")
assert len(ev) == len(en) >= 2, (len(ev), len(en))
print(f"g_hsdp: evaluation vs none, max relative difference {rel(ev, en):.2e}")
assert rel(ev, en) < 1e-4, rel(ev, en)
assert open("g_hsdp.log").read().count("sample at step") >= 2, "no training samples under the distributed optimizer"
# A run that changed nothing would pass the bound: bf16 storage must differ from fp32.
assert rel(losses("g_opt"), losses("f_opt")) > 1e-6, "bf16 storage gave fp32's losses"

# The checkpoint holds the fp32 master: a bf16 rounding would leave the low 16 bits zero.
for run in ("g_opt", "l_opt"):
    master = params(last(run))
    bits = np.concatenate([v.astype(np.float32).ravel().view(np.uint32) for v in master.values()])
    low = float(np.mean((bits & 0xFFFF) != 0))
    print(f"{run}: {low:.3f} of the checkpoint's weights have fp32 bits below bf16's")
    assert low > 0.9, f"{run}: the checkpoint holds the bf16 working copy, not the fp32 master ({low})"
    other = params(last(run.replace("opt", "none")))
    for k in master:
        d = float(np.max(np.abs(master[k] - other[k])))
        assert d <= 8 * 3e-3, f"{run}: {k} differs from none's by {d}"

# Resumes: on the same 4 ranks bit for bit; on 3 and 1 within the tolerance.
straight = losses("g_opt")
parts = lambda run: losses_of(["runs/part/metrics/rank-00000.csv", f"runs/{run}/metrics/rank-00000.csv"], 8)
assert np.array_equal(parts("r4"), straight), (parts("r4"), straight)
a, b = params(last("r4")), params(last("g_opt"))
assert all(np.array_equal(a[k], b[k]) for k in a), "resume on 4 ranks: the master differs from straight"
print("resume on 4 ranks: bit for bit")
for run in ("r3", "r1"):
    print(f"resume {run}: max relative loss difference to straight {rel(parts(run), straight):.2e}")
    assert rel(parts(run), straight) < 1e-4, run
assert "resumed from runs/pc/checkpoints/step-00000004.h5" in open("pcp.log").read(), "no resume under parameters"
pc = losses_of(["runs/pc/metrics/rank-00000.csv"], 8)  # steps 0-3 on 4 ranks, 4-7 resumed (later rows win)
d = rel(pc, losses("pcs"))
print(f"resume as parameters on 2 ranks: max relative loss difference to straight {d:.2e}")
assert d < 1e-4, d
PY

# Memory: the plan against the measured peak RSS of every rank (getrusage through time(1)), 4 ranks,
# a model whose state outweighs its activations (50 M parameters, 256 tokens a micro-batch), so
# that a whole master (3/4 of the padded buffer x 4 bytes more, about 22% here) would not pass.
# With the communication thread on (comm.overlap's default): its freed MPI temporaries are returned
# to the system after each reduction and gather, without which ranks peaked 50-180 MiB above the plan.
MEM=(--model.n_layer=4 --model.n_head=8 --model.n_embd=1024 --model.block_size=256 --data.max_tokens=256
     --train.tokens_per_step=1024 --train.steps=2 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=120
     --train.precision=bf16 --train.bf16_storage=on --train.shard=optimizer)
"$KILTER" plan --data data --world-size 4 "${MEM[@]}" --memory --json > plan_opt.json
"$KILTER" plan --data data --world-size 4 "${MEM[@]/--train.shard=optimizer/--train.shard=none}" --memory --json \
  > plan_none.json
timeout 600 "${MPIRUN[@]}" -np 4 bash -c 'exec /usr/bin/time -o "$0.rss.$OMPI_COMM_WORLD_RANK" -f %M "$@"' \
  mem "$KILTER" train --data.dir=data "${MEM[@]}" --output.dir=runs/mem > mem.log 2>&1 \
  || { cat mem.log; fail "mem: kilter train failed"; }
"$PY" - <<'PY'
import json, os
o = json.load(open("plan_opt.json"))["memory"]
n = json.load(open("plan_none.json"))["memory"]
padded = n["parameters_bytes"] // 6  # none under bf16: the fp32 master and the bf16 copy, whole
# The master 1/4 with the moments beside the whole working copy (and a few pages of widened norms).
assert 2 * padded + padded // 4 * 4 <= o["parameters_bytes"] <= 2 * padded + padded + (1 << 20), (o, padded)
whole_master = 3 * (padded // 4) * 4
for rank in range(4):
    key = "rank0_bytes" if rank == 0 else "other_rank_bytes"
    measured = int(open(f"mem.rss.{rank}").read().split()[-1]) * 1024
    ratio = o[key] / measured
    print(f"rank {rank}: estimate {o[key] / 2**20:.1f} MiB, peak RSS {measured / 2**20:.1f} MiB, "
          f"ratio {ratio:.3f} (a whole master: {(o[key] + whole_master) / measured:.3f})")
    if "ASAN_OPTIONS" not in os.environ:
        assert 0.9 <= ratio <= 1.1, f"rank {rank}: estimate {o[key]} vs peak RSS {measured}"
        assert (o[key] + whole_master) / measured > 1.1, "the check cannot tell a whole master"
PY
echo "distributed_optimizer: 1 passed, 0 failed"
