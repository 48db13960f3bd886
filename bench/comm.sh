#!/usr/bin/env bash
# Gradient-reduction benchmark (issue 5): `kilter bench-comm` on 2 ranks and on 4 ranks as
# 2 nodes x 2, printing hierarchical (and flat) busbw next to one plain MPI_Allreduce of the same
# bytes and the ratio (target: hierarchical >= 0.9x MPI_Allreduce at 16 MB and up); then the
# overlap study: a synthetic backward computing a fixed amount of work per bucket while the
# reducer runs, in each overlap mode (off, poll, thread), and how much of the reduction it hid.
# Every number printed comes from a run whose reduced values were verified.
#
# usage: bench/comm.sh [path/to/kilter] [--quick]
#   env: MPIRUN (default mpirun), MPIRUN_FLAGS (default: --allow-run-as-root --oversubscribe
#        --bind-to none), SIZES (default 1M,16M,64M), ITERS (default 10), ROUNDS (default 5),
#        BACKWARD_MS (default 20: compute per bucket in the overlap study), ENGINE_ARGS (extra
#        bench-comm options, e.g. "--engine blocking --bucket-mb 0")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kilter=${1:-$root/build/kilter}
[[ -x "$kilter" ]] || { echo "bench/comm.sh: $kilter is not built (make kilter)" >&2; exit 2; }
mpirun=${MPIRUN:-mpirun}
read -r -a flags <<< "${MPIRUN_FLAGS:---allow-run-as-root --oversubscribe --bind-to none}"
sizes=${SIZES:-1M,16M,64M}
iters=${ITERS:-10}
rounds=${ROUNDS:-5}
backward_ms=${BACKWARD_MS:-20}
overlap_sizes=16M
overlap_bucket_mb=2   # 8 buckets
if [[ "${2:-}" == "--quick" ]]; then sizes=1M,16M; iters=3; rounds=2; overlap_sizes=4M; overlap_bucket_mb=0.5; fi
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# $(date -u +%FT%TZ) $(hostname): $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $("$mpirun" --version 2>/dev/null | head -1)"

run_bench() {  # name np extra-args...
  local name=$1 np=$2
  shift 2
  "$mpirun" -n "$np" "${flags[@]}" "$kilter" bench-comm --bytes "$sizes" --algo both --iters "$iters" \
    --rounds "$rounds" --json ${ENGINE_ARGS:-} "$@" > "$work/$name.json"
}
run_bench np2 2
run_bench np4_2x2 4 --ranks-per-node 2

echo
echo "## allreduce (sum, float32): kilter's reduction vs one plain MPI_Allreduce of the same bytes"
echo "## busbw = algbw*2(n-1)/n in GB/s; ratio = MPI_Allreduce time / kilter time; fastest of $rounds rounds x $iters"
echo "## kilter: 4 MiB buckets, nonblocking stages (as training with comm.overlap = true); ENGINE_ARGS: ${ENGINE_ARGS:-none}"
/usr/bin/python3 - "$work"/np2.json "$work"/np4_2x2.json <<'PY'
import json, sys
print(f"{'layout':>7} {'bytes':>10} {'algo':<13} {'time_us':>10} {'busbw':>7} {'mpi_us':>10} {'mpi_busbw':>9} "
      f"{'ratio':>6} {'target':>7} check")
for path in sys.argv[1:]:
    for r in json.load(open(path)):
        layout = f"{r['nodes']}x{r['ranks_per_node']}"
        target = ""
        if r["algo"] == "hierarchical" and r["bytes"] >= 16 << 20:
            target = "met" if r["ratio_vs_mpi_allreduce"] >= 0.9 else "MISSED"
        print(f"{layout:>7} {r['bytes']:>10} {r['algo']:<13} {r['time_us']:>10.1f} {r['busbw_gbs']:>7.3f} "
              f"{r['mpi_allreduce_time_us']:>10.1f} {r['mpi_allreduce_busbw_gbs']:>9.3f} "
              f"{r['ratio_vs_mpi_allreduce']:>6.2f} {target:>7} {'ok' if r['verified'] else 'WRONG'}")
PY

echo
echo "## overlap study, 4 ranks as 2 nodes x 2, ${backward_ms} ms of compute per bucket, 8 buckets"
"$mpirun" -n 4 "${flags[@]}" "$kilter" bench-comm --bytes "$overlap_sizes" --algo hierarchical \
  --ranks-per-node 2 --iters "$iters" --backward-ms "$backward_ms" --bucket-mb "$overlap_bucket_mb"
echo
echo "## overlap study, 2 ranks, ${backward_ms} ms of compute per bucket, 8 buckets"
"$mpirun" -n 2 "${flags[@]}" "$kilter" bench-comm --bytes "$overlap_sizes" --algo flat \
  --iters "$iters" --backward-ms "$backward_ms" --bucket-mb "$overlap_bucket_mb"
