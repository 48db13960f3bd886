#!/usr/bin/env bash
# The memory plan (issue 24):
# - `kilter plan --memory --json`: the optimizer state per rank falls as 1/P (P = 1, 2, 4);
# - the estimate agrees with the measured peak RSS of each rank within 10% (2 ranks, sharded and
#   not, and sharded with train.recompute = block, a model big enough that the buffers, not the
#   runtime, dominate; not asserted under ASan), and recompute=block's activations are smaller;
# - sharded, rank 0's peak does not grow by a snapshot of the state at its checkpoint (written by
#   slices), where unsharded it does;
# - a run whose node total exceeds the machine (KILTER_TEST_NODE_MEMORY_BYTES stands a small
#   machine in) is refused on every rank, naming the figure and the cheapest setting that fits
#   (here train.shard = optimizer), and the sharded run then starts; a machine that holds the
#   sharded run only with recomputation advises train.recompute = gelu;
# - a model far beyond any machine is refused before any rank allocates model memory (its ranks
#   peak below 1 GiB);
# - on the cuda backend (planned here without a GPU) the device figures add up, and a run whose
#   device cannot hold it is refused naming the device figure and the setting that fits.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 300 --lengths lognormal:5,0.6,1000 --vocab 97 --shards 2 --seed 3 --out data >/dev/null
MODEL=(--model.n_layer=4 --model.n_head=4 --model.n_embd=512 --model.block_size=256 --data.max_tokens=1024)
COMMON=(--data.dir=data "${MODEL[@]}" --train.tokens_per_step=4096 --train.steps=2 --output.log_every=1
        --output.trace_steps=0 --comm.timeout_s=60)

for p in 1 2 4; do "$KILTER" plan --data data --world-size $p "${MODEL[@]}" --memory --json > plan$p.json; done
"$KILTER" plan --data data --world-size 2 "${MODEL[@]}" --memory --json --train.shard_optimizer=false > plan2u.json
"$KILTER" plan --data data --world-size 2 "${MODEL[@]}" --memory --json --train.recompute=block > plan2b.json
"$KILTER" plan --data data --world-size 2 "${MODEL[@]}" --memory --json --train.recompute=gelu > plan2g.json

# Peak RSS of every rank of a run (getrusage at exit, through time(1)), one file per rank.
measure() {  # measure NAME [args]
  local name=$1; shift
  timeout 300 "${MPIRUN[@]}" -np 2 bash -c 'exec /usr/bin/time -o "$0.rss.$OMPI_COMM_WORLD_RANK" -f %M "$@"' \
    "$name" "$KILTER" train "${COMMON[@]}" --output.dir="runs/$name" "$@" > "$name.log" 2>&1 \
    || { cat "$name.log"; fail "$name: kilter train failed"; }
}
measure sharded
measure unsharded --train.shard_optimizer=false
measure block --train.recompute=block

"$PY" - <<'PY'
import json, os
plans = {p: json.load(open(f"plan{p}.json"))["memory"] for p in (1, 2, 4)}
opt = {p: plans[p]["optimizer_bytes"] for p in plans}
print("optimizer bytes per rank:", opt)
for p in (2, 4):
    assert plans[p]["shard_optimizer"] is True
    assert abs(opt[p] * p / opt[1] - 1) < 0.01, f"P={p}: optimizer state {opt[p]} is not 1/{p} of {opt[1]}"
block = json.load(open("plan2b.json"))["memory"]
assert block["recompute"] == "block" and block["activations_bytes"] < plans[2]["activations_bytes"] / 2, block
for run, plan in [("sharded", plans[2]), ("unsharded", json.load(open("plan2u.json"))["memory"]), ("block", block)]:
    for rank, key in [(0, "rank0_bytes"), (1, "other_rank_bytes")]:
        measured = int(open(f"{run}.rss.{rank}").read().split()[-1]) * 1024
        ratio = plan[key] / measured
        print(f"{run} rank {rank}: estimate {plan[key] / 2**20:.1f} MiB, peak RSS {measured / 2**20:.1f} MiB, ratio {ratio:.3f}")
        # ASan's shadow memory and quarantine are no part of the plan: the sanitizer builds run
        # everything else of this test.
        if "ASAN_OPTIONS" not in os.environ:
            assert 0.9 <= ratio <= 1.1, f"{run} rank {rank}: estimate {plan[key]} vs peak RSS {measured}"
