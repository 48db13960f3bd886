#!/usr/bin/env bash
# `kilter plan` on a prepared dataset: --json prints one object with the docs/design.md statistics;
# the balanced (packed) plan computes no padding and beats the naive one on the critical path;
# the human summary prints; a step too small for the world size is warned about with the step
# that avoids it; steps too coarse to balance are warned about (with cut pieces: what the cuts got
# and their charge t); bad keys and bad values are refused naming the key; --calibrate fits a, b, c.
source "$(dirname "$0")/lib.sh"

"$KILTER" prep synth --docs 3000 --lengths lognormal:5,1.0,2048 --vocab 257 --shards 2 --seed 3 --out data 2>/dev/null
"$KILTER" plan --data data --world-size 8 --model.block_size=512 --data.max_tokens=2048 \
  --train.tokens_per_step=131072 --json > balanced.json
"$KILTER" plan --data data --world-size 8 --model.block_size=512 --data.max_tokens=2048 \
  --train.tokens_per_step=131072 --sampler naive --json > naive.json
"$KILTER" plan --data data --world-size 8 > human.txt
grep -q "padding" human.txt || fail "human summary lacks padding efficiency"
grep -q "idle" human.txt || fail "human summary lacks the idle figures"
if "$KILTER" plan --data data --world-size 8 --data.max_tokenz=5 2> bad.txt; then fail "unknown key accepted"; fi
grep -q "max_tokenz" bad.txt || fail "error does not name the unknown key: $(cat bad.txt)"
# A context longer than a micro-batch: pieces are cut over ranks (context parallelism); too few
# ranks to hold the longest piece are refused, naming the keys and the smallest world size.
if "$KILTER" plan --data data --world-size 1 --model.block_size=1024 --data.max_tokens=512 2> bad.txt; then
  fail "a piece needing 2 ranks planned on 1"; fi
grep -q "data.max_tokens" bad.txt || fail "error does not name data.max_tokens: $(cat bad.txt)"
grep -q ">= 2 ranks" bad.txt || fail "error does not name the smallest world size: $(cat bad.txt)"
"$KILTER" plan --data data --world-size 4 --model.block_size=1024 --data.max_tokens=512 \
  --train.tokens_per_step=16384 --json > long.json
"$KILTER" plan --data data --world-size 4 --model.block_size=1024 --data.max_tokens=512 \
  --train.tokens_per_step=16384 > long.txt
grep -q "context parallelism" long.txt || fail "the summary does not say how many ranks long pieces span: $(cat long.txt)"
# Coarse steps (a quarter context per rank): cut pieces on and off.
for cut in true false; do
  "$KILTER" plan --data data --world-size 64 --model.block_size=512 --data.max_tokens=2048 \
    --train.tokens_per_step=8192 --data.cut_pieces=$cut --data.cost_t=0.05 --json > cut-$cut.json 2>/dev/null
done
# Cuts too dear to even the steps out: the too-coarse warning quotes what the cuts got, and t.
"$KILTER" plan --data data --world-size 64 --model.block_size=512 --data.max_tokens=2048 \
  --train.tokens_per_step=8192 --data.cut_pieces=true --data.cost_t=50 --json > cut-dear.json 2>/dev/null
if "$KILTER" plan --data data --world-size 8 --train.tokens_per_step=0 2> bad.txt; then fail "a zero step accepted"; fi
grep -q "train.tokens_per_step" bad.txt || fail "error does not name train.tokens_per_step: $(cat bad.txt)"

# 16 ranks x 512-token context need steps of >= 8192 tokens; 4096 leaves ranks idle where pieces
# are not cut (with cuts at the CPU backend's transfer cost every rank gets a share).
"$KILTER" plan --data data --world-size 16 --model.block_size=512 --data.max_tokens=2048 \
  --train.tokens_per_step=4096 --data.cut_pieces=false --json > idle.json 2> idle.err
grep -q "8192" idle.err || fail "the idle-rank warning does not name the step size that avoids it: $(cat idle.err)"

