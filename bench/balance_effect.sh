#!/usr/bin/env bash
# bench/balance_effect.sh — what the balanced batch plan buys in a real training run (issues 6, 13):
# the same model trained with the balanced sampler (packed micro-batches: no padding, attention
# per piece) and with the naive one (fixed sequences per rank, padded and computed), side by side:
# sync_wait_fraction (the share of rank-time spent waiting for the last rank at the gradient
# collective, over the whole run, as summary.json has it), wait_med (the same share step by step,
# median over the steps after the first SKIP: robust to the scheduler's spikes on a shared
# machine, which land on either rank and dominate the whole-run figure there), plan_wait (the
# plan's cost_wait_fraction: that share if step times were the cost model's, i.e. without noise),
# step_time_imbalance_p95, padding efficiency, the plan's cost imbalance p50/p95, tokens computed
# per rank-step, and tokens/s, plus the ratios naive/balanced sync_wait (whole run and median
# step) and balanced/naive tokens/s. A third run, `floor`, trains the balanced sampler on documents
# of exactly one context, where every rank gets the same work each step: its sync_wait is the
# machine's noise floor (on a 2-vCPU VM, ~0.03: the same work per step varies by ~10% in time on
# one rank alone), which no plan can go below; the ratio line also gives naive/balanced counted
# above that floor, i.e. the wait each sampler causes. Ranks are pinned one per core when they fit.
#
#   bench/balance_effect.sh [KILTER]      KILTER: the kilter binary (default: build/kilter)
#   env: RANKS (default "2"), STEPS (default 100), SKIP (warm-up steps left out of wait_med,
#        default 5), REPEATS (runs per sampler, alternating balanced and naive; the whole-run
#        figures are the median over the repeats, wait_med the median over all their steps;
#        default 1), DOCS (default 3000), MB_PER_RANK (micro-batches per rank per step, a list:
#        train.tokens_per_step = RANKS x MB x data.max_tokens, default "2 4": 2 is the regime the
#        plan is for, one or two micro-batches per rank; with 4 the naive sampler's ranks average
#        over 16 sequences and its imbalance shrinks),
#        CORPORA (length distributions, default "lognormal:4.5,1.1,1024 uniform:224,256": a skewed
#        corpus, many short documents and a long tail cut at the context, and one where padding
#        already wastes little), LAYERS and EMBD (the model, default 4 x 128: with 2 x 64 a step
#        takes ~30 ms, and the part of the VM's per-step jitter that does not grow with the step
#        weighs more: floors of 0.021-0.075 against 0.014-0.054 with 4 x 128 on one day)
#
# Both runs see the same corpus, model, token budget per micro-batch (data.max_tokens = 4 x
# context, naive: 4 sequences per micro-batch) and tokens per step. Checks what it times: both
# runs must finish every step with a finite loss, and their summaries and per-rank metrics must
# come from the diagnostics of the same world size. Never run as a test (minutes on a busy
# 2-core machine).
set -euo pipefail

