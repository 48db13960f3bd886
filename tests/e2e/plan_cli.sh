#!/usr/bin/env bash
# `kilter plan` on a prepared dataset: --json prints one object with the DESIGN.md statistics;
# the balanced plan beats the naive one on padding; the human summary prints; a bad key is refused.
source "$(dirname "$0")/lib.sh"

"$KILTER" prep synth --docs 3000 --lengths lognormal:5,1.0,2048 --vocab 257 --shards 2 --seed 3 --out data 2>/dev/null
"$KILTER" plan --data data --world-size 8 --model.block_size=512 --data.max_tokens=2048 \
  --train.tokens_per_step=131072 --json > balanced.json
"$KILTER" plan --data data --world-size 8 --model.block_size=512 --data.max_tokens=2048 \
  --train.tokens_per_step=131072 --sampler naive --json > naive.json
"$KILTER" plan --data data --world-size 8 > human.txt
grep -q "padding" human.txt || fail "human summary lacks padding efficiency"
if "$KILTER" plan --data data --world-size 8 --data.max_tokenz=5 2> bad.txt; then fail "unknown key accepted"; fi
grep -q "max_tokenz" bad.txt || fail "error does not name the unknown key: $(cat bad.txt)"

"$PY" - <<'PY'
import json
b, n = json.load(open("balanced.json")), json.load(open("naive.json"))
for k in ["padding_efficiency", "cost_imbalance_p50", "cost_imbalance_p95", "cost_imbalance_max",
          "steps_per_epoch", "micro_batches_per_step"]:
    assert k in b and k in n, k
print("balanced", b["padding_efficiency"], b["cost_imbalance_p95"], "naive", n["padding_efficiency"], n["cost_imbalance_p95"])
assert b["padding_efficiency"] >= 0.95, b["padding_efficiency"]
assert b["cost_imbalance_p95"] <= 1.05, b["cost_imbalance_p95"]
assert n["padding_efficiency"] < b["padding_efficiency"]
print("plan_cli: 1 passed, 0 failed")
PY
