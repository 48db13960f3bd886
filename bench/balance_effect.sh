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
# A second section, `cuts` (issue 23), trains the balanced sampler with one context per rank per
# step (train.tokens_per_step = RANKS x CUT_CONTEXT) with data.cut_pieces true and false side by
# side, on CUT_CORPORA: there whole pieces cannot balance a step, and cuts move tokens between
# ranks, whose K/V then cross between them layer by layer. It prints tokens/s, the slowest rank's
# step time (steps after the first SKIP: their median, robust to the scheduler's stalls on a
# shared machine, and their mean), sync_wait, kv_wait (the share of rank-time spent waiting for another rank's K/V or
# dK/dV), the plan's cost imbalance p95, cuts' earlier tokens per step, and the ratios with
# cuts / without, beside the ratio the cost model predicts (`kilter plan`'s
# critical_cost_per_token without / with cuts).
#   env: SECTIONS (default "samplers cuts"; add calibration for the third), CUT_CORPORA (default "lognormal:6,0.8,1024
#        uniform:600,1024": a skewed corpus, and one of pieces of half to one context, where two
#        ranks gain the most from cuts), CUT_CONTEXT (default 1024; data.max_tokens = 2 x that,
#        so each rank's share and a part fit one micro-batch), CUT_STEPS (default 100),
#        CUT_REPEATS (runs per setting, alternating on and off; default 3),
#        CUT_COST_T (unset: the plan derives the transfer charge t from the model and the link; set:
#        data.cost_t, e.g. what `kilter plan --calibrate` fitted on a first run),
#        CUT_COST_CHECK (unset: kilter's default data.cut_cost_check; set: that many steps, 0 off),
#        CUT_COST_REPLAN (unset: kilter's default data.cut_cost_replan, false: the check only warns;
#        true: a run whose cuts cost more than charged re-plans its remaining steps); the runs with
#        cuts print what the check measured and, where they re-planned, the steps after the
#        latest switch with cuts and without,
#        CUT_VCLUSTER_GBIT (unset: the cut runs are local; set, e.g. 1: they run on scripts/vcluster,
#        2 nodes x RANKS/2 ranks with the link between them shaped to that many Gbit/s, so K/V of
#        cuts across nodes are real network traffic, and the plan sees comm.link_gbps = that; needs
#        root and no vcluster up, and takes the vcluster down when it ends)
# A third section, `calibration` (issue 39; not in the default SECTIONS), trains the balanced
# sampler on 2 ranks with data.cost_calibration off and auto side by side, beside the equal-work
# floor (documents of exactly one context, off), and the slow-rank drill (train.inject_delay =
# 1:CAL_DRILL%: rank 1 that much slower on all its work) with off and auto, alternating, REPEATS runs
# each. It prints sync_wait over the whole run and over the steps from the latest of the auto runs'
# first switches (what the calibration changed; the same steps for every setting), step-time
# imbalance p95, the median step, tokens/s, where each auto run switched and the model in force,
# and the ratios auto / floor and drill off / auto, from that step and over the whole run.
#   env: CAL_CORPUS (default lognormal:4.8,1.1,1024), CAL_CONTEXT (default 512; data.max_tokens =
#        4 x that), CAL_MB (micro-batches per rank per step, default 4: 16384-token steps, the
#        issue's setting), CAL_STEPS (default 100), CAL_DRILL (default 15, percent), WAIT_LOAD
#        (unset; e.g. 2.5: before each run wait until the 1-minute load average is below it)
#   KEEP (unset; a directory: every run's directory, metrics and summary.json, is moved there at the
#        end instead of deleted, e.g. to read the calibration's windows of an auto run)
# The cut section also compares step by step (a step holds the same tokens with cuts on and off):
# `slower` is the share of steps whose slowest-rank time, median over the repeats, is more than 5%
# above the same step's without cuts.
#
# Both runs see the same corpus, model, token budget per micro-batch (data.max_tokens = 4 x
# context, naive: 4 sequences per micro-batch) and tokens per step. Checks what it times: both
# runs must finish every step with a finite loss, and their summaries and per-rank metrics must
# come from the diagnostics of the same world size. Never run as a test (minutes on a busy
# 2-core machine).
set -euo pipefail

