#!/usr/bin/env bash
# Sharded training (train.shard = none | optimizer | parameters), in four sections:
# - memory: the memory plan (`kilter plan --memory`, no training) of Llama-3-8B at a context of 8192
#   on 8 x 80 GB under `optimizer` with bf16 gradients and under `parameters`, Llama-3-70B on
#   64 x 80 GB under `parameters` with recompute = block, the 8B at 32768 under `parameters`, and
#   GPT-2 124M (4 CPU ranks) and 350M (medium, 2) under each mode; each beside torchtitan's published
#   peak where one exists (docs/model.md, "The memory plan", by sharding mode, says which figures
#   compare and which do not). Checks that Llama-3-8B and -70B at 8192 under `parameters` fit 80 GB
#   (the 70B since the units gather the bf16 working copy alone), and the 8B
#   under `optimizer` (the distributed optimizer: the fp32 master sharded with the moments under
#   bf16 storage, on the cuda backend and the cpu backend's GPT-2 124M bf16-storage row).
#   The Llama rows are the cuda backend's as this kilter prices it: run it with a CUDA build with
#   cuDNN SDPA (kilter --version lists sdpa); without SDPA attention is priced in the padded
#   groups and the Llama-3-70B check is skipped, saying so.
# - speed: `none` against `parameters` on NP (2) CPU ranks, alternating REPEATS times: tokens/s of
#   each (median) and their ratio (target >= 0.85; `parameters` prefetches the next unit's gather
#   and overlaps each reduce-scatter with the backward below); the losses must agree step by step
#   (within 1e-6 relative). With HSDP=1 (root; scripts/vcluster), the same on 2 nodes x 2 ranks with a
#   LINK_GBIT (1) Gbit/s link: flat `parameters` (shard_group = world) against HSDP (shard_group =
#   node), their tokens/s against `none` and the cross-node bytes per step (the nodes' eth0
#   counters over the run, per step; target: HSDP's <= flat's / ranks per node).
# - balance: bench/balance_effect.sh's skewed corpus (lognormal:4.8,1.1,1024, 2 ranks, context 512,
#   4 micro-batches per rank): sync_wait of `parameters` (gather and reduce-scatter waits
#   included: the metrics' *gather_wait* and *scatter_wait* columns, as shares of the step) against
#   the equal-work floor (documents of exactly one context); target <= 1.5x the floor.
# - rss (not in the default SECTIONS: minutes, ~9 GiB): the plan against each rank's measured peak
#   RSS, GPT-2 124M fp32 on 4 ranks and 350M on 2, one 1024-token micro-batch, recompute = block,
#   under each mode (targets: parameters <= 0.45 and optimizer <= 0.75 of none's; the plan within 10%).
# speed, balance and rss train with data.cut_pieces = false (whole documents: the K/V a later part
# receives is not in the memory plan); a mode this kilter refuses is reported SKIPPED, and the script exits 3 at the end.
#
# usage: bench/shard.sh [path/to/kilter]    (default build/kilter)
# env:   SECTIONS ("memory speed balance"), NP (2), REPEATS (3), STEPS (30), HSDP (unset; 1: the
#        vcluster rows, as root; SECTIONS=none HSDP=1 runs them alone), LINK_GBIT (1),
#        HSDP_TOKENS (tokens_per_step of those rows; inputs/small.ini's by default), BAL_STEPS (60), PY (/usr/bin/python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kilter=$(readlink -f "${1:-$root/build/kilter}")
[[ -x $kilter ]] || { echo "bench/shard.sh: no kilter binary at $kilter (pass its path)" >&2; exit 2; }
SECTIONS=${SECTIONS:-"memory speed balance"}
NP=${NP:-2}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-30}
BAL_STEPS=${BAL_STEPS:-60}
LINK_GBIT=${LINK_GBIT:-1}
PY=${PY:-/usr/bin/python3}
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
work=$(mktemp -d /tmp/kilter-bench-shard.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OPENBLAS_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
echo "# bench/shard.sh: $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
skipped=0

LLAMA8="--model.arch=llama --model.n_layer=32 --model.n_embd=4096 --model.n_head=32 --model.n_kv_head=8
  --model.ffn_hidden=14336 --model.vocab_size=128256"
LLAMA70="--model.arch=llama --model.n_layer=80 --model.n_embd=8192 --model.n_head=64 --model.n_kv_head=8
  --model.ffn_hidden=28672 --model.vocab_size=128256"
GPT2_124M="--model.n_layer=12 --model.n_embd=768 --model.n_head=12 --model.vocab_size=50257"
GPT2_350M="--model.n_layer=24 --model.n_embd=1024 --model.n_head=16 --model.vocab_size=50257"

# memory_row NAME P PER_NODE DEVICE_GIB(0: cpu) CONTEXT MAX_TOKENS ARGS...: the plan's JSON into NAME.json
memory_row() {
  local name=$1 p=$2 per_node=$3 device=$4 context=$5 max_tokens=$6
  shift 6
  local backend=(--train.backend=cpu)
  [[ $device != 0 ]] && backend=(--train.backend=cuda --device-memory "$device")
  # shellcheck disable=SC2086
  "$kilter" plan --lengths lognormal:6,1.5,$context --docs 2000 --world-size "$p" --ranks-per-node "$per_node" \
    --memory --json "${backend[@]}" --model.block_size="$context" --data.max_tokens="$max_tokens" \
    --train.tokens_per_step=$((p * max_tokens)) "$@" > "$name.json" 2> "$name.err" \
    || { cat "$name.err"; echo "bench/shard.sh: the memory plan of $name failed" >&2; exit 1; }
}

if [[ " $SECTIONS " == *" memory "* ]]; then
  bf16_gpu=(--train.precision=bf16)
  # shellcheck disable=SC2086
  {
    memory_row l8_none 8 8 80 8192 8192 $LLAMA8 "${bf16_gpu[@]}" --train.recompute=block --train.shard=none
    memory_row l8_opt 8 8 80 8192 8192 $LLAMA8 "${bf16_gpu[@]}" --train.recompute=block --train.shard=optimizer --train.grad_dtype=bf16
    memory_row l8_par 8 8 80 8192 8192 $LLAMA8 "${bf16_gpu[@]}" --train.recompute=block --train.shard=parameters
    memory_row l8_par_keep 8 8 80 8192 8192 $LLAMA8 "${bf16_gpu[@]}" --train.recompute=block --train.shard=parameters \
      --train.reshard_after_forward=false
    memory_row l8_par2x 8 8 80 8192 16384 $LLAMA8 "${bf16_gpu[@]}" --train.recompute=block --train.shard=parameters
    memory_row l8_par32k 8 8 80 32768 32768 $LLAMA8 "${bf16_gpu[@]}" --train.recompute=block --train.shard=parameters
    memory_row l70_par 64 8 80 8192 8192 $LLAMA70 "${bf16_gpu[@]}" --train.recompute=block --train.shard=parameters
    memory_row l70_hsdp 64 8 80 8192 8192 $LLAMA70 "${bf16_gpu[@]}" --train.recompute=block --train.shard=parameters \
      --train.shard_group=node
    for m in none optimizer parameters; do
      memory_row g124_$m 4 4 0 1024 1024 $GPT2_124M --train.precision=fp32 --train.recompute=block --train.shard=$m
      memory_row g350_$m 2 2 0 1024 1024 $GPT2_350M --train.precision=fp32 --train.recompute=block --train.shard=$m
    done
    # The distributed optimizer (the fp32 master 1/G beside the whole bf16 working copy).
    memory_row g124_optimizer_bf16 4 4 0 1024 1024 $GPT2_124M --train.precision=bf16 --train.bf16_storage=on \
      --train.recompute=block --train.shard=optimizer
  }
  # The cuda rows price attention as this kilter would run it: cuDNN SDPA's per-row statistics
  # where it was built with SDPA, else the padded groups' saved scores (quadratic in the context).
  SDPA=0
  "$kilter" --version | grep -q '^backends:.* sdpa' && SDPA=1
  SDPA=$SDPA "$PY" - <<'PY'
import json, os
GiB = 2**30
sdpa = os.environ["SDPA"] == "1"
# torchtitan's published peaks (benchmarks/llama3_h100_202412_torchtitan.md, pytorch/torchtitan,
# Dec 2024: H100 of 96 GB HBM2e, FSDP2, bf16 mixed precision; "Memory(GiB)" per GPU).
titan = {
    "l8_par2x": "82.4 (Table 1: FSDP, 8 GPUs, local batch 2 x 8192, selective AC)",
    "l8_par32k": "83.9 (Table 2: FSDP 8, CP 1, 32768, local batch 1, full AC, compile+Float8)",
}
rows = [
    ("l8_none", "Llama-3-8B ctx 8192, 8x80GB, none"),
    ("l8_opt", "Llama-3-8B ctx 8192, 8x80GB, optimizer bf16 grads"),
    ("l8_par", "Llama-3-8B ctx 8192, 8x80GB, parameters"),
    ("l8_par_keep", "  same, reshard_after_forward=false"),
    ("l8_par2x", "  same, 2 x 8192 tokens per micro-batch"),
    ("l8_par32k", "Llama-3-8B ctx 32768, 8x80GB, parameters"),
    ("l70_par", "Llama-3-70B ctx 8192, 64x80GB, parameters"),
    ("l70_hsdp", "Llama-3-70B ctx 8192, 64x80GB, HSDP (node)"),
]
for m in ("none", "optimizer", "parameters"):
    rows.append((f"g124_{m}", f"GPT-2 124M fp32 ctx 1024, 4 CPU ranks, {m}"))
rows.append(("g124_optimizer_bf16", "GPT-2 124M bf16 storage, 4 CPU ranks, optimizer"))
for m in ("none", "optimizer", "parameters"):
    rows.append((f"g350_{m}", f"GPT-2 350M fp32 ctx 1024, 2 CPU ranks, {m}"))
print("## memory plan per rank (GiB; recompute = block; device figures on cuda, host on cpu)")
print(f"{'model, setting':<48} {'params':>7} {'gather':>7} {'grads':>7} {'optim':>7} {'activ':>7} {'total':>7} {'fits':>5}  torchtitan (GiB)")
plans = {}
for key, label in rows:
    m = json.load(open(f"{key}.json"))["memory"]
    plans[key] = m
    cuda = m["backend"] == "cuda"
    total = m["device_total_bytes"] if cuda else m["other_rank_bytes"]
    fits = m["device_fits"] if cuda else m["fits"]
    print(f"{label:<48} {m['parameters_bytes']/GiB:7.2f} {m['gathered_bytes']/GiB:7.2f} {m['gradients_bytes']/GiB:7.2f} "
          f"{m['optimizer_bytes']/GiB:7.2f} {m['activations_bytes']/GiB:7.2f} {total/GiB:7.2f} {str(fits):>5}  "
          f"{titan.get(key, '-')}")
# parameters on cuda: the plan prices what the NCCL shards back (their pages: the chunks, at most
# the units the schedule holds, the staging) and, under bf16 storage, the distributed optimizer's
# state beside them (the fp32 master of the chunks, the copy's chunk pages, the norms' fp32 pages,
# the head's padded copy): the units gather the bf16 working copy alone. Both must fit.
for key in ("l8_par", "l70_par", "l70_hsdp"):
    m = plans[key]
    print(f"{key}: {m['device_total_bytes'] / GiB:.2f} GiB per device ({'fits' if m['device_fits'] else 'does NOT fit'})")
assert plans["l8_par"]["device_fits"], "l8_par: the sharded state does not fit 80 GB"
if sdpa:
    assert plans["l70_par"]["device_fits"], "l70_par: Llama-3-70B under parameters does not fit 80 GB"
else:
    print("this kilter was built without cuDNN SDPA (kilter --version): its cuda rows price attention in the "
          "padded groups, whose saved scores grow as the square of the context; the Llama-3-70B check needs a "
          "CUDA build with SDPA")
assert not plans["l8_none"]["device_fits"], "l8_none should not fit 80 GB"
# optimizer: Megatron's distributed optimizer on both backends under bf16 storage (the fp32 master
# sharded with the moments, the bf16 working copy whole and gathered): the plan's params are 2
# bytes a parameter whole + 4 over G; the gradients stay 4 bytes (bf16 values in the fp32 buffer).
m = plans["l8_opt"]
G = m["shard_group"]
print(f"Llama-3-8B optimizer, bf16 grads: the fp32 master 1/{G} priced (params {m['parameters_bytes'] / GiB:.2f} GiB, "
      f"2 bytes whole + 4 over {G}), total {m['device_total_bytes'] / GiB:.2f} GiB")
assert m["device_fits"], "l8_opt: the distributed optimizer's plan does not fit 80 GB"
print("Llama-3-70B: torchtitan publishes no FSDP-only (1D) memory for 70B (64 A100: tokens/s and MFU only;"
      " its 70B memory rows are 2D FSDP+TP): no comparable figure.")
PY
fi

# A parameters run this kilter refuses: say so once, then skip the training sections.
shard_trains() {
  "$kilter" prep synth --docs 200 --lengths uniform:64,64 --vocab 64 --shards 2 --seed 1 --out probe >/dev/null 2>&1
  if ! "${mpirun[@]}" -np 2 "$kilter" train --data.dir=probe --model.n_layer=1 --model.n_head=2 --model.n_embd=32 \
      --model.block_size=64 --data.max_tokens=128 --train.tokens_per_step=256 --train.steps=1 --train.shard=parameters \
      --data.cut_pieces=false \
      --output.dir=runs/probe --output.trace_steps=0 > probe.log 2>&1; then
    echo "SKIPPED: this kilter does not train train.shard = parameters: $(grep -m1 -o 'config key train.shard[^;]*' probe.log || tail -1 probe.log)"
    return 1
  fi
}
can_train=1
if [[ " $SECTIONS " == *" speed "* || " $SECTIONS " == *" balance "* || ${HSDP:-} == 1 ]]; then shard_trains || can_train=0; fi

if [[ " $SECTIONS " == *" speed "* && $can_train == 1 ]]; then
  "$kilter" prep synth --docs 4000 --lengths lognormal:4.5,1.0,1024 --vocab 8192 --shards 2 --seed 1 --out data >/dev/null 2>&1
  run() {  # run NAME MODE [more options]
    local name=$1 mode=$2
    shift 2
    "${mpirun[@]}" -np "$NP" "$kilter" train --config "$root/inputs/small.ini" --data.dir=data --train.steps="$STEPS" \
      --output.dir="runs/$name" --output.trace_steps=0 --output.log_every=1000 --train.shard="$mode" \
      --data.cut_pieces=false "$@" \
      > "$name.log" 2>&1 || { cat "$name.log"; echo "bench/shard.sh: run $name failed" >&2; exit 1; }
  }
  for i in $(seq 1 "$REPEATS"); do
    run "none$i" none
    run "par$i" parameters
  done
  "$PY" - "$REPEATS" "$NP" <<'PY'
import csv, json, statistics, sys
n, np_ = int(sys.argv[1]), int(sys.argv[2])
def rate(run): return json.load(open(f"runs/{run}/summary.json"))["tokens_per_second"]
def losses(run): return [float(r["loss"]) for r in csv.DictReader(open(f"runs/{run}/metrics/rank-00000.csv"))]
for i in range(1, n + 1):
    a, b = losses(f"none{i}"), losses(f"par{i}")
    assert len(a) == len(b) and a, f"repeat {i}: {len(a)} and {len(b)} steps"
    worst = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))
    assert worst <= 1e-6, f"repeat {i}: parameters' losses differ from none's by {worst:.3g} relative"
    print(f"repeat {i}: losses agree (largest relative difference {worst:.2g}{', bit for bit' if a == b else ''})")