# Calibration on a synthetic run directory: times = 2e-6 T + 3e-9 W + 1e-3 M.
mkdir -p run/metrics
"$PY" - <<'PY'
import random
random.seed(5)
with open("run/metrics/rank-00000.csv", "w") as f:
    f.write("step,tokens,loss,forward,backward,tokens_computed,attn_work,micro_batches\n")
    for step in range(40):
        lens = [random.randint(1, 512) for _ in range(random.randint(1, 40))]
        t, w, m = sum(lens), sum(l * l for l in lens), random.randint(1, 4)
        s = 2e-6 * t + 3e-9 * w + 1e-3 * m
        f.write(f"{step},{t},3.0,{s / 3},{2 * s / 3},{t},{w},{m}\n")
PY
"$KILTER" plan --calibrate run --json > fit.json

"$PY" - <<'PY'
import json
b, n = json.load(open("balanced.json")), json.load(open("naive.json"))
for k in ["padding_efficiency", "cost_imbalance_p50", "cost_imbalance_p95", "cost_imbalance_max",
          "steps_per_epoch", "micro_batches_per_step", "idle_rank_steps", "cost_imbalance_bound_p95",
          "critical_cost_per_token", "cost_c"]:
    assert k in b and k in n, k
print("balanced", b["padding_efficiency"], b["cost_imbalance_p95"], "naive", n["padding_efficiency"], n["cost_imbalance_p95"])
assert b["padding_efficiency"] == 1.0, b["padding_efficiency"]
assert b["cost_imbalance_p95"] <= 1.02, b["cost_imbalance_p95"]
assert n["padding_efficiency"] < b["padding_efficiency"]
assert b["critical_cost_per_token"] < n["critical_cost_per_token"]
for k in ["cuts_per_step_p50", "cuts_per_step_max", "kv_bytes_per_step_p50", "kv_bytes_per_step_max",
          "kv_bytes_per_rank_max", "cost_imbalance_uncut_p50", "cost_imbalance_uncut_p95", "cost_imbalance_uncut_max",
          "long_pieces", "long_piece_ranks_max", "cut_pieces", "cost_t", "cut_pieces_enabled", "kv_bytes_per_token"]:
    assert k in b, k
assert b["cost_t"] > 0 and b["kv_bytes_per_token"] > 0, b
longp = json.load(open("long.json"))
assert longp["long_pieces"] > 0 and longp["long_piece_ranks_max"] == 2, longp
assert longp["cuts"] > 0 and longp["cut_piece_ranks_max"] >= 2, longp
on, off = json.load(open("cut-true.json")), json.load(open("cut-false.json"))
assert on["cuts_per_step_max"] <= 2 * 63 and on["cuts_per_step_p50"] > 0, on
assert off["cuts"] == 0 and off["kv_bytes_per_step_max"] == 0, off
assert on["cost_imbalance_p95"] < off["cost_imbalance_p95"], (on["cost_imbalance_p95"], off["cost_imbalance_p95"])
assert abs(on["cost_imbalance_uncut_p95"] - off["cost_imbalance_p95"]) < 1e-9
assert on["cost_imbalance_bound_p95"] > 0 and on["kv_bytes_per_rank_max"] > 0
coarse = [w for w in off["warnings"] if "too coarse" in w]
assert coarse and "no division of their pieces" in coarse[0] and "data.cut_pieces = true" in coarse[0], off["warnings"]
dear = json.load(open("cut-dear.json"))
coarse = [w for w in dear["warnings"] if "too coarse" in w]
assert dear["cost_imbalance_p95"] > 1.02 and coarse, dear
assert "with cut pieces the plan gets cost_imbalance_p95 %.3f" % dear["cost_imbalance_p95"] in coarse[0], coarse
assert "t = 50 per earlier token" in coarse[0] and "no division" not in coarse[0], coarse
idle = json.load(open("idle.json"))
assert idle["idle_rank_steps"] > 0 and idle["warnings"], idle
fit = json.load(open("fit.json"))
assert abs(fit["cost_b"] / 1.5e-3 - 1) < 1e-3 and abs(fit["cost_c"] / 500 - 1) < 1e-3, fit
assert fit["r2"] > 0.999, fit
assert fit["cost_t"] is None, fit  # no kv_wait column: the derived t stays
print("plan_cli: 1 passed, 0 failed")
PY