KILTER=$(readlink -f "${1:-build/kilter}")
VCLUSTER=$(cd "$(dirname "$0")/.." && pwd)/scripts/vcluster
RANKS=${RANKS:-"2"}
STEPS=${STEPS:-100}
MB_PER_RANK=${MB_PER_RANK:-"2 4"}
SKIP=${SKIP:-5}
REPEATS=${REPEATS:-1}
DOCS=${DOCS:-3000}
CORPORA=${CORPORA:-"lognormal:4.5,1.1,1024 uniform:224,256"}
PY=${PY:-/usr/bin/python3}
CONTEXT=256
SECTIONS=${SECTIONS:-"samplers cuts"}
CUT_CORPORA=${CUT_CORPORA:-"lognormal:6,0.8,1024 uniform:600,1024"}
CUT_CONTEXT=${CUT_CONTEXT:-1024}
CUT_STEPS=${CUT_STEPS:-100}
CAL_CORPUS=${CAL_CORPUS:-lognormal:4.8,1.1,1024}
CAL_CONTEXT=${CAL_CONTEXT:-512}
CAL_STEPS=${CAL_STEPS:-100}
CAL_DRILL=${CAL_DRILL:-15}
CAL_MB=${CAL_MB:-4}
CUT_REPEATS=${CUT_REPEATS:-3}
LAYERS=${LAYERS:-4}
EMBD=${EMBD:-128}
[[ -x "$KILTER" ]] || { echo "bench/balance_effect.sh: no kilter binary at $KILTER (pass its path)" >&2; exit 2; }
work=$(mktemp -d /tmp/kilter-balance.XXXXXX)
# KEEP=DIR: the run directories are moved there at the end (their metrics and summaries), not deleted.
trap '[[ -n ${KEEP:-} ]] && mkdir -p "$KEEP" && mv "$work"/runs/* "$KEEP"/ 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
export OPENBLAS_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
# synth LENGTHS DIR: a fresh synthetic corpus
synth() { rm -rf "$2"; "$KILTER" prep synth --docs "$DOCS" --lengths "$1" --vocab 256 --shards 2 --seed 11 --out "$2" > /dev/null 2>&1; }
# WAIT_LOAD set: before each run of the calibration section, wait (up to 30 min) until the 1-minute
# load average is below it (a shared machine: other jobs' load is the noise these runs measure).
wait_for_quiet() {
  [[ -n ${WAIT_LOAD:-} ]] || return 0
  for _ in $(seq 360); do
    awk -v max="$WAIT_LOAD" '{ exit !($1 < max) }' /proc/loadavg && return 0
    sleep 5
  done
}
# A rank per core, pinned, where the cores suffice (less scheduler noise in the waits);
# unpinned when oversubscribed.
bind_for() { if (( $1 <= $(nproc) )); then echo core; else echo none; fi; }

if [[ " $SECTIONS " == *" samplers "* ]]; then
printf '%-26s %-5s %-3s %-9s %9s %9s %9s %9s %9s %9s %9s %12s %11s\n' corpus ranks mb sampler sync_wait wait_med plan_wait \
  imb_p95 pad_eff cost_p50 cost_p95 computed/rs tokens/s
synth "uniform:$CONTEXT,$CONTEXT" floordata
ci=0
for LENGTHS in $CORPORA; do
  ci=$((ci + 1))
  synth "$LENGTHS" data
  for P in $RANKS; do
   bind=$(bind_for "$P")
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
fi