u = [rate(f"none{i}") for i in range(1, n + 1)]
s = [rate(f"par{i}") for i in range(1, n + 1)]
print(f"## speed, {np_} CPU ranks, inputs/small.ini")
print("none       tok/s:", " ".join(f"{x:.0f}" for x in u))
print("parameters tok/s:", " ".join(f"{x:.0f}" for x in s))
print(f"median: none {statistics.median(u):.0f}, parameters {statistics.median(s):.0f}, "
      f"parameters/none {statistics.median(s) / statistics.median(u):.3f} (target >= 0.85)")
PY
fi
[[ " $SECTIONS " == *" speed "* && $can_train == 0 ]] && skipped=1

# HSDP=1: 2 nodes x 2 ranks on a shaped link (its own section: runs with or without `speed`).
if [[ ${HSDP:-} == 1 && $can_train == 1 ]]; then
  vcluster=$root/scripts/vcluster
  [[ $(id -u) -eq 0 ]] || { echo "bench/shard.sh: HSDP=1 needs root (scripts/vcluster)" >&2; exit 2; }
  [[ -d data ]] || "$kilter" prep synth --docs 4000 --lengths lognormal:4.5,1.0,1024 --vocab 8192 --shards 2 --seed 1 \
    --out data >/dev/null 2>&1
  trap '"$vcluster" down >/dev/null 2>&1; rm -rf "$work"' EXIT
  "$vcluster" up --nodes 2 --link-gbit "$LINK_GBIT" --slots 2 > vcluster.log 2>&1 \
    || { cat vcluster.log; echo "bench/shard.sh: scripts/vcluster up failed" >&2; exit 1; }
  # /proc/net/dev is the reader's network namespace (sysfs would be the root namespace's): eth0's bytes sent.
  # shellcheck disable=SC2016
  link_bytes() { "$vcluster" exec node1 awk 'sub(/^ *eth0:/, "") { print $9 }' /proc/net/dev; }
  hrun() {  # hrun NAME MODE GROUP
    local before after
    before=$(link_bytes)
    "$vcluster" mpirun -np 4 "$kilter" train --config "$root/inputs/small.ini" --data.dir="$work/data" \
      --train.steps="$STEPS" --output.dir="$work/runs/$1" --output.trace_steps=0 --output.log_every=1000 \
      --train.shard="$2" --train.shard_group="$3" --data.cut_pieces=false ${HSDP_TOKENS:+--train.tokens_per_step=$HSDP_TOKENS} \
      > "$1.log" 2>&1 || { cat "$1.log"; exit 1; }
    after=$(link_bytes)
    echo $(( (after - before) / STEPS )) > "$1.bytes"
  }
  hrun hnone none world
  hrun hflat parameters world
  hrun hsdp parameters node
  LINK_GBIT=$LINK_GBIT STEPS=$STEPS "$PY" - <<'PY'
