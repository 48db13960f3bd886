#!/usr/bin/env bash
# The embedded default: installs what is missing, builds, prepares the Debian fortunes corpus as
# a sharded HDF5 dataset, trains a small GPT on 2 CPU ranks (inputs/demo.ini), prints the report and
# ends with text the trained model writes (`kilter sample`, from the last checkpoint).
# mpirun runs as root here, so it gets --allow-run-as-root; --oversubscribe lets 2 ranks share
# fewer cores. On a cluster, drop both and launch as in slurm/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
RANKS=${RANKS:-2}

scripts/install-deps.sh
if [[ ! -x "$BUILD_DIR/kilter" ]]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target kilter
KILTER="$BUILD_DIR/kilter"

if ! "$KILTER" prep validate data/fortunes >/dev/null 2>&1; then
  rm -rf data/fortunes
  "$KILTER" prep --input /usr/share/games/fortunes --format fortune --shards 2 --out data/fortunes
fi

MPI_FLAGS=(--oversubscribe --bind-to none)
if [[ $(id -u) -eq 0 ]]; then MPI_FLAGS+=(--allow-run-as-root); fi
rm -rf runs/demo
OPENBLAS_NUM_THREADS=1 mpirun -np "$RANKS" "${MPI_FLAGS[@]}" \
  "$KILTER" train --config inputs/demo.ini "$@"
"$KILTER" report runs/demo
echo
echo "== kilter sample --run runs/demo (a new fortune, temperature 0.8, top-k 40) =="
"$KILTER" sample --run runs/demo --max-new-tokens 200 --temperature 0.8 --top-k 40 --seed "${SAMPLE_SEED:-1}"