# ---- calibration: data.cost_calibration auto vs off, and the slow-rank drill (issue 39) --------
if [[ " $SECTIONS " == *" calibration "* ]]; then
  P=2
  bind=$(bind_for "$P")
  synth "$CAL_CORPUS" caldata
  synth "uniform:$CAL_CONTEXT,$CAL_CONTEXT" calfloor
  cal_args=(--model.n_layer="$LAYERS" --model.n_head=2 --model.n_embd="$EMBD" --model.block_size="$CAL_CONTEXT"
            --data.max_tokens=$((4 * CAL_CONTEXT)) --data.sampler=balanced
            --train.tokens_per_step=$((P * CAL_MB * 4 * CAL_CONTEXT)) --train.steps="$CAL_STEPS" --train.warmup=5
            --output.log_every=1000 --output.trace_steps=0 --comm.timeout_s=120)
  # Alternating, repeat after repeat, so every setting sees the same drift in the machine's load.
  for rep in $(seq 1 "$REPEATS"); do
    for kind in off auto floor drill_off drill_auto; do
      wait_for_quiet
      dir=caldata mode=${kind#drill_} drill=()
      [[ $kind == floor ]] && dir=calfloor mode=off
      [[ $kind == drill_* ]] && drill=(--train.inject_delay="1:$CAL_DRILL%")
      run="runs/cal-$kind-$rep"
      timeout 900 mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np "$P" "$KILTER" train \
        --data.dir="$dir" "${cal_args[@]}" --data.cost_calibration="$mode" "${drill[@]}" --output.dir="$run" \
        > "${run#runs/}.log" 2>&1 || { cat "${run#runs/}.log"; echo "bench/balance_effect.sh: calibration run $kind failed" >&2; exit 1; }
    done
  done
  echo
  echo "calibration: balanced sampler, $P ranks, $CAL_CORPUS, context $CAL_CONTEXT, $((P * CAL_MB * 4 * CAL_CONTEXT))-token steps," \
    "model $LAYERS x $EMBD, $CAL_STEPS steps, $REPEATS runs per setting (medians); load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PY" - "$CAL_STEPS" "$REPEATS" "$SKIP" "$CAL_DRILL" <<'PY'
import csv, glob, json, math, statistics, sys
steps, repeats, skip, drill = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
med = statistics.median


def load(run):
    v = json.load(open(f"{run}/summary.json"))
    assert v["steps"] == steps and math.isfinite(v["final_loss"]), f"{run}: {v['steps']} steps, loss {v['final_loss']}"
    by = {}
    for f in sorted(glob.glob(f"{run}/metrics/rank-*.csv")):
        for r in csv.DictReader(open(f)):
            by.setdefault(int(r["step"]), []).append(r)
    return v, by


def sync(by, first):
    """sync_wait over the steps from `first`: rank-seconds waiting for the last arrival / rank-seconds."""
    wait = total = 0.0
    for s, rows in by.items():
        if s < first or len(rows) < 2:
            continue
        last = max(float(r["arrival"]) for r in rows)
        wait += sum(last - float(r["arrival"]) for r in rows)
        total += sum(float(r["step_total"]) for r in rows)
    return wait / total if total > 0 else 0.0


def switches_of(v):
    cc = v.get("cost_calibration") or {}
    return [m["from_step"] for m in cc.get("in_force", [])]


runs = {k: [load(f"runs/cal-{k}-{rep}") for rep in range(1, repeats + 1)]
        for k in ("off", "auto", "floor", "drill_off", "drill_auto")}
# The steps compared after the calibration: from the latest first switch of the auto runs (else
# SKIP), the same steps for every setting. A run re-plans again where the next window's fit (20
# steps after a switch) still pays; those later, smaller switches are inside the steps compared.
firsts = [switches_of(v)[0] for v, _ in runs["auto"] + runs["drill_auto"] if switches_of(v)]
first = max(firsts + [skip])
print(f"{'setting':<11} {'sync_wait':>9} {'from ' + str(first):>9} {'imb_p95':>8} {'step_med':>9} {'tokens/s':>9}  {'switches':<16} fitted")
fig = {}
for k, rs in runs.items():
    whole = med([v["sync_wait_fraction"] for v, _ in rs])
    after = med([sync(by, first) for _, by in rs])
    imb = med([v["step_time_imbalance_p95"] for v, _ in rs])
    tps = med([v["tokens_per_second"] for v, _ in rs])
    step_med = med([v.get("median_step_seconds", 0) for v, _ in rs])
    fig[k] = after
    fig[k + "_whole"] = whole
    sw = ",".join("/".join(map(str, switches_of(v))) or "-" for v, _ in rs)
    fitted = ""
    last = (rs[0][0].get("cost_calibration") or {}).get("in_force", [])
    if last:
        m = last[-1]
        fitted = f"cost_b {m['cost_b']:.3g} cost_c {m['cost_c']:.3g} speed {m['rank_speed'] or '-'}"
    print(f"{k:<11} {whole:9.4f} {after:9.4f} {imb:8.3f} {step_med * 1e3:7.1f}ms {tps:9.0f}  {sw:<16} {fitted}")
ratio = lambda x, y: x / y if y > 0 else float("inf")
print(f"ratio from step {first}: auto / floor sync_wait {ratio(fig['auto'], fig['floor']):.2f}x (issue 39 asks <= 1.5x), "
      f"off / floor {ratio(fig['off'], fig['floor']):.2f}x; drill (rank 1 {drill}% slower on all work): "
      f"off / auto sync_wait {ratio(fig['drill_off'], fig['drill_auto']):.2f}x (asks >= 3x)")
print(f"ratio over the whole run (the steps before the first switch included): auto / floor "
      f"{ratio(fig['auto_whole'], fig['floor_whole']):.2f}x, off / floor {ratio(fig['off_whole'], fig['floor_whole']):.2f}x; "
      f"drill off / auto {ratio(fig['drill_off_whole'], fig['drill_auto_whole']):.2f}x")
PY
  # What `kilter report` says of the first drill run with auto: the re-plan and the slow rank.
  "$KILTER" report runs/cal-drill_auto-1 2>/dev/null | grep -E "^    steps|rank speed:" | sed 's/^ */  report: /'
fi

# ---- cuts: data.cut_pieces true vs false at one context per rank per step (issue 23) ----------
[[ " $SECTIONS " == *" cuts "* ]] || exit 0
launch=(mpirun --allow-run-as-root --oversubscribe)
link_args=()
where="local, ranks pinned one per core where they fit"
if [[ -n ${CUT_VCLUSTER_GBIT:-} ]]; then
  vcluster=$VCLUSTER
  "$vcluster" status | grep -q "^vcluster: down" || { echo "bench/balance_effect.sh: a vcluster is up; vcluster down first" >&2; exit 2; }
  trap '"$vcluster" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
  "$vcluster" up --nodes 2 --link-gbit "$CUT_VCLUSTER_GBIT" > /dev/null 2>&1
  launch=("$vcluster" mpirun --oversubscribe -x OPENBLAS_NUM_THREADS)
  link_args=(--comm.link_gbps="$CUT_VCLUSTER_GBIT")
  where="scripts/vcluster: 2 nodes, link shaped to $CUT_VCLUSTER_GBIT Gbit/s, comm.link_gbps = $CUT_VCLUSTER_GBIT"
fi
echo
echo "cut pieces: balanced sampler, one context per rank per step (context $CUT_CONTEXT, max_tokens $((2 * CUT_CONTEXT))," \
  "$CUT_STEPS steps, $CUT_REPEATS runs per setting, model $LAYERS x $EMBD; medians over the runs; $where)"
printf '%-22s %-5s %-4s %9s %9s %9s %9s %9s %9s %9s %9s\n' corpus ranks cuts tokens/s step_med step_mean sync_wait kv_wait \
  plan_imb95 kv_tok/st crit_cost
ci=0
for LENGTHS in $CUT_CORPORA; do
  ci=$((ci + 1))
  synth "$LENGTHS" cutdata
  for P in $RANKS; do
    bind=$(bind_for "$P")
    [[ -z ${CUT_VCLUSTER_GBIT:-} ]] || bind=none
    nodes=()
    [[ -n ${CUT_VCLUSTER_GBIT:-} ]] && nodes=(--npernode $(((P + 1) / 2)))
    args=(--data.dir="$work/cutdata" "${link_args[@]}" --model.n_layer="$LAYERS" --model.n_head=2 --model.n_embd="$EMBD"
          --model.block_size="$CUT_CONTEXT" --data.max_tokens=$((2 * CUT_CONTEXT)) --data.sampler=balanced
          --train.tokens_per_step=$((P * CUT_CONTEXT)) --train.backend=cpu ${CUT_COST_T:+--data.cost_t=$CUT_COST_T}
          ${CUT_COST_CHECK:+--data.cut_cost_check=$CUT_COST_CHECK} ${CUT_COST_REPLAN:+--data.cut_cost_replan=$CUT_COST_REPLAN})
    for cut in true false; do
      "$KILTER" plan --data "$work/cutdata" --world-size "$P" "${args[@]:1}" --data.cut_pieces=$cut --json 2>/dev/null \
        > "cutplan-$ci-$P-$cut.json"
    done
    for rep in $(seq 1 "$CUT_REPEATS"); do
      for cut in true false; do
        run="runs/cut$ci-$P-$cut-$rep"
        timeout 900 "${launch[@]}" --bind-to "$bind" -np "$P" "${nodes[@]}" "$KILTER" train "${args[@]}" \
          --data.cut_pieces=$cut --train.steps="$CUT_STEPS" --train.warmup=5 --output.log_every=1000 \
          --output.trace_steps=0 --comm.timeout_s=120 --output.dir="$work/$run" > "${run#runs/}.log" 2>&1 \
          || { cat "${run#runs/}.log"; echo "bench/balance_effect.sh: cut_pieces=$cut run on $P ranks ($LENGTHS) failed" >&2; exit 1; }
      done
    done
    "$PY" - "$LENGTHS" "$P" "$CUT_STEPS" "$ci" "$SKIP" "$CUT_REPEATS" <<'PY'
import csv, glob, json, math, statistics, sys
corpus, P, steps, ci, skip, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
med = statistics.median
out, per_step = {}, {}
for cut in ("true", "false"):
    plan = json.load(open(f"cutplan-{ci}-{P}-{cut}.json"))
    tps, sync, kv, step_times, by_index = [], [], [], [], {}
    for rep in range(1, repeats + 1):
        run = f"runs/cut{ci}-{P}-{cut}-{rep}"
        v = json.load(open(f"{run}/summary.json"))
        assert v["world_size"] == P and v["steps"] == steps, f"{run}: {v['world_size']} ranks, {v['steps']} steps"
        assert math.isfinite(v["final_loss"]), f"{run}: final loss {v['final_loss']}"
        # The run's plan is the one `kilter plan` printed for the same config.
        assert abs(v["cost_imbalance_p95"] - plan["cost_imbalance_p95"]) < 1e-9, f"{run}: not the plan of kilter plan"
        tps.append(v["tokens_per_second"]); sync.append(v["sync_wait_fraction"]); kv.append(v["kv_wait_fraction"])
        by_step = {}
        for f in sorted(glob.glob(f"{run}/metrics/rank-*.csv")):
            for r in csv.DictReader(open(f)):
                by_step.setdefault(int(r["step"]), []).append(float(r["step_total"]))
        step_times += [max(t) for s, t in by_step.items() if s >= skip and len(t) == P]
        for s, t in by_step.items():
            if s >= skip and len(t) == P:
                by_index.setdefault(s, []).append(max(t))
    per_step[cut] = {s: med(t) for s, t in by_index.items()}
    assert step_times, f"cut_pieces={cut}: no step past the first {skip}"
    out[cut] = dict(tps=med(tps), step=statistics.fmean(step_times), step_med=med(step_times), sync=med(sync), kv=med(kv), imb=plan["cost_imbalance_p95"],
                    kvtok=v["kv_tokens_per_step"], crit=plan["critical_cost_per_token"])
    o = out[cut]
    print(f"{corpus:<22} {P:<5} {'on' if cut == 'true' else 'off':<4} {o['tps']:9.0f} {o['step_med']*1e3:7.1f}ms {o['step']*1e3:7.1f}ms {o['sync']:9.3f} "
          f"{o['kv']:9.3f} {o['imb']:9.3f} {o['kvtok']:9.1f} {o['crit']:9.4f}")
on, off = out["true"], out["false"]
common = sorted(set(per_step["true"]) & set(per_step["false"]))
slower = sum(per_step["true"][s] > 1.05 * per_step["false"][s] for s in common) / max(1, len(common))
print(f"{corpus:<22} {P:<5} ratio cuts on/off: tokens/s {on['tps'] / off['tps']:.3f}x, step faster {off['step_med'] / on['step_med']:.3f}x (median), {off['step'] / on['step']:.3f}x (mean); "
      f"predicted by the plan {off['crit'] / on['crit']:.3f}x; sync_wait {off['sync']:.3f} -> {on['sync']:.3f}, kv_wait 0 -> {on['kv']:.3f}; "
      f"slower {slower:.0%} of {len(common)} steps")
# The cut-cost check of the runs with cuts (data.cut_cost_check): what it measured, where it
# re-planned, and the steps from the latest switch on, with cuts and without.
checks = []
for rep in range(1, repeats + 1):
    v = json.load(open(f"runs/cut{ci}-{P}-true-{rep}/summary.json"))
    if "cut_cost_check" in v:
        checks.append(v["cut_cost_check"])
if checks:
    ts = ", ".join(f"{c['measured_t']:.3g}" if c["measured"] else "none" for c in checks)
    held = ", ".join("held" if c.get("charge_held", True) else "missed" for c in checks)
    froms = [c["replanned_from_step"] for c in checks]
    line = (f"{corpus:<22} {P:<5} cut-cost check (runs with cuts): measured t = {ts} against the planned "
            f"{checks[0]['planned_t']:.3g} ({held}); re-planned from step {', '.join('-' if f is None else str(f) for f in froms)}")
    if all(f is not None for f in froms):
        after = [s for s in common if s >= max(froms)]
        if after:
            a_on, a_off = med([per_step["true"][s] for s in after]), med([per_step["false"][s] for s in after])
            line += (f"; steps {after[0]}-{after[-1]}: median step {a_on*1e3:.1f} ms with cuts, {a_off*1e3:.1f} ms without "
                     f"({a_off / a_on:.3f}x)")
    print(line)
else:
    print(f"{corpus:<22} {P:<5} cut-cost check (runs with cuts): did not run (data.cut_cost_check = 0, data.cost_t given, or fewer steps than its window)")
PY
    # What the exchange did not hide, as `kilter plan --calibrate` fits it from the first run with
    # cuts (kv_wait per earlier token, in dense tokens), beside the t the plan derived.
    "$KILTER" plan --calibrate "$work/runs/cut$ci-$P-true-1" --skip-steps "$SKIP" --json > "cutfit-$ci-$P.json" 2>/dev/null \
      && "$PY" - "$LENGTHS" "$P" "cutfit-$ci-$P.json" "cutplan-$ci-$P-true.json" <<'PY'
import json, sys
fit, plan = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
measured = "not measured" if fit.get("cost_t") is None else f"{fit['cost_t']:.4g}"
print(f"{sys.argv[1]:<22} {sys.argv[2]:<5} kilter plan --calibrate (first run with cuts): cost_t = {measured}; "
      f"the plan derived t = {plan['cost_t']:.4g}")
PY
    # What `kilter report` tells the user of that run (an advice line only where cuts cost more
    # than the plan charged).
    advice=$("$KILTER" report "$work/runs/cut$ci-$P-true-1" 2>/dev/null | sed -n 's/^  advice: //p')
    printf '%-22s %-5s kilter report (first run with cuts): %s\n' "$LENGTHS" "$P" "${advice:-no advice}"
  done
done