import csv, json, os
def rate(r): return json.load(open(f"runs/{r}/summary.json"))["tokens_per_second"]
def losses(r): return [float(x["loss"]) for x in csv.DictReader(open(f"runs/{r}/metrics/rank-00000.csv"))]
base = losses("hnone")
for r in ("hflat", "hsdp"):
    worst = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(base, losses(r)))
    assert worst <= 1e-6, f"{r}: losses differ from none's by {worst:.3g} relative"
b = {r: int(open(f"{r}.bytes").read()) for r in ("hnone", "hflat", "hsdp")}
assert b["hflat"] > 0, "node1's eth0 counted no bytes sent during the flat run: the counter is not the node's"
print(f"## 2 nodes x 2 ranks, {os.environ['LINK_GBIT']} Gbit/s link, {os.environ['STEPS']} steps: tokens/s and node1's "
      "cross-node bytes sent per step (the start's broadcast included)")
for r in ("hnone", "hflat", "hsdp"):
    print(f"{r:6s} {rate(r):9.0f} tok/s ({rate(r) / rate('hnone'):.3f}x none)  {b[r] / 2**20:9.2f} MiB/step")
print(f"HSDP / none tokens/s: {rate('hsdp') / rate('hnone'):.3f} (target >= 0.85); "
      f"HSDP / flat tokens/s: {rate('hsdp') / rate('hflat'):.3f}")
