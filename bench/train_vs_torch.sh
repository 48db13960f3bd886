#!/usr/bin/env bash
# kilter train on 2 CPU ranks vs PyTorch DDP (gloo, 2 processes, 1 thread each) on the same small
# GPT (4 layers, 256 wide, 4 heads, vocab 8192, micro-batches of 8 x 256, 16384 tokens per step),
# in one run, in fp32 and in bf16 (kilter train.precision=bf16; torch.cpu.amp.autocast(bfloat16)),
# printing tokens/s of each and the ratios against the issue-16 targets (fp32 >= 2.5x, bf16 >= 1.5x).
# Documents are exactly 256 tokens so neither side pads. The first 2 steps are left out on both
# sides. With REPEATS > 1 each precision runs kilter and torch back to back REPEATS times; the
# table shows the best of each side and the ratio of every back-to-back pair (their spread shows
# how much a busy machine moved the figures).
# MODELS="gpt2 llama" adds the llama twin of that model (model.arch = llama: 2 K/V heads, SwiGLU 704,
# untied head) against a plain PyTorch Llama of the same shape (tests/python/llama_torch.py).
# Usage: bench/train_vs_torch.sh [build-dir]   (STEPS=10 RANKS=2 REPEATS=1 PRECISIONS="fp32 bf16" MODELS="gpt2 llama")
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
KILTER=$(readlink -f "$BUILD/kilter")
PY=/usr/bin/python3
RANKS=${RANKS:-2}
STEPS=${STEPS:-10}
PRECISIONS=${PRECISIONS:-fp32 bf16}
REPEATS=${REPEATS:-1}
MODELS=${MODELS:-gpt2 llama}
WORK=$(mktemp -d /tmp/kilter-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

echo "# train_vs_torch: $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $RANKS ranks x 1 thread, $STEPS steps"
"$KILTER" prep synth --docs 4000 --lengths uniform:256,256 --vocab 8192 --shards 2 --seed 1 --out "$WORK/data" >/dev/null
LLAMA_KILTER=(--model.arch=llama --model.n_kv_head=2 --model.ffn_hidden=704 --model.tie_embeddings=false)
LLAMA_TORCH=(--arch llama --n_kv_head 2 --ffn 704)
results=()
for model in $MODELS; do
 for precision in $PRECISIONS; do
  for ((r = 0; r < REPEATS; ++r)); do
    kargs=() targs=()
    [[ $model == llama ]] && kargs=("${LLAMA_KILTER[@]}") targs=("${LLAMA_TORCH[@]}")
    mpirun --allow-run-as-root --oversubscribe --bind-to core -np "$RANKS" "$KILTER" train --config inputs/small.ini \
      --data.dir="$WORK/data" --train.steps="$STEPS" --train.warmup=2 --train.precision="$precision" "${kargs[@]}" \
      --output.dir="$WORK/run-$model-$precision-$r" --output.log_every=5 --json > "$WORK/kilter.out" \
      2> "$WORK/kilter.err" || { cat "$WORK/kilter.err"; exit 1; }
    k=$("$PY" - "$WORK/run-$model-$precision-$r/metrics/rank-00000.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))[2:]
print(sum(float(r["tokens"]) for r in rows) / sum(float(r["step_total"]) for r in rows))
PY
)
    t=$("$PY" bench/torch_ddp_gpt.py --ranks "$RANKS" --threads 1 --steps "$((STEPS - 2))" --warmup 2 \
        --precision "$precision" "${targs[@]}" | tail -1 | "$PY" -c "import json,sys;print(json.load(sys.stdin)['tokens_per_second'])")
    results+=("$model/$precision" "$k" "$t")
  done
 done
done
"$PY" - "$RANKS" "${results[@]}" <<'PY'
import sys
ranks, rest = sys.argv[1], sys.argv[2:]
target = {"fp32": 2.5, "bf16": 1.5}  # by precision, for either model
runs = {}
for i in range(0, len(rest), 3):
    runs.setdefault(rest[i], []).append((float(rest[i + 1]), float(rest[i + 2])))
print(f"{'model/precision':16s} {'kilter tok/s':>13s} {'DDP tok/s':>10s} {'ratio':>7s} {'target':>7s}  pair ratios")
for p, pairs in runs.items():
    k, t = max(x[0] for x in pairs), max(x[1] for x in pairs)
    spread = " ".join(f"{a / b:.2f}" for a, b in pairs)
    print(f"{p:16s} {k:13.0f} {t:10.0f} {k / t:6.2f}x {target[p.split('/')[1]]:6.1f}x  {spread}")
print(f"(kilter: {ranks} MPI ranks; PyTorch DDP gloo: {ranks} processes; bf16 peer: torch.cpu.amp.autocast)")
PY
