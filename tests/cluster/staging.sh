#!/usr/bin/env bash
# cluster (issue 15): node-local staging across 2 real nodes (scripts/vcluster). data.stage_dir
# on the node-local path (/vcluster/local, a different directory on each node) makes exactly one
# verified copy per node, by that node's local rank 0; the next job on the same nodes reuses both
# copies; a copy corrupted on one node is replaced on that node only; the copies live in each
# node's own backing directory and nowhere else.
source "$(dirname "$0")/lib.sh"

vc up --nodes 2
"$KILTER" prep synth --docs 400 --lengths lognormal:4,0.9,300 --vocab 97 --shards 3 --seed 5 --out data >/dev/null
stage=$LOCAL/stage/data
COMMON=(--data.dir="$WORK/data" --data.stage_dir="$stage" --model.n_layer=1 --model.n_head=2 --model.n_embd=32
        --model.block_size=64 --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=3
        --train.warmup=1 --output.log_every=1)
job() {  # job NAME: 2 nodes x 2 ranks
  vc_mpirun -np 4 --npernode 2 "$KILTER" train "${COMMON[@]}" --output.dir="$WORK/runs/$1" > "$1.log" 2>&1 ||
    { cat "$1.log"; fail "job $1 failed"; }
}
staged_lines() { grep "^kilter: staged $stage on " "$1" || true; }

# ---- first job: one copy per node ------------------------------------------------------------------
job first
[[ $(staged_lines first.log | wc -l) == 2 ]] || { cat first.log; fail "first job: expected one staging line per node (2)"; }
for node in node1 node2; do
  staged_lines first.log | grep -q "on $node: 3 shards copied, 0 reused, 0 replaced" ||
    { staged_lines first.log; fail "first job: $node did not copy the 3 shards"; }
  # The copy is on that node (its own backing directory) and verifies against the index.
  vc exec "$node" "$KILTER" prep validate "$stage" > "validate-$node.log" 2>&1 ||
    { cat "validate-$node.log"; fail "the copy on $node does not validate"; }
  [[ $(vc exec "$node" hostname) == "$node" ]] || fail "vcluster exec $node: wrong hostname"
done
[[ -f /run/vcluster/node1/local/stage/data/index.h5 && -f /run/vcluster/node2/local/stage/data/index.h5 ]] ||
  fail "the copies are not in the nodes' own backing directories"
[[ ! -e $stage ]] || fail "$stage exists outside the nodes: the node-local directory is not per node"
echo "ok: first job: one verified copy per node (node1, node2), each in its own node-local directory"

# ---- second job on the same nodes: both copies reused ------------------------------------------------
job second
for node in node1 node2; do
  staged_lines second.log | grep -q "on $node: 0 shards copied, 3 reused, 0 replaced" ||
    { staged_lines second.log; fail "second job: $node did not reuse its copy"; }
done
echo "ok: second job: both nodes reused their verified copies"

# ---- a damaged copy on node2 is replaced there only -----------------------------------------------------
shard=$(cd /run/vcluster/node2/local/stage/data && ls shard-*.h5 | head -n 1)
vc exec node2 "$PY" - "$stage/$shard" <<'PY'
import sys
import h5py
with h5py.File(sys.argv[1], "r+") as f:
    f["tokens"][0] = (int(f["tokens"][0]) + 1) % 97   # one token changed: the content hash no longer matches
PY
job third
staged_lines third.log | grep -q "on node1: 0 shards copied, 3 reused, 0 replaced" || { staged_lines third.log; fail "third job: node1 should reuse all"; }
staged_lines third.log | grep -q "on node2: 0 shards copied, 2 reused, 1 replaced" || { staged_lines third.log; fail "third job: node2 should replace its damaged shard"; }
cmp <(cut -d, -f1-3 runs/first/metrics/rank-00000.csv) <(cut -d, -f1-3 runs/third/metrics/rank-00000.csv) >/dev/null || fail "the replaced copy trains differently from the first job"
echo "ok: third job: node2 replaced its damaged shard, node1 reused; same losses as the first job"
echo "PASS: cluster staging"
