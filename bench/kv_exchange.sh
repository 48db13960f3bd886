#!/usr/bin/env bash
# The K/V exchange of cut pieces (issue 23) with no compute around it: 2 ranks, one piece cut
# between them, every layer's K/V forward and dK/dV back through lib/comm/kv_exchange_mpi.h, next
# to the same bytes as plain blocking MPI_Sendrecv (the floor), alternately in one run. Every
# result is checked (the program exits non-zero otherwise). One JSON line per shape.
#
# usage: bench/kv_exchange.sh [BUILD_DIR]      (default: build; needs target kilter_bench_kv)
# env:   SHAPES="12:768:1024:512 12:768:1024:896"  layers:embd:tokens:cut
#        ITERATIONS=20  MPIEXEC=mpirun  KILTER_MPIRUN_FLAGS="--allow-run-as-root --oversubscribe --bind-to none"
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
bench=$build/kilter_bench_kv
[[ -x $bench ]] || { echo "kv_exchange: $bench not found (cmake --build $build --target kilter_bench_kv)" >&2; exit 1; }
mpiexec=${MPIEXEC:-mpirun}
read -r -a flags <<< "${KILTER_MPIRUN_FLAGS:---allow-run-as-root --oversubscribe --bind-to none}"
for shape in ${SHAPES:-12:768:1024:512 12:768:1024:896}; do
  IFS=: read -r layers embd tokens cut <<< "$shape"
  "$mpiexec" -np 2 "${flags[@]}" "$bench" --layers "$layers" --embd "$embd" --tokens "$tokens" --cut "$cut" \
    --iterations "${ITERATIONS:-20}"
done