KILTER=$(readlink -f "${1:-build/kilter}")
RANKS=${RANKS:-"2"}
STEPS=${STEPS:-100}
MB_PER_RANK=${MB_PER_RANK:-"2 4"}
SKIP=${SKIP:-5}
REPEATS=${REPEATS:-1}
DOCS=${DOCS:-3000}
CORPORA=${CORPORA:-"lognormal:4.5,1.1,1024 uniform:224,256"}
PY=${PY:-/usr/bin/python3}
CONTEXT=256
LAYERS=${LAYERS:-4}
EMBD=${EMBD:-128}
[[ -x "$KILTER" ]] || { echo "bench/balance_effect.sh: no kilter binary at $KILTER (pass its path)" >&2; exit 2; }
work=$(mktemp -d /tmp/kilter-balance.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OPENBLAS_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1

printf '%-26s %-5s %-3s %-9s %9s %9s %9s %9s %9s %9s %9s %12s %11s\n' corpus ranks mb sampler sync_wait wait_med plan_wait \
  imb_p95 pad_eff cost_p50 cost_p95 computed/rs tokens/s
"$KILTER" prep synth --docs "$DOCS" --lengths "uniform:$CONTEXT,$CONTEXT" --vocab 256 --shards 2 --seed 11 \
  --out floordata > /dev/null 2>&1
ci=0
for LENGTHS in $CORPORA; do
  ci=$((ci + 1))
  rm -rf data
  "$KILTER" prep synth --docs "$DOCS" --lengths "$LENGTHS" --vocab 256 --shards 2 --seed 11 --out data > /dev/null 2>&1
  for P in $RANKS; do
   # A rank per core, pinned, where the cores suffice (less scheduler noise in the waits);
   # unpinned when oversubscribed.
   bind=none
   (( P <= $(nproc) )) && bind=core
   for MB in $MB_PER_RANK; do
    # The two samplers alternate, repeat after repeat, so that both see the same drift in the
    # machine's load.
    for rep in $(seq 1 "$REPEATS"); do
     for kind in balanced naive floor; do
      # floor: the balanced sampler on documents of exactly one context, so every rank gets the
      # same work each step and any wait is the machine's noise, not the plan's.
      sampler=$kind dir=data
      [[ $kind == floor ]] && sampler=balanced dir=floordata
      tokens_per_step=$((P * MB * 4 * CONTEXT))
      run="runs/c$ci-$P-$MB-$kind-$rep"
      timeout 900 mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np "$P" "$KILTER" train \
        --data.dir=$dir --model.n_layer="$LAYERS" --model.n_head=2 --model.n_embd="$EMBD" --model.block_size=$CONTEXT \
        --data.max_tokens=$((4 * CONTEXT)) --data.naive_batch_size=4 --data.sampler=$sampler \
        --train.tokens_per_step=$tokens_per_step --train.steps="$STEPS" --train.warmup=5 \
        --output.log_every=1000 --output.trace_steps=0 --comm.timeout_s=120 \
        --output.dir="$run" > "${run#runs/}.log" 2>&1 \
        || { cat "${run#runs/}.log"; echo "bench/balance_effect.sh: $kind run on $P ranks, $MB micro-batches per rank ($LENGTHS) failed" >&2; exit 1; }
     done
    done
    "$PY" - "$LENGTHS" "$P" "$STEPS" "$ci" "$SKIP" "$MB" "$REPEATS" <<'PY'
import csv, glob, json, math, statistics, sys
corpus, P, steps, ci, skip, mb, repeats = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                          int(sys.argv[5]), sys.argv[6], int(sys.argv[7]))
med = statistics.median
s, computed, step_wait = {}, {}, {}
for k in ("balanced", "naive", "floor"):
    summaries, fractions, rows = [], [], []
    for rep in range(1, repeats + 1):
        run = f"runs/c{ci}-{P}-{mb}-{k}-{rep}"
        v = json.load(open(f"{run}/summary.json"))
        assert v["world_size"] == P and v["steps"] == steps, f"{run}: {v['world_size']} ranks, {v['steps']} steps"
        assert math.isfinite(v["final_loss"]), f"{run}: final loss {v['final_loss']}"
        summaries.append(v)
        files = sorted(glob.glob(f"{run}/metrics/rank-*.csv"))
        assert len(files) == P, f"{run}: {len(files)} metrics files for {P} ranks"
        by_step = {}
        for f in files:
            for r in csv.DictReader(open(f)):
                rows.append(r)
                by_step.setdefault(int(r["step"]), []).append(r)
        # Per step, as the summary counts it over the run: the rank-seconds spent waiting for
        # the last arrival at the gradient collective over the rank-seconds of the step.
        for step, ranks in sorted(by_step.items()):
            if step < skip or len(ranks) != P:
                continue
            last = max(float(r["arrival"]) for r in ranks)
            wait = sum(last - float(r["arrival"]) for r in ranks)
            total = sum(float(r["step_total"]) for r in ranks)
            fractions.append(wait / total if total > 0 else 0.0)
    assert fractions, f"{k}: no step past the first {skip}"
    computed[k] = sum(float(r["tokens_computed"]) for r in rows) / max(1, len(rows))
    step_wait[k] = med(fractions)
    # The plan's figures are the same every repeat; the measured ones: median over the repeats.
    s[k] = dict(summaries[0])
    for key in ("sync_wait_fraction", "step_time_imbalance_p95", "tokens_per_second"):
        s[k][key] = med([v[key] for v in summaries])
for k, v in s.items():
    print(f"{corpus:<26} {P:<5} {mb:<3} {k:<9} {v['sync_wait_fraction']:9.3f} {step_wait[k]:9.3f} {v['cost_wait_fraction']:9.4f} "
          f"{v['step_time_imbalance_p95']:9.3f} {v['padding_efficiency']:9.3f} {v['cost_imbalance_p50']:9.3f} "
          f"{v['cost_imbalance_p95']:9.3f} {computed[k]:12.0f} {v['tokens_per_second']:11.0f}")
b, n = s["balanced"], s["naive"]
def ratio(x, y):
    return x / y if y > 0 else float("inf")
f = s["floor"]["sync_wait_fraction"]
above = (f"above the floor {ratio(n['sync_wait_fraction'] - f, b['sync_wait_fraction'] - f):.2f}x"
         if b["sync_wait_fraction"] > f else "balanced at or below the floor")
print(f"{corpus:<26} {P:<5} {mb:<3} {'ratio':<9} naive/balanced sync_wait {ratio(n['sync_wait_fraction'], b['sync_wait_fraction']):.2f}x "
      f"(median step {ratio(step_wait['naive'], step_wait['balanced']):.2f}x; {above}), "
      f"balanced/naive tokens/s {ratio(b['tokens_per_second'], n['tokens_per_second']):.2f}x")
PY
   done
  done
done
