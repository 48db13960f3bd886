#!/usr/bin/env bash
# The sharded optimizer's cost and saving (issue 24), side by side on this machine:
# - optimizer-state bytes per rank at P = 1, 2, 4 from the memory plan (kilter plan --memory),
#   checked to fall as 1/P;
# - tokens/s of inputs/small.ini on NP ranks, sharded and unsharded run alternately REPEATS
#   times (each run's summary tokens_per_second, the loop only), with the median of each and their
#   ratio (target >= 0.98), and a check that both runs computed the same losses.
#
# usage: bench/shard_optimizer.sh [BUILD_DIR]     (default: build; needs target kilter)
# env:   NP=2 REPEATS=5 STEPS=30 EXTRA="" (more kilter train options, e.g. --train.precision=bf16)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
kilter=$(readlink -f "$build/kilter")
np=${NP:-2}
repeats=${REPEATS:-5}
steps=${STEPS:-30}
read -r -a extra <<< "${EXTRA:-}"
python=${PYTHON:-/usr/bin/python3}
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
work=$(mktemp -d /tmp/kilter-bench-shard.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
echo "# shard_optimizer: $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$kilter" prep synth --docs 4000 --lengths lognormal:4.5,1.0,1024 --vocab 8192 --shards 2 --seed 1 --out data >/dev/null 2>&1

for p in 1 2 4; do
  "$kilter" plan --config "$here/../inputs/small.ini" --data data --world-size "$p" --memory --json 2>/dev/null > "plan$p.json"
done
"$python" - <<'PY'
import json
opt = {p: json.load(open(f"plan{p}.json"))["memory"]["optimizer_bytes"] for p in (1, 2, 4)}
for p in (1, 2, 4):
    print(f"optimizer state per rank, P={p}: {opt[p]} bytes ({opt[p] / 2**20:.2f} MiB), {opt[1] / opt[p]:.3f}x less than P=1")
    assert abs(opt[1] / opt[p] / p - 1) < 0.01, "not 1/P"
PY

run() {  # run NAME SHARD
  "${mpirun[@]}" -np "$np" "$kilter" train --config "$here/../inputs/small.ini" --data.dir=data --train.steps="$steps" \
    --output.dir="runs/$1" --output.trace_steps=0 --output.log_every=1000 --train.shard_optimizer="$2" "${extra[@]}" \
    > "$1.log" 2>&1 || { cat "$1.log"; exit 1; }
}
for i in $(seq 1 "$repeats"); do
  run "u$i" false
  run "s$i" true
done
"$python" - "$repeats" <<'PY'
import csv, json, statistics, sys
n = int(sys.argv[1])
def rate(run): return json.load(open(f"runs/{run}/summary.json"))["tokens_per_second"]
def losses(run): return [r["loss"] for r in csv.DictReader(open(f"runs/{run}/metrics/rank-00000.csv"))]
u = [rate(f"u{i}") for i in range(1, n + 1)]
s = [rate(f"s{i}") for i in range(1, n + 1)]
for i in range(1, n + 1):
    assert json.load(open(f"runs/s{i}/summary.json"))["shard_optimizer"] is True
    assert losses(f"s{i}") == losses(f"u{i}"), f"repeat {i}: sharded and unsharded losses differ"
print("unsharded tok/s:", " ".join(f"{x:.0f}" for x in u))
print("sharded   tok/s:", " ".join(f"{x:.0f}" for x in s))
mu, ms = statistics.median(u), statistics.median(s)
print(f"median: unsharded {mu:.0f}, sharded {ms:.0f}, sharded/unsharded {ms / mu:.3f} (target >= 0.98)")
# The phases sharding changes, per step (median over steps after the first, both ranks, all
# repeats): less noisy than tokens/s on a shared machine.
def phases(prefix):
    rows = [r for i in range(1, n + 1) for rank in (0, 1)
            for r in list(csv.DictReader(open(f"runs/{prefix}{i}/metrics/rank-0000{rank}.csv")))[1:]]
    return {k: statistics.median(float(r[k]) for r in rows) for k in ("optimizer", "comm_exposed", "step_total")}
pu, ps = phases("u"), phases("s")
for k in pu:
    print(f"median {k:13s} s/step: unsharded {pu[k]:.4f}, sharded {ps[k]:.4f}")
print(f"optimizer + comm_exposed share of the step: unsharded {(pu['optimizer'] + pu['comm_exposed']) / pu['step_total']:.4f}, "
      f"sharded {(ps['optimizer'] + ps['comm_exposed']) / ps['step_total']:.4f}")
PY
