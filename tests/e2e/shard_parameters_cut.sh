#!/usr/bin/env bash
# Fully sharded parameters (train.shard = parameters) with what runs beside the unit gathers:
# - pieces cut between ranks (context parallelism: a context of 128 over micro-batches of 64
#   tokens, the later parts' K/V exchanged point to point while every rank gathers the same
#   units in the same order): gpt2 and llama on 2 and 4 ranks, the losses of 8 steps equal
#   train.shard = none's within 1e-6 relative (the script prints whether bit for bit);
# - training samples (output.sample_every): every rank of the shard group sends its chunk of each
#   unit to rank 0, which generates one unit at a time: the sample text equals none's, greedy and
#   at temperature 1, and under groups of 2 (HSDP) on 4 ranks;
# - the gradient reduce-scatter in pieces (many per unit): the losses equal none's within 1e-6.
source "$(dirname "$0")/lib.sh"
json_get() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 400 --lengths lognormal:4.5,0.9,400 --vocab 97 --shards 2 --seed 5 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=4 --model.n_embd=32 --train.steps=8 --train.warmup=2
        --train.lr=3e-3 --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60
        --data.cost_calibration=off --train.recompute=block)
CUT=(--model.block_size=128 --data.max_tokens=64 --train.tokens_per_step=384 --data.cut_pieces=true)
LLAMA=(--model.arch=llama --model.n_kv_head=2 --model.ffn_hidden=80 --model.tie_embeddings=false)

for np in 2 4; do
  train cut-gpt2-$np-n.log $np --output.dir=runs/cut-gpt2-$np-n --train.shard=none "${CUT[@]}"
  train cut-gpt2-$np-p.log $np --output.dir=runs/cut-gpt2-$np-p --train.shard=parameters "${CUT[@]}"
  train cut-llama-$np-n.log $np --output.dir=runs/cut-llama-$np-n --train.shard=none "${CUT[@]}" "${LLAMA[@]}"
  train cut-llama-$np-p.log $np --output.dir=runs/cut-llama-$np-p --train.shard=parameters "${CUT[@]}" "${LLAMA[@]}"
done

# The gradient reduce-scatter in pieces of 64 floats per rank (the test hook; a unit here is one
# piece otherwise): the same losses as none's.
KILTER_TEST_REDUCE_SCATTER_PIECE=64 timeout 300 "${MPIRUN[@]}" -np 4 -x KILTER_TEST_REDUCE_SCATTER_PIECE "$KILTER" train \
  "${COMMON[@]}" "${CUT[@]}" --output.dir=runs/cut-gpt2-4-pieces --train.shard=parameters > pieces.log 2>&1 \
  || { cat pieces.log; fail "pieces.log: kilter train failed"; }

# Samples every 2 steps, greedy and at temperature 1; an untied head (llama) too.
WHOLE=(--model.block_size=64 --data.max_tokens=256 --train.tokens_per_step=1024 --output.sample_every=2
       --output.sample_tokens=24)
train s-n.log 4 --output.dir=runs/s-n --train.shard=none "${WHOLE[@]}" --output.sample_temperature=0
train s-p.log 4 --output.dir=runs/s-p --train.shard=parameters "${WHOLE[@]}" --output.sample_temperature=0
train t-n.log 4 --output.dir=runs/t-n --train.shard=none "${WHOLE[@]}" --output.sample_temperature=1
train t-p.log 4 --output.dir=runs/t-p --train.shard=parameters "${WHOLE[@]}" --output.sample_temperature=1
train t-h.log 4 --output.dir=runs/t-h --train.shard=parameters "${WHOLE[@]}" --output.sample_temperature=1 \
  --train.shard_group=2 --comm.ranks_per_node=2
train l-n.log 2 --output.dir=runs/l-n --train.shard=none "${WHOLE[@]}" "${LLAMA[@]}" --output.sample_temperature=1
train l-p.log 2 --output.dir=runs/l-p --train.shard=parameters "${WHOLE[@]}" "${LLAMA[@]}" --output.sample_temperature=1
for pair in "s-n s-p" "t-n t-p" "t-n t-h" "l-n l-p"; do
  set -- $pair
  grep "^sample at step" $1.log > $1.samples || true
  grep "^sample at step" $2.log > $2.samples || true
  [ "$(wc -l < $1.samples)" -eq 4 ] || { cat $1.log; fail "$1: expected 4 samples, got $(wc -l < $1.samples)"; }
  cmp -s $1.samples $2.samples || { diff $1.samples $2.samples; fail "samples of $2 differ from $1's"; }
done
echo "samples under parameters equal none's: $(head -c 120 t-p.samples)"

"$PY" - "$SRC/tests/python" <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses

for arch in ["gpt2", "llama"]:
    for np_ in [2, 4]:
        a, b = losses(f"cut-{arch}-{np_}-n"), losses(f"cut-{arch}-{np_}-p")
        assert len(a) == len(b) == 8, (arch, np_, len(a), len(b))
        rel = float(np.max(np.abs(a - b) / np.abs(a)))
        same = "bit for bit" if np.array_equal(a, b) else "not bit for bit"
        print(f"cut pieces, {arch}, {np_} ranks: parameters vs none, max relative loss difference {rel:.2e} ({same})")
        assert rel < 1e-6, (arch, np_, rel)
a, b = losses("cut-gpt2-4-n"), losses("cut-gpt2-4-pieces")
rel = float(np.max(np.abs(a - b) / np.abs(a)))
print(f"reduce-scatter in pieces of 64 floats: parameters vs none, max relative loss difference {rel:.2e}")
assert len(b) == 8 and rel < 1e-6, rel
PY
[ "$(json_get runs/cut-gpt2-4-p/summary.json 'd["plan_kv_bytes_per_step_max"] > 0')" = True ] \
  || fail "the cut runs cut no piece (summary.json: plan_kv_bytes_per_step_max is 0)"
echo "shard_parameters_cut: 1 passed, 0 failed"
