#!/usr/bin/env bash
# bench/replan_cost.sh — what a re-plan of the in-run calibration costs (issue 39), on the shapes
# of the issue: the P = 1024 planning-cost row of bench/plan.sh, GPT-2 124M at P = 1024 (the shape,
# context and step of inputs/gpt2-124m.ini, bf16 on a GPU), and the Llama-3-8B shape at P = 8192
# (the hidden scale case). For each, `kilter plan --json` resolves the cost model (b, c, t) and kilter_bench_replan times, in CPU seconds of its
# thread, what the training thread of rank 0 does per step (taking every rank's record into the
# window) and at the hand-over, and what the background thread does (the window's fit, the epoch's
# plan with the fitted model, the comparison on 32 steps; docs/plan.md, "In-run calibration"), and
# the same hand-over and fit for the largest window a run keeps (320 steps x P ranks).
# The GPT-2 row sets the training thread's share beside one step of inputs/gpt2-124m.ini on the
# GPU figures of docs/gpu.md (bf16, 136,984 tokens/s per H200 as kilter measured it; also at
# torch.compile's 466,103 tokens/s on that GPU, the speed issue 37 aims for): 524288 tokens over P GPUs.
#   bench/replan_cost.sh [BUILD_DIR]    (default build: kilter and kilter_bench_replan)
#   env: SHAPES (default "p1024 gpt2 llama8192")
# Never run as a test (minutes of CPU; the Llama row plans 3 million documents twice).
set -euo pipefail
BUILD=$(readlink -f "${1:-build}")
KILTER=$BUILD/kilter
BENCH=$BUILD/kilter_bench_replan
SHAPES=${SHAPES:-"p1024 gpt2 llama8192"}
[[ -x $KILTER && -x $BENCH ]] || { echo "bench/replan_cost.sh: build kilter and kilter_bench_replan in $BUILD" >&2; exit 2; }
GPU_TOKENS_PER_SECOND=136984  # GPT-2 124M, bf16, one H200, kilter (docs/gpu.md, bench/gpu_step.sh)
GPU_TOKENS_TARGET=466103      # the same on torch.compile, same GPU (docs/gpu.md)

row() {  # row NAME LENGTHS DOCS P CONTEXT MAX_TOKENS STEP_TOKENS [kilter plan options...]
  local name=$1 lengths=$2 docs=$3 P=$4 ctx=$5 max=$6 step=$7
  shift 7
  local plan
  plan=$("$KILTER" plan --lengths "$lengths" --docs "$docs" --seed 5 --world-size "$P" --model.block_size="$ctx" \
    --data.max_tokens="$max" --train.tokens_per_step="$step" "$@" --json 2>/dev/null)
  local b c t
  read -r b c t < <(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["cost_b"], j["cost_c"], j["cost_t"])' "$plan")
  local out
  out=$("$BENCH" --lengths "$lengths" --docs "$docs" --world-size "$P" --context "$ctx" --max-tokens "$max" \
    --tokens-per-step "$step" --cost-b "$b" --cost-c "$c" --cost-t "$t")
  python3 - "$name" "$out" "$plan" "$step" "$GPU_TOKENS_PER_SECOND" "$GPU_TOKENS_TARGET" <<'PY'
import json, sys
name, r, plan, step_tokens = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
P = r["world_size"]
loop = r["records_per_step_seconds"]
print(f"{name:<10} P={P:<5} {r['steps']:>5} steps/epoch | training thread: {loop * 1e3:8.3f} ms per step (records), "
      f"{r['handover_seconds'] * 1e3:6.3f} ms at the hand-over | background: fit {r['fit_seconds']:.3f} s "
      f"({r['fit_rows']} rows), re-plan {r['replan_seconds']:.2f} s ({r['replan_seconds_per_step'] * 1e3:.2f} ms per step), "
      f"compare {r['compare_seconds']:.3f} s ({r['compared_steps']} steps) | kilter plan: {plan['plan_build_cpu_seconds']:.2f} s CPU")
print(f"{'':<10} the largest window ({r['full_window_steps']} steps, {r['full_fit_rows']} rows): hand-over "
      f"{r['full_handover_seconds'] * 1e3:.3f} ms on the training thread, fit {r['full_fit_seconds']:.2f} s in the background")
for gpu in map(float, sys.argv[5:7]) if name == "gpt2" else ():
    step = step_tokens / (P * gpu)
    print(f"{'':<10} one step of inputs/gpt2-124m.ini on {P} H200s (bf16, {gpu:.0f} tokens/s each): {step * 1e3:.2f} ms; "
          f"the training thread's share per step {100 * loop / step:.2f}% (issue 39 asks < 10%), the hand-over "
          f"{100 * r['handover_seconds'] / step:.2f}%; the background thread's whole re-plan {r['replan_seconds'] / step:.0f} steps long")
PY
}

echo "# replan_cost: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
for shape in $SHAPES; do
  case $shape in
    p1024) row p1024 lognormal:5.5,1.3 10000000 1024 2048 16384 4194304 ;;
    gpt2) row gpt2 lognormal:5.5,1.3 ${GPT2_DOCS:-2000000} 1024 1024 16384 524288 --model.n_layer=12 --model.n_head=12 \
      --model.n_embd=768 --model.vocab_size=50257 --train.precision=bf16 --train.backend=cuda --comm.device_tflops=400 ;;
    llama8192) row llama8192 lognormal:6,1.5 3000000 8192 8192 8192 16777216 --model.arch=llama --model.n_layer=32 \
      --model.n_head=32 --model.n_kv_head=8 --model.n_embd=4096 --model.ffn_hidden=14336 --model.vocab_size=128256 \
      --train.precision=bf16 --comm.device_tflops=400 ;;
    *) echo "bench/replan_cost.sh: unknown shape $shape" >&2; exit 2 ;;
  esac
done