# Sharded checkpoints are written by slices (docs/checkpoints.md): rank 0 holds no snapshot of the
# state, so its peak stays with the other rank's (pieces of 16 MiB apart), where unsharded it
# grows by the whole snapshot, 12 bytes a parameter (both runs checkpoint at their last step).
rss = {(run, r): int(open(f"{run}.rss.{r}").read().split()[-1]) * 1024 for run in ("sharded", "unsharded") for r in (0, 1)}
snapshot = 12 * plans[2]["num_params"]
grow_sharded = rss[("sharded", 0)] - rss[("sharded", 1)]
grow_unsharded = rss[("unsharded", 0)] - rss[("unsharded", 1)]
print(f"rank 0 above rank 1 at peak: sharded {grow_sharded / 2**20:.1f} MiB, unsharded {grow_unsharded / 2**20:.1f} MiB;"
      f" snapshot {snapshot / 2**20:.1f} MiB")
# Unsharded, rank 0's peak holds the snapshot above what the plan gives it without one. Against
# its own estimate, not rank 1's peak: rank 1's peak wanders by up to ~35 MiB from run to run
# (seen 458-496 MiB against its 459 MiB estimate), which made rank 0 - rank 1 miss 0.75 x the
# snapshot once (108 MiB of 110) with rank 0 at its estimate.
unsharded_plan = json.load(open("plan2u.json"))["memory"]
without_snapshot = unsharded_plan["rank0_bytes"] - unsharded_plan["checkpoint_bytes_rank0"]
assert rss[("unsharded", 0)] - without_snapshot > 0.75 * snapshot, \
    "unsharded rank 0 should hold the snapshot: the check cannot see it"

# Under ASan the quarantine keeps rank 0's freed 16 MiB pieces (the slices and the checksum
# read-back) resident, so the bound is checked in the normal build only. The plan counts one piece
# (16 MiB) for rank 0's read-back; on a loaded machine rank 0 once peaked 55 MB above rank 1
# (allocator timing: the writer thread's arena and the main thread's pieces live at once), so the
# bound is half the snapshot, still far below the whole snapshot an unsharded rank 0 holds.
if "ASAN_OPTIONS" not in os.environ:
    assert grow_sharded < 0.5 * snapshot, f"sharded rank 0 grew by {grow_sharded} bytes: a snapshot of the state?"
