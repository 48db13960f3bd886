#!/usr/bin/env bash
# bench/plan.sh — the balanced batch plan against the naive sampler, side by side (issue 4).
#
#   bench/plan.sh [KILTER]          KILTER: the kilter binary (default: build/kilter)
#   env: DOCS (synthetic documents per corpus, default 1000000), WORLD_SIZES (default
#        "2 4 8 16 32 64"), MB_PER_RANK (micro-batches per rank per step, default 8),
#        SCALE_DOCS (the planning-cost row, default 10000000; 0 skips it), FORTUNES (default
#        /usr/share/games/fortunes; skipped when absent or when `kilter prep` fails).
#
# For every corpus and world size P it runs `kilter plan --json` twice (balanced, naive) with
#   data.max_tokens      = 4 x model.block_size          (the token budget of a micro-batch)
#   data.naive_batch_size = 4                             (naive: same memory, B x context = budget)
#   train.tokens_per_step = MB_PER_RANK x P x max_tokens  (so 64 ranks still get whole steps)
# and prints padding_efficiency and cost_imbalance_p95 of both plus their ratios. A row passes
# when balanced has padding_efficiency >= 0.95 and cost_imbalance_p95 <= 1.05 (the issue's bar);
# the script exits 1 when a row fails. Never run as a test (it takes minutes).
set -euo pipefail

KILTER=${1:-build/kilter}
DOCS=${DOCS:-1000000}
WORLD_SIZES=${WORLD_SIZES:-"2 4 8 16 32 64"}
MB_PER_RANK=${MB_PER_RANK:-8}
SCALE_DOCS=${SCALE_DOCS:-10000000}
FORTUNES=${FORTUNES:-/usr/share/games/fortunes}
NAIVE_BATCH=4