print(f"HSDP / flat cross-node bytes: {b['hsdp'] / b['hflat']:.3f} (target <= 1/2: 2 ranks per node)")
PY
fi

if [[ " $SECTIONS " == *" balance "* && $can_train == 1 ]]; then
  context=512
  "$kilter" prep synth --docs 3000 --lengths lognormal:4.8,1.1,1024 --vocab 256 --shards 2 --seed 11 --out skewed >/dev/null 2>&1
  "$kilter" prep synth --docs 3000 --lengths uniform:$context,$context --vocab 256 --shards 2 --seed 11 --out floordata >/dev/null 2>&1
  for kind in parameters floor; do
    dir=skewed
    [[ $kind == floor ]] && dir=floordata
    "${mpirun[@]}" -np 2 "$kilter" train --data.dir=$dir --model.n_layer=4 --model.n_head=2 --model.n_embd=128 \
      --model.block_size=$context --data.max_tokens=$((4 * context)) --train.tokens_per_step=$((2 * 4 * 4 * context)) \
      --train.steps="$BAL_STEPS" --train.warmup=5 --train.shard=parameters --data.cut_pieces=false --output.log_every=1000 \
      --output.trace_steps=0 --output.dir="runs/bal-$kind" > "bal-$kind.log" 2>&1 \
      || { cat "bal-$kind.log"; echo "bench/shard.sh: balance run $kind failed" >&2; exit 1; }
  done
  "$PY" - <<'PY'
