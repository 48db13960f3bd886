#!/usr/bin/env bash
# cluster (issue 15): training on 2 real nodes x 2 ranks (scripts/vcluster). With
# comm.ranks_per_node unset the node communicators come from MPI_Comm_split_type(SHARED) over
# the ranks' real hosts: the run says 2 nodes x 2 and summary.json num_nodes 2, and
# comm_topology_test's host check passes across the nodes. Hierarchical, flat and 1 rank give
# the same losses (1e-5 relative) and final weights (float tolerance).
# Usage: train.sh KILTER [COMM_TOPOLOGY_TEST]
topology_test=${2:+$(readlink -f "$2")}
source "$(dirname "$0")/lib.sh"

vc up --nodes 2
"$KILTER" prep synth --docs 600 --lengths lognormal:4,0.9,300 --vocab 97 --shards 3 --seed 7 --out data >/dev/null
COMMON=(--data.dir="$WORK/data" --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=6 --train.warmup=2
        --train.lr=3e-3 --output.log_every=1)

if [[ -n $topology_test ]]; then
  vc_mpirun -np 4 --npernode 2 "$topology_test" > topology.log 2>&1 || { cat topology.log; fail "comm_topology_test across 2 nodes failed"; }
  grep -q "PASSED" topology.log || { cat topology.log; fail "comm_topology_test printed no PASSED"; }
  echo "ok: comm_topology_test (shared-memory split = hosts) passes on 2 nodes x 2"
fi

run() {  # run NAME NP [extra args]
  local name=$1 np=$2
  shift 2
  vc_mpirun -np "$np" --npernode $(( np < 2 ? 1 : 2 )) "$KILTER" train "${COMMON[@]}" --output.dir="$WORK/runs/$name" "$@" \
    > "$name.log" 2>&1 || { cat "$name.log"; fail "run $name failed"; }
}
run p1 1
run h 4 --comm.algo=hierarchical
run f 4 --comm.algo=flat

for name in h f; do
  grep -q "4 ranks (2 nodes x 2)" "$name.log" || { cat "$name.log"; fail "$name: kilter does not see 2 nodes x 2"; }
  [[ $(json_field "runs/$name/summary.json" num_nodes) == 2 ]] || fail "$name: summary.json num_nodes is not 2"
done
grep -q "comm mpi/hierarchical" h.log || fail "h: the reduction is not hierarchical"
grep -q "1 ranks (1 nodes x 1)" p1.log || fail "p1: not a 1-rank run"

"$PY" - "$SRC/tests/python" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses, params, compare_to_reference  # tolerances as tests/e2e/invariance.sh

ref_l, ref_p = losses("p1"), params("p1")
assert len(ref_l) == 6 and np.isfinite(ref_l).all(), ref_l
for run in ["h", "f"]:
    compare_to_reference(run, ref_l, ref_p, 6 * 3e-3, label=f"2 nodes x 2, {run} vs 1 rank")
PY
echo "PASS: cluster train (2 nodes x 2: hierarchical == flat == 1 rank; topology from hosts)"
