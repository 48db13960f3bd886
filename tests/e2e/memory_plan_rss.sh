#!/usr/bin/env bash
# The memory plan against the measured peak RSS of every rank, by sharding mode, with the
# communication thread on (comm.overlap's default): 4 ranks of a 50 M-parameter gpt2 (4 layers x
# 1024, 256 tokens a micro-batch), whose state outweighs its activations, under none, optimizer
# and parameters in fp32 and under parameters with bf16 storage (optimizer with bf16 storage is
# e2e_distributed_optimizer's). Every rank's plan figure is within 10% of its peak (getrusage at
# exit, through time(1)); not asserted under ASan (its shadow memory is no part of the plan).
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 600 --lengths lognormal:4,0.9,300 --vocab 97 --shards 3 --seed 7 --out data >/dev/null
MEM=(--model.n_layer=4 --model.n_head=8 --model.n_embd=1024 --model.block_size=256 --data.max_tokens=256
     --train.tokens_per_step=1024 --train.steps=2 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=120
     --data.cut_pieces=false)
BF16=(--train.precision=bf16 --train.bf16_storage=on)

measure() {  # measure NAME [args]: the plan into NAME.json, each rank's peak into NAME.rss.RANK
  local name=$1; shift
  "$KILTER" plan --data data --world-size 4 "${MEM[@]}" "$@" --memory --json > "$name.json" 2> "$name.plan.err" \
    || { cat "$name.plan.err"; fail "kilter plan $name failed"; }
  timeout 300 "${MPIRUN[@]}" -np 4 bash -c 'exec /usr/bin/time -o "$0.rss.$OMPI_COMM_WORLD_RANK" -f %M "$@"' \
    "$name" "$KILTER" train --data.dir=data "${MEM[@]}" "$@" --output.dir="runs/$name" > "$name.log" 2>&1 \
    || { cat "$name.log"; fail "$name: kilter train failed"; }
}
measure none --train.shard=none
measure opt --train.shard=optimizer
measure par --train.shard=parameters
measure parb --train.shard=parameters "${BF16[@]}"

"$PY" - <<'PY'
import json, os
bad = []
for run in ("none", "opt", "par", "parb"):
    plan = json.load(open(f"{run}.json"))["memory"]
    assert plan["shard"] == {"none": "none", "opt": "optimizer"}.get(run, "parameters"), plan["shard"]
    for rank in range(4):
        key = "rank0_bytes" if rank == 0 else "other_rank_bytes"
        measured = int(open(f"{run}.rss.{rank}").read().split()[-1]) * 1024
        ratio = plan[key] / measured
        print(f"{run} rank {rank}: estimate {plan[key] / 2**20:.1f} MiB, peak RSS {measured / 2**20:.1f} MiB, ratio {ratio:.3f}")
        # Under optimizer, ranks 0 and 2 also hold Open MPI's reduce-scatter temporaries of the
        # buckets in flight (the roots of its binomial reduction): bounded by the reducer
        # (comm::kMpiBucketsInFlight) and priced by the plan. Unbounded, rank 0 peaked in the
        # reduction 0.83-0.93 of the plan, by an amount that moved with the thread's timing.
        if not 0.9 <= ratio <= 1.1:
            bad.append(f"{run} rank {rank}: estimate {plan[key]} vs peak RSS {measured} (ratio {ratio:.3f})")
if "ASAN_OPTIONS" not in os.environ:
    assert not bad, "; ".join(bad)
PY
echo "memory_plan_rss: 1 passed, 0 failed"
