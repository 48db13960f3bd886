#!/usr/bin/env bash
# Activation recomputation's saving and cost (train.recompute, issue 24), side by side on this
# machine, GPT-2 124M shape (12 x 768, 12 heads, vocab 50304, context 1024), bf16, NP ranks, one
# micro-batch of up to 1024 tokens per rank and step:
# - peak RSS of each rank (/usr/bin/time -f %M: getrusage at exit, the final checkpoint included)
#   and tokens/s of: today's default before issue 24 (unsharded, recompute = none), sharded with
#   recompute = block (targets: RSS <= 0.55, tokens/s >= 0.75 of the former), and unsharded with
#   recompute = gelu (target: tokens/s >= 0.95 of none), run in turn REPEATS times;
# - tokens/s is the median over the steps after the first (metrics/train.csv), over repeats;
# - the memory plan's activations and totals for the same runs, next to the measured RSS;
# - the runs compute the same losses (recompute is bit-identical; sharding is on this MPI).
#
# usage: bench/recompute.sh [BUILD_DIR]     (default: build; needs target kilter)
# env:   NP=2 REPEATS=1 STEPS=3 EXTRA="" (more kilter train options)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
kilter=$(readlink -f "$build/kilter")
np=${NP:-2}
repeats=${REPEATS:-1}
steps=${STEPS:-3}
read -r -a extra <<< "${EXTRA:-}"
python=${PYTHON:-/usr/bin/python3}
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
work=$(mktemp -d /tmp/kilter-bench-recompute.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "# recompute: $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$kilter" prep synth --docs 400 --lengths lognormal:6.5,0.5,1024 --vocab 50304 --shards 2 --seed 1 --out data >/dev/null 2>&1
MODEL=(--model.n_layer=12 --model.n_head=12 --model.n_embd=768 --model.block_size=1024 --data.max_tokens=1024
       --train.precision=bf16)
SETTINGS=("none --train.shard_optimizer=false --train.recompute=none"
          "block --train.shard_optimizer=true --train.recompute=block"
          "gelu --train.shard_optimizer=false --train.recompute=gelu")
for s in "${SETTINGS[@]}"; do
  read -r name args <<< "$s"
  read -r -a args <<< "$args"
  "$kilter" plan --data data --world-size "$np" "${MODEL[@]}" "${args[@]}" --memory --json 2>/dev/null > "plan-$name.json"
done
run() {  # run NAME [args]
  local name=$1; shift
  "${mpirun[@]}" -np "$np" bash -c 'exec /usr/bin/time -o "$0.rss.$OMPI_COMM_WORLD_RANK" -f %M "$@"' "$name" \
    "$kilter" train --data.dir=data "${MODEL[@]}" --train.tokens_per_step=$((np * 1024)) --train.steps="$steps" \
    --output.dir="runs/$name" --output.trace_steps=0 --output.log_every=1 "$@" "${extra[@]}" > "$name.log" 2>&1 \
    || { cat "$name.log"; exit 1; }
}
for i in $(seq 1 "$repeats"); do
  for s in "${SETTINGS[@]}"; do
    read -r name args <<< "$s"
    read -r -a args <<< "$args"
    run "$name$i" "${args[@]}"
  done
done
"$python" - "$repeats" "$np" <<'PY'
import csv, json, statistics, sys
n, np_ = int(sys.argv[1]), int(sys.argv[2])
names = ["none", "block", "gelu"]
def rates(run):
    rows = list(csv.DictReader(open(f"runs/{run}/metrics/train.csv")))[1:]
    return [float(r["tokens_per_second"]) for r in rows]
def losses(run): return [r["loss"] for r in csv.DictReader(open(f"runs/{run}/metrics/rank-00000.csv"))]
def rss(run, rank): return int(open(f"{run}.rss.{rank}").read().split()[-1]) * 1024
plan = {k: json.load(open(f"plan-{k}.json"))["memory"] for k in names}
rate = {k: statistics.median(x for i in range(1, n + 1) for x in rates(f"{k}{i}")) for k in names}
peak = {k: {r: statistics.median(rss(f"{k}{i}", r) for i in range(1, n + 1)) for r in range(np_)} for k in names}
for i in range(1, n + 1):
    for k in names[1:]:
        print(f"repeat {i}: {k} losses {'==' if losses(f'{k}{i}') == losses(f'none{i}') else '!='} none's")
for k in names:
    p = plan[k]
    print(f"{k:5s}: tok/s {rate[k]:7.1f} (per step: {' '.join(f'{x:.0f}' for i in range(1, n + 1) for x in rates(f'{k}{i}'))}); "
          f"plan activations {p['activations_bytes'] / 2**30:.3f} GiB, total rank 0 {p['rank0_bytes'] / 2**30:.3f} / "
          f"others {p['other_rank_bytes'] / 2**30:.3f} GiB; peak RSS " +
          ", ".join(f"rank {r} {peak[k][r] / 2**30:.3f} GiB" for r in range(np_)))
# The compute phases per step (median over steps after the first, all ranks and repeats): what
# recompute changes, less exposed to the other ranks' and jobs' timing than tokens/s.
def phase(k, key):
    return statistics.median(float(r[key]) for i in range(1, n + 1) for rank in range(np_)
                             for r in list(csv.DictReader(open(f"runs/{k}{i}/metrics/rank-{rank:05d}.csv")))[1:])
for k in names:
    f, b = phase(k, "forward"), phase(k, "backward")
    print(f"{k:5s}: median forward {f:.3f} s, backward {b:.3f} s, forward + backward {f + b:.3f} s per step")
for r in range(np_):
    print(f"rank {r}: peak RSS block+sharded / none unsharded {peak['block'][r] / peak['none'][r]:.3f} (target <= 0.55)")
print(f"tokens/s block+sharded / none unsharded {rate['block'] / rate['none']:.3f} (target >= 0.75)")
print(f"tokens/s gelu / none {rate['gelu'] / rate['none']:.3f} (target >= 0.95)")
fb = {k: phase(k, "forward") + phase(k, "backward") for k in names}
print(f"forward + backward time none / block {fb['none'] / fb['block']:.3f}, none / gelu {fb['none'] / fb['gelu']:.3f}")
PY