import csv, glob, json, math
def waits(run):
    v = json.load(open(f"runs/{run}/summary.json"))
    assert math.isfinite(v["final_loss"]), f"{run}: final loss {v['final_loss']}"
    rows = [r for f in sorted(glob.glob(f"runs/{run}/metrics/rank-*.csv")) for r in csv.DictReader(open(f))][2:]
    cols = [c for c in rows[0] if "gather_wait" in c or "scatter_wait" in c] if rows else []
    total = sum(float(r["step_total"]) for r in rows)
    meet = sum(float(r[c]) for r in rows for c in cols) / total if total > 0 else 0.0
    return v["sync_wait_fraction"], meet, cols, v
sp, mp, cols, v = waits("bal-parameters")
sf, mf, _, _ = waits("bal-floor")
print("## balance, lognormal:4.8,1.1,1024, 2 ranks, parameters (slot imbalance p95 of the plan "
      f"{v.get('slot_imbalance_p95', float('nan')):.4f})")
print(f"wait columns counted: {', '.join(cols) or 'none in the metrics'}")
print(f"parameters: sync_wait {sp:.4f} + gather/reduce-scatter waits {mp:.4f} = {sp + mp:.4f}")
print(f"floor:      sync_wait {sf:.4f} + gather/reduce-scatter waits {mf:.4f} = {sf + mf:.4f}")
print(f"ratio {(sp + mp) / max(sf + mf, 1e-9):.2f} (target <= 1.5)")
PY
fi
[[ " $SECTIONS " == *" balance "* && $can_train == 0 ]] && skipped=1

