#!/usr/bin/env bash
# kilter train on 2 CPU ranks vs PyTorch DDP (gloo, 2 processes, 1 thread each) on the same small
# GPT (4 layers, 256 wide, 4 heads, vocab 8192, micro-batches of 8 x 256, 16384 tokens per step),
# in one run, printing both tokens/s and the ratio. Documents are exactly 256 tokens so neither
# side pads. Usage: bench/train_vs_torch.sh [build-dir]   (STEPS=10 RANKS=2)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
KILTER=$(readlink -f "$BUILD/kilter")
PY=/usr/bin/python3
RANKS=${RANKS:-2}
STEPS=${STEPS:-10}
WORK=$(mktemp -d /tmp/kilter-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OPENBLAS_NUM_THREADS=1

"$KILTER" prep synth --docs 4000 --lengths uniform:256,256 --vocab 8192 --shards 2 --seed 1 --out "$WORK/data" >/dev/null
mpirun --allow-run-as-root --oversubscribe --bind-to core -np "$RANKS" "$KILTER" train --config inputs/small.ini \
  --data.dir="$WORK/data" --train.steps="$STEPS" --train.warmup=2 --output.dir="$WORK/run" \
  --output.log_every=5 --json > "$WORK/kilter.out" 2> "$WORK/kilter.err" || { cat "$WORK/kilter.err"; exit 1; }
# Steady state on both sides: the first WARMUP steps are left out, as the torch peer does.
K=$("$PY" - "$WORK/run/metrics/rank-00000.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))[2:]
print(sum(float(r["tokens"]) for r in rows) / sum(float(r["step_total"]) for r in rows))
PY
)
T=$("$PY" bench/torch_ddp_gpt.py --ranks "$RANKS" --threads 1 --steps "$((STEPS - 2))" --warmup 2 | tail -1 | "$PY" -c "import json,sys;print(json.load(sys.stdin)['tokens_per_second'])")
"$PY" - "$K" "$T" "$RANKS" <<'PY'
import sys
k, t, r = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
print(f"{'peer':28s} {'tokens/s':>10s}")
print(f"{'kilter (' + r + ' MPI ranks)':28s} {k:10.0f}")
print(f"{'PyTorch DDP gloo (' + r + ' procs)':28s} {t:10.0f}")
print(f"ratio kilter / PyTorch: {k / t:.2f}x")
PY
