#!/usr/bin/env bash
# bench/calibrate.sh — the plan's cost model fitted to a real run (issue 13): trains one rank on a
# corpus with varied lengths, with steps of one context in micro-batches of one context: a step
# holds 1-2 contexts of tokens in 1-2 micro-batches, so tokens, attention work (sum of L^2) and
# micro-batches all vary from step to step (with larger steps a rank's tokens hardly vary and the
# fit sees mostly noise: R^2 0.43 at 6144-token steps in 4096-token micro-batches). Then `kilter plan --calibrate` fits forward + backward = a·tokens + b·attn_work +
# c·micro_batches + d over its rank-steps and prints a, b, c, d, R^2, the config lines, and what
# the model shape alone gives for b (data.cost_b < 0, attention_cost_coefficient) next to the fit.
# Run it on a quiet machine (the fit measures time): the issue asks R^2 >= 0.9.
#
#   bench/calibrate.sh [KILTER]      KILTER: the kilter binary (default: build/kilter)
#   env: STEPS (default 200), LENGTHS (default lognormal:5.5,1.2,1024), DOCS (default 3000),
#        CONTEXT (default 1024), MAX_TOKENS (default = CONTEXT), STEP_TOKENS (train.tokens_per_step,
#        default = CONTEXT), LAYERS (4), EMBD (128), SKIP (warm-up steps left out of the fit,
#        default 3)
# Never run as a test (a timing fit; minutes).
set -euo pipefail

KILTER=$(readlink -f "${1:-build/kilter}")
STEPS=${STEPS:-200}
LENGTHS=${LENGTHS:-lognormal:5.5,1.2,1024}
DOCS=${DOCS:-3000}
CONTEXT=${CONTEXT:-1024}
MAX_TOKENS=${MAX_TOKENS:-$CONTEXT}
STEP_TOKENS=${STEP_TOKENS:-$CONTEXT}
LAYERS=${LAYERS:-4}
EMBD=${EMBD:-128}
SKIP=${SKIP:-3}
[[ -x "$KILTER" ]] || { echo "bench/calibrate.sh: no kilter binary at $KILTER (pass its path)" >&2; exit 2; }
command -v jq >/dev/null || { echo "bench/calibrate.sh: needs jq" >&2; exit 2; }
work=$(mktemp -d /tmp/kilter-calibrate.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

model=(--model.n_layer="$LAYERS" --model.n_head=4 --model.n_embd="$EMBD" --model.block_size="$CONTEXT")
"$KILTER" prep synth --docs "$DOCS" --lengths "$LENGTHS" --vocab 256 --shards 2 --seed 5 --out data > /dev/null 2>&1
# One rank, pinned to a core where the machine allows it.
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
"${pin[@]}" "$KILTER" train --data.dir=data "${model[@]}" --data.max_tokens="$MAX_TOKENS" \
  --train.tokens_per_step="$STEP_TOKENS" --train.steps="$STEPS" --train.warmup=5 --train.threads=1 \
  --output.log_every=1000 --output.trace_steps=0 --output.dir=run > train.log 2>&1 \
  || { tail -20 train.log; echo "bench/calibrate.sh: the training run failed" >&2; exit 1; }
fit=$("$KILTER" plan --calibrate run --skip-steps "$SKIP" --json)
shape=$("$KILTER" plan --data data --world-size 1 "${model[@]}" --data.max_tokens="$MAX_TOKENS" \
  --train.tokens_per_step="$STEP_TOKENS" --json 2>/dev/null)
echo "# calibrate: $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg); $LENGTHS, context $CONTEXT," \
  "max_tokens $MAX_TOKENS, step $STEP_TOKENS tokens, model ${LAYERS} x ${EMBD}, $STEPS steps, 1 rank"
jq -r --argjson shape "$shape" '
  "fit over \(.samples) rank-steps: a = \(.a_seconds_per_token) s/token, b = \(.b_seconds_per_l2) s/(L^2)," +
    " c = \(.c_seconds_per_micro_batch) s/micro-batch, d = \(.intercept_seconds) s/rank-step" +
    (if .c_from_intercept then " (c from d: micro-batches did not vary)" else "" end),
  "R^2 = \(.r2)   (issue 13 asks >= 0.9)",
  "as config: data.cost_a = 1, data.cost_b = \(.cost_b), data.cost_c = \(.cost_c)",
  "from the model shape alone (the defaults): data.cost_b = \($shape.cost_b), data.cost_c = \($shape.cost_c)",
  (if .r2 >= 0.9 then "R^2 check: pass" else "R^2 check: below 0.9" end)' <<<"$fit"