# rss: the plan against the measured peak RSS of every rank (getrusage at exit, through time(1)):
# GPT-2 124M fp32, 4 ranks, one 1024-token micro-batch per rank and step, recompute = block, for
# each mode this kilter trains, on documents of exactly one context (no cut piece: the K/V a later
# part receives is not in the plan) (targets: parameters <= 0.45 and optimizer <= 0.75 of none's peak;
# the plan within 10% of each rank's), then GPT-2 350M on 2 ranks the same way.
if [[ " $SECTIONS " == *" rss "* ]]; then
  "$kilter" prep synth --docs 64 --lengths uniform:1024,1024 --vocab 50257 --shards 2 --seed 5 --out gdata >/dev/null 2>&1
  for model in 124M 350M; do
    if [[ $model == 124M ]]; then np=4 shape=$GPT2_124M; else np=2 shape=$GPT2_350M; fi
    for mode in none optimizer parameters; do
      name=rss-$model-$mode
      # shellcheck disable=SC2086
      args=(--data.dir=gdata $shape --model.block_size=1024 --data.max_tokens=1024 --train.precision=fp32
            --train.recompute=block --train.tokens_per_step=$((np * 1024)) --train.shard=$mode --data.cut_pieces=false)
      "$kilter" plan --data gdata --world-size "$np" --memory --json --train.backend=cpu "${args[@]:1}" > "$name.plan.json" 2>/dev/null
      if ! timeout 1200 "${mpirun[@]}" -np "$np" bash -c 'exec /usr/bin/time -o "$0.rss.$OMPI_COMM_WORLD_RANK" -f %M "$@"'           "$name" "$kilter" train "${args[@]}" --train.steps=2 --output.log_every=1 --output.trace_steps=0           --output.dir="runs/$name" > "$name.log" 2>&1; then
        if grep -q "not built yet" "$name.log"; then echo "SKIPPED $name: $(grep -m1 -o 'config key [^;]*' "$name.log")"; skipped=1; continue; fi
        cat "$name.log"; echo "bench/shard.sh: $name failed" >&2; exit 1
      fi
    done
  done
  "$PY" - <<'PY'