# A machine between the two: the unsharded run does not fit, the sharded one does.
u, s = json.load(open("plan2u.json"))["memory"]["node_bytes"], plans[2]["node_bytes"]
assert s < u, (s, u)
open("machine", "w").write(str((s + u) // 2))
g = json.load(open("plan2g.json"))["memory"]["node_bytes"]
assert g < s, (g, s)
open("machine_gelu", "w").write(str((g + s) // 2))
PY

# Optimizer state 1/P is smaller, but the snapshot rank 0 keeps may make up for it at P = 2; the
# test needs a machine size between the two totals.
MACHINE=$(cat machine)
rc=0
KILTER_TEST_NODE_MEMORY_BYTES=$MACHINE timeout 300 "${MPIRUN[@]}" -np 2 -x KILTER_TEST_NODE_MEMORY_BYTES \
  "$KILTER" train "${COMMON[@]}" --output.dir=runs/refused --train.shard_optimizer=false > refused.log 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat refused.log; fail "an unsharded run that cannot fit was not refused"; }
grep -q "GiB per node" refused.log && grep -q "the cheapest setting that fits: set train.shard = optimizer" refused.log \
  || { cat refused.log; fail "the refusal does not name the figure and the setting"; }
! grep -q "backend cpu" refused.log || { cat refused.log; fail "the refused run started training"; }
KILTER_TEST_NODE_MEMORY_BYTES=$MACHINE timeout 300 "${MPIRUN[@]}" -np 2 -x KILTER_TEST_NODE_MEMORY_BYTES \
  "$KILTER" train "${COMMON[@]}" --output.dir=runs/fits > fits.log 2>&1 || { cat fits.log; fail "the sharded run was refused"; }

# A machine that holds the sharded run only with recomputation: the advice is the cheapest mode.
rc=0
KILTER_TEST_NODE_MEMORY_BYTES=$(cat machine_gelu) timeout 300 "${MPIRUN[@]}" -np 2 -x KILTER_TEST_NODE_MEMORY_BYTES \
  "$KILTER" train "${COMMON[@]}" --output.dir=runs/refused_gelu > refused_gelu.log 2>&1 || rc=$?
[ $rc -ne 0 ] && grep -q "the cheapest setting that fits: set train.recompute = gelu" refused_gelu.log \
  || { cat refused_gelu.log; fail "a sharded run that fits only with recompute=gelu did not get that advice"; }

# 64 layers x 4096: ~13 billion parameters, hundreds of GiB per rank: refused before allocating.
rc=0
timeout 300 "${MPIRUN[@]}" -np 2 bash -c 'exec /usr/bin/time -o "$0.rss.$OMPI_COMM_WORLD_RANK" -f %M "$@"' \
  huge "$KILTER" train --data.dir=data --model.n_layer=64 --model.n_embd=4096 --model.n_head=32 --model.block_size=256 \
  --data.max_tokens=1024 --train.tokens_per_step=4096 --train.steps=2 --output.dir=runs/huge \
  > huge.log 2>&1 || rc=$?
[ $rc -ne 0 ] && grep -q "GiB per node" huge.log || { cat huge.log; fail "a 13B model was not refused by the memory plan"; }
# Allocating ~13B parameters would have ended in bad_alloc or the OOM killer, not this message;
# where time(1) could write its figure before MPI_Abort ended the job, it says so too.
! grep -q "backend cpu" huge.log || { cat huge.log; fail "the refused run started training"; }
for r in 0 1; do
  kib=$(tail -1 "huge.rss.$r" 2>/dev/null | grep -E '^[0-9]+$' || true)
  [ -z "$kib" ] || [ "$kib" -lt 1048576 ] || fail "rank $r of the refused run peaked at $kib KiB: it allocated the model"
done

# The cuda backend (no GPU needed: the plan comes from the config): the device figures (CudaModel's
# buffers, lib/backend/cuda_memory.h) against --device-memory, and a run whose device cannot hold
# it refused before the model is made (KILTER_TEST_DEVICE_MEMORY_BYTES stands a small device in).
for shard in true false; do
  "$KILTER" plan --data data --world-size 2 "${MODEL[@]}" --memory --json --train.backend=cuda \
    --train.shard_optimizer=$shard --device-memory 0.5 > plan_cuda_$shard.json
done
"$KILTER" plan --data data --world-size 2 "${MODEL[@]}" --memory --train.backend=cuda --device-memory 0.5 > plan_cuda.txt
grep -q "on each rank's device:" plan_cuda.txt && grep -q "device total .* GiB per rank of 0.500 GiB free on its device: fits" plan_cuda.txt \
  || { cat plan_cuda.txt; fail "kilter plan --memory on the cuda backend does not print the device figures"; }
"$PY" - <<'PY'
import json
s = json.load(open("plan_cuda_true.json"))["memory"]
u = json.load(open("plan_cuda_false.json"))["memory"]
for m in (s, u):
    assert m["backend"] == "cuda" and m["device_bytes"] == 2**29, m
    parts = sum(m[k] for k in ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "engine_bytes", "cudnn_bytes"))
    assert m["device_total_bytes"] == parts and m["device_fits"] and m["fits"], m
    # The device holds the model's buffers, so the host total is the checkpoint, ring and runtime.
    assert m["other_rank_bytes"] < m["device_total_bytes"], m
# fp32 parameters only (no bf16 copy on the device), and the moments 1/P when sharded.
assert s["parameters_bytes"] == s["gradients_bytes"] and abs(u["optimizer_bytes"] / s["optimizer_bytes"] - 2) < 0.01, (s, u)
open("device", "w").write(str((s["device_total_bytes"] + u["device_total_bytes"]) // 2))
PY
rc=0
KILTER_TEST_DEVICE_MEMORY_BYTES=$(cat device) timeout 300 "${MPIRUN[@]}" -np 2 -x KILTER_TEST_DEVICE_MEMORY_BYTES \
  "$KILTER" train "${COMMON[@]}" --output.dir=runs/refused_cuda --train.backend=cuda --train.shard_optimizer=false \
  > refused_cuda.log 2>&1 || rc=$?
[ $rc -ne 0 ] && grep -q "GiB of device memory per rank" refused_cuda.log \
  && grep -q "the cheapest setting that fits: set train.shard = optimizer" refused_cuda.log \
  || { cat refused_cuda.log; fail "a cuda run whose device cannot hold it was not refused with the figure and the setting"; }
echo "memory_plan: 1 passed, 0 failed"