[[ -x "$KILTER" ]] || { echo "bench/plan.sh: no kilter binary at $KILTER (pass its path)" >&2; exit 2; }
command -v jq >/dev/null || { echo "bench/plan.sh: needs jq" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# plan_json SAMPLER P CONTEXT SOURCE-ARGS... -> one JSON object on stdout
plan_json() {
  local sampler=$1 world=$2 context=$3
  shift 3
  local budget=$((4 * context))
  "$KILTER" plan "$@" --world-size "$world" --sampler "$sampler" --json \
    --model.block_size="$context" --data.max_tokens="$budget" --data.naive_batch_size="$NAIVE_BATCH" \
    --train.tokens_per_step="$((MB_PER_RANK * world * budget))" 2>/dev/null
}

print_header() {
  printf '%-26s %5s %3s %6s %7s | %8s %8s %6s | %8s %8s %6s | %s\n' corpus ctx P steps mb/step \
    pad_bal pad_nai ratio imb95_bal imb95_nai ratio check
}

# row LABEL CONTEXT SOURCE-ARGS...: one line per world size
rows() {
  local label=$1 context=$2
  shift 2
  for world in $WORLD_SIZES; do
    local b n
    b=$(plan_json balanced "$world" "$context" "$@")
    n=$(plan_json naive "$world" "$context" "$@")
    local line
    line=$(jq -nr --argjson b "$b" --argjson n "$n" --arg name "$label" --arg ctx "$context" --arg p "$world" '
      def f: . * 10000 | round / 10000;
      ($b.padding_efficiency >= 0.95 and $b.cost_imbalance_p95 <= 1.05) as $ok
      | [$name, $ctx, $p, ($b.steps_per_epoch|tostring), ($b.micro_batches_per_step*10|round/10|tostring),
         ($b.padding_efficiency|f|tostring), ($n.padding_efficiency|f|tostring),
         ($b.padding_efficiency/$n.padding_efficiency*100|round/100|tostring),
         ($b.cost_imbalance_p95|f|tostring), ($n.cost_imbalance_p95|f|tostring),
         ($n.cost_imbalance_p95/$b.cost_imbalance_p95*100|round/100|tostring),
         (if $ok then "pass" else "FAIL" end)] | @tsv')
    IFS=$'\t' read -r c1 c2 c3 c4 c5 c6 c7 c8 c9 c10 c11 c12 <<<"$line"
    printf '%-26s %5s %3s %6s %7s | %8s %8s %6s | %8s %8s %6s | %s\n' \
      "$c1" "$c2" "$c3" "$c4" "$c5" "$c6" "$c7" "${c8}x" "$c9" "$c10" "${c11}x" "$c12"
    [[ $c12 == pass ]] || failures=$((failures + 1))
  done
}

echo "kilter plan: balanced vs naive; max_tokens = 4 x ctx, naive $NAIVE_BATCH sequences/rank/micro-batch,"
echo "tokens_per_step = $MB_PER_RANK x P x max_tokens; $DOCS synthetic documents per corpus"
echo "(ratios: padding efficiency balanced/naive; cost imbalance p95 naive/balanced, i.e. how much longer"
echo " the slowest rank's compute takes under naive than under balanced at the same mean)"
print_header
rows "lognormal:4,1.5 (short)" 512 --lengths lognormal:4,1.5 --docs "$DOCS" --seed 1
rows "lognormal:5,1" 1024 --lengths lognormal:5,1 --docs "$DOCS" --seed 2
rows "lognormal:6,1" 2048 --lengths lognormal:6,1 --docs "$DOCS" --seed 3
rows "lognormal:7,0.5 (long)" 2048 --lengths lognormal:7,0.5 --docs "$DOCS" --seed 4
rows "uniform:16,2048" 2048 --lengths uniform:16,2048 --docs "$DOCS" --seed 5

if [[ -d $FORTUNES ]]; then
  if "$KILTER" prep --input "$FORTUNES" --format fortune --shards 2 --out "$work/fortunes" >"$work/prep.log" 2>&1; then
    docs=$("$KILTER" plan --data "$work/fortunes" --world-size 1 --json 2>/dev/null | jq .documents)
    echo
    echo "fortunes corpus ($FORTUNES, $docs documents, byte tokens):"
    print_header
    rows "fortunes" 128 --data "$work/fortunes"
  else
    echo
    echo "fortunes: skipped, \`kilter prep --format fortune\` failed: $(tail -1 "$work/prep.log")"
  fi
else
  echo
  echo "fortunes: skipped, $FORTUNES does not exist (synthetic corpora only)"
fi

if [[ $SCALE_DOCS -gt 0 ]]; then
  echo
  echo "planning cost: $SCALE_DOCS documents, lognormal:5,1.2, ctx 1024, P=64"
  out=$(/usr/bin/time -f '%M' -o "$work/rss" "$KILTER" plan --lengths lognormal:5,1.2 --docs "$SCALE_DOCS" \
    --world-size 64 --model.block_size=1024 --data.max_tokens=4096 \
    --train.tokens_per_step=$((MB_PER_RANK * 64 * 4096)) --json 2>/dev/null)
  jq -r --arg rss "$(tail -1 "$work/rss")" '"  build \(.plan_build_seconds*100|round/100) s wall, \(.plan_build_cpu_seconds*100|round/100) s CPU; " +
    "\(.bytes_per_doc*10|round/10) bytes/doc held (lengths + ids + plan), peak +\(.peak_extra_bytes_per_doc*10|round/10) bytes/doc while planning; " +
    "process peak RSS \($rss|tonumber/1024|round) MiB; padding \(.padding_efficiency*10000|round/10000), imbalance p95 \(.cost_imbalance_p95*10000|round/10000)"' <<<"$out"
fi

echo
if [[ $failures -eq 0 ]]; then echo "all rows pass (padding_efficiency >= 0.95, cost_imbalance_p95 <= 1.05)"; else echo "$failures rows FAIL"; exit 1; fi
