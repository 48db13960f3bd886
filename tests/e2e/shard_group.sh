#!/usr/bin/env bash
# Sharding inside the node and replicating across nodes (HSDP: train.shard = optimizer with
# train.shard_group = node) on 4 ranks as 2 nodes x 2 (comm.ranks_per_node = 2):
# - the losses of 20 steps equal those of train.shard = none on the same 2 x 2 within 1e-6
#   relative (the gradients are reduced in the same order; only the norm's sum differs), and
#   those of 1 rank within 1e-5;
# - summary.json says which sharding was in force and how many ranks shared one copy;
# - a checkpoint written under HSDP stops after 4 of 8 steps and resumes as train.shard = none on
#   2 ranks (one node) and as train.shard = optimizer with the world as the group on the same
#   2 x 2, matching 8 steps straight (comm.ranks_per_node counts in the config hash, so a resume
#   keeps it: 2 ranks per node);
# - groups of 2 consecutive ranks on one node of 4 (train.shard_group = 2) give the same losses;
# - a group that does not divide the world, train.grad_dtype = bf16 under parameters (not built) and a contradicting alias are refused
#   naming the key.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 600 --lengths lognormal:4,0.9,300 --vocab 97 --shards 3 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=20 --train.warmup=2
        --train.lr=3e-3 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60)
NODES=--comm.ranks_per_node=2
HSDP=($NODES --train.shard=optimizer --train.shard_group=node)

train h22.log 4 --output.dir=runs/h22 "${HSDP[@]}"
train u22.log 4 --output.dir=runs/u22 $NODES --train.shard=none
train one.log 1 --output.dir=runs/one
# Groups of 2 consecutive ranks on one node of 4, flat reduction asked: the groups play the nodes.
train g2.log 4 --output.dir=runs/g2 --train.shard=optimizer --train.shard_group=2 --comm.algo=flat

# Resume across modes and world sizes: HSDP on 4 ranks stops after 4 of 8 steps.
COMMON=("${COMMON[@]/--train.steps=20/--train.steps=8}")
train straight.log 4 --output.dir=runs/straight $NODES --train.shard=none
stop_after part.log 4 4 --output.dir=runs/part "${HSDP[@]}"
cp -r runs/part runs/n2 && cp -r runs/part runs/o4
train n2.log 2 --resume runs/n2 $NODES --train.shard=none
train o4.log 4 --resume runs/o4 $NODES --train.shard=optimizer
grep -q "resumed from runs/n2/checkpoints/step-00000004.h5" n2.log || { cat n2.log; fail "no resume on 2 ranks"; }

refused() {  # refused LOG TEXT NP [args]: a run that must fail at once, saying TEXT
  local log=$1 text=$2 np=$3 rc=0
  shift 3
  timeout 120 "${MPIRUN[@]}" -np "$np" "$KILTER" train "${COMMON[@]}" "$@" > "$log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || { cat "$log"; fail "$log: the run was not refused"; }
  grep -qF "$text" "$log" || { cat "$log"; fail "$log: no '$text'"; }
}
refused g3.log "config key train.shard_group = 3: a shard group of 3 ranks does not divide the world size 4" \
  4 --output.dir=runs/g3 $NODES --train.shard_group=3
refused b2.log "config key train.grad_dtype = bf16" 2 --output.dir=runs/b2 --train.grad_dtype=bf16 --train.shard=parameters \
  --data.cut_pieces=false
refused a2.log "train.shard = none and train.shard_optimizer = true contradict" 2 --output.dir=runs/a2 \
  --train.shard=none --train.shard_optimizer=true

"$PY" - "$SRC/tests/python" <<'PY'
import csv, json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses

def summary(run):
    return json.load(open(f"runs/{run}/summary.json"))

s = summary("h22")
assert s["shard"] == "optimizer" and s["shard_group_ranks"] == 2 and s["num_nodes"] == 2, s
assert summary("u22")["shard"] == "none", summary("u22")["shard"]
lh, lu, l1 = losses("h22"), losses("u22"), losses("one")
assert len(lh) == len(lu) == len(l1) == 20, (len(lh), len(lu), len(l1))
rel = float(np.max(np.abs(lh - lu) / np.abs(lu)))
print(f"HSDP vs none on 2 x 2: max relative loss difference {rel:.2e} ({'bit for bit' if rel == 0 else 'rounding'})")
assert rel < 1e-6, rel
g2 = summary("g2")
assert g2["shard_group_ranks"] == 2 and g2["num_nodes"] == 1, g2
rel2 = float(np.max(np.abs(losses("g2") - lh) / np.abs(lh)))
print(f"groups of 2 on one node of 4 vs HSDP on 2 x 2: max relative loss difference {rel2:.2e}")
assert rel2 < 1e-6, rel2
rel1 = float(np.max(np.abs(lh - l1) / np.abs(l1)))
print(f"HSDP on 2 x 2 vs 1 rank: max relative loss difference {rel1:.2e}")
assert rel1 < 1e-5, rel1

ref = losses("straight")
def resumed_losses(run):
    rows = {}
    for name in ["runs/part/metrics/rank-00000.csv", f"runs/{run}/metrics/rank-00000.csv"]:
        for r in csv.DictReader(open(name)):
            rows[int(r["step"])] = float(r["loss"])
    return np.array([rows[s] for s in range(8)])
for run in ["n2", "o4"]:
    rel = float(np.max(np.abs(resumed_losses(run) - ref) / np.abs(ref)))
    print(f"HSDP checkpoint resumed as {run}: max relative loss difference to 8 steps straight {rel:.2e}")
    assert rel < 1e-5, f"{run}: {rel}"
PY
echo "shard_group: 1 passed, 0 failed"