import glob, json, os
print("## peak RSS per rank against the plan (GPT-2 fp32, recompute = block, 1024-token micro-batches)")
print(f"{'run':<24} {'rank':>4} {'plan MiB':>9} {'peak MiB':>9} {'plan/peak':>9} {'peak/none':>9}")
for model, np_ in (("124M", 4), ("350M", 2)):
    peaks = {}
    for mode in ("none", "optimizer", "parameters"):
        name = f"rss-{model}-{mode}"
        files = sorted(glob.glob(f"{name}.rss.*"))
        if len(files) != np_:
            continue
        plan = json.load(open(f"{name}.plan.json"))["memory"]
        peaks[mode] = [int(open(f).read().split()[-1]) * 1024 for f in files]
        for r, peak in enumerate(peaks[mode]):
            est = plan["rank0_bytes"] if r == 0 else plan["other_rank_bytes"]
            rel = peak / peaks["none"][r] if "none" in peaks else float("nan")
            print(f"{name:<24} {r:>4} {est / 2**20:9.1f} {peak / 2**20:9.1f} {est / peak:9.3f} {rel:9.3f}")
            assert 0.9 <= est / peak <= 1.1, f"{name} rank {r}: the plan is {est / peak:.3f} of the peak"
            if model == "124M" and mode == "parameters":
                assert rel <= 0.45, f"{name} rank {r}: {rel:.3f} of none's peak, above the 0.45 bar"
PY
fi
# The machine's load at the end too: on a shared machine the figures above are only as good as it.
echo "# bench/shard.sh: done $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
[[ $skipped == 0 ]] || exit 3
