#!/usr/bin/env bash
# bench/balance_effect.sh — what the balanced batch plan buys in a real training run (issues 6, 13):
# the same model trained with the balanced sampler (packed micro-batches: no padding, attention
# per piece) and with the naive one (fixed sequences per rank, padded and computed), side by side:
# sync_wait_fraction (the share of rank-time spent waiting for the last rank at the gradient
# collective), step_time_imbalance_p95, padding efficiency, tokens computed per rank-step, and
# tokens/s, plus the ratios naive/balanced sync_wait and balanced/naive tokens/s.
#
#   bench/balance_effect.sh [KILTER]      KILTER: the kilter binary (default: build/kilter)
#   env: RANKS (default "2"), STEPS (default 40), DOCS (default 3000), MB_PER_RANK (micro-batches
#        per rank per step: train.tokens_per_step = RANKS x MB_PER_RANK x data.max_tokens, default 4),
#        CORPORA (length distributions, default "lognormal:4.5,1.1,1024 uniform:224,256": a skewed
#        corpus, many short documents and a long tail cut at the context, and one where padding
#        already wastes little)
#
# Both runs see the same corpus, model, token budget per micro-batch (data.max_tokens = 4 x
# context, naive: 4 sequences per micro-batch) and tokens per step. Checks what it times: both
# runs must finish every step with a finite loss, and their summaries must come from the
# diagnostics of the same world size. Never run as a test (minutes on a busy 2-core machine).
set -euo pipefail

KILTER=$(readlink -f "${1:-build/kilter}")
RANKS=${RANKS:-"2"}
STEPS=${STEPS:-40}
MB_PER_RANK=${MB_PER_RANK:-4}
SKIP=${SKIP:-5}
DOCS=${DOCS:-3000}
CORPORA=${CORPORA:-"lognormal:4.5,1.1,1024 uniform:224,256"}
PY=${PY:-/usr/bin/python3}
CONTEXT=256
[[ -x "$KILTER" ]] || { echo "bench/balance_effect.sh: no kilter binary at $KILTER (pass its path)" >&2; exit 2; }
work=$(mktemp -d /tmp/kilter-balance.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OPENBLAS_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1

printf '%-26s %-5s %-9s %9s %9s %9s %9s %9s %9s %12s %11s\n' corpus ranks sampler sync_wait wait_med imb_p95 \
  pad_eff cost_p50 cost_p95 computed/rs tokens/s
ci=0
for LENGTHS in $CORPORA; do
  ci=$((ci + 1))
  rm -rf data
  "$KILTER" prep synth --docs "$DOCS" --lengths "$LENGTHS" --vocab 256 --shards 2 --seed 11 --out data > /dev/null 2>&1
  for P in $RANKS; do
    for sampler in balanced naive; do
      tokens_per_step=$((P * MB_PER_RANK * 4 * CONTEXT))
      run="runs/c$ci-$P-$sampler"
      timeout 900 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$P" "$KILTER" train \
        --data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=64 --model.block_size=$CONTEXT \
        --data.max_tokens=$((4 * CONTEXT)) --data.naive_batch_size=4 --data.sampler=$sampler \
        --train.tokens_per_step=$tokens_per_step --train.steps="$STEPS" --train.warmup=5 \
        --output.log_every=1000 --output.trace_steps=0 --comm.timeout_s=120 \
        --output.dir="$run" > "$P-$sampler.log" 2>&1 \
        || { cat "$P-$sampler.log"; echo "bench/balance_effect.sh: $sampler run on $P ranks ($LENGTHS) failed" >&2; exit 1; }
    done
    "$PY" - "$LENGTHS" "$P" "$STEPS" "$ci" "$SKIP" <<'PY'
import csv, glob, json, math, statistics, sys
corpus, P, steps, ci, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
s, computed, step_wait = {}, {}, {}
for k in ("balanced", "naive"):
    run = f"runs/c{ci}-{P}-{k}"
    s[k] = json.load(open(f"{run}/summary.json"))
    files = sorted(glob.glob(f"{run}/metrics/rank-*.csv"))
    assert len(files) == P, f"{k}: {len(files)} metrics files for {P} ranks"
    by_step = {}
    rows = []
    for f in files:
        for r in csv.DictReader(open(f)):
            rows.append(r)
            by_step.setdefault(int(r["step"]), []).append(r)
    computed[k] = sum(float(r["tokens_computed"]) for r in rows) / max(1, len(rows))
    # Per step, as the summary counts it over the run: the rank-seconds spent waiting for the
    # last arrival at the gradient collective over the rank-seconds of the step.
    fractions = []
    for step, ranks in sorted(by_step.items()):
        if step < skip or len(ranks) != P:
            continue
        last = max(float(r["arrival"]) for r in ranks)
        wait = sum(last - float(r["arrival"]) for r in ranks)
        total = sum(float(r["step_total"]) for r in ranks)
        fractions.append(wait / total if total > 0 else 0.0)
    assert fractions, f"{k}: no step past the first {skip}"
    step_wait[k] = statistics.median(fractions)
for k, v in s.items():
    assert v["world_size"] == P and v["steps"] == steps, f"{k}: {v['world_size']} ranks, {v['steps']} steps"
    assert math.isfinite(v["final_loss"]), f"{k}: final loss {v['final_loss']}"
    print(f"{corpus:<26} {P:<5} {k:<9} {v['sync_wait_fraction']:9.3f} {step_wait[k]:9.3f} "
          f"{v['step_time_imbalance_p95']:9.3f} {v['padding_efficiency']:9.3f} {v['cost_imbalance_p50']:9.3f} "
          f"{v['cost_imbalance_p95']:9.3f} {computed[k]:12.0f} {v['tokens_per_second']:11.0f}")
b, n = s["balanced"], s["naive"]
def ratio(x, y):
    return x / y if y > 0 else float("inf")
print(f"{corpus:<26} {P:<5} {'ratio':<9} naive/balanced sync_wait {ratio(n['sync_wait_fraction'], b['sync_wait_fraction']):.2f}x "
      f"(median step {ratio(step_wait['naive'], step_wait['balanced']):.2f}x), "
      f"balanced/naive tokens/s {ratio(b['tokens_per_second'], n['tokens_per_second']):.2f}x")
PY
  done
done
