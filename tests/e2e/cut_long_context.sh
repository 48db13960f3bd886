#!/usr/bin/env bash
# Contexts longer than a micro-batch (issue 23, context parallelism): model.block_size 1024 with
# data.max_tokens 256 cuts every piece longer than 256 tokens into a chain of parts on up to 4
# ranks. On 4 ranks (and on 4 as 2 nodes x 2, and with data.cut_pieces = false, which still cuts
# those long pieces) the losses equal those of 1 rank with data.max_tokens 1024 within 1e-5
# relative, and so do the eval losses (evaluation keeps pieces whole, in micro-batches of a
# whole context: it runs forward only). `kilter plan` says how many ranks such pieces span; 2 ranks are refused with a
# message that names the ranks needed.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 200 --lengths lognormal:6.5,0.6,1024 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=1024
        --train.tokens_per_step=2048 --train.steps=4 --train.warmup=2 --train.lr=3e-3 --output.log_every=1
        --output.trace_steps=0 --comm.device_tflops=0.1 --comm.timeout_s=60 --data.eval_fraction=0.1
        --train.eval_every=2)

"$KILTER" plan "${COMMON[@]}" --data.max_tokens=256 --world-size 4 > plan4.txt 2>&1
grep -q "context parallelism: .* pieces longer than data.max_tokens = 256, each cut over up to 4 ranks" plan4.txt \
  || { cat plan4.txt; fail "kilter plan does not say that long pieces span 4 ranks"; }

train l1.log 1 --output.dir=runs/l1 --data.max_tokens=1024
train l4.log 4 --output.dir=runs/l4 --data.max_tokens=256
train l4h.log 4 --output.dir=runs/l4h --data.max_tokens=256 --comm.ranks_per_node=2 --comm.algo=hierarchical
train l4w.log 4 --output.dir=runs/l4w --data.max_tokens=256 --data.cut_pieces=false
grep -q "pieces longer than data.max_tokens span up to 4 ranks" l4.log || { cat l4.log; fail "the run does not say that long pieces span 4 ranks"; }

rc=0
timeout 120 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" --data.max_tokens=256 --output.dir=runs/l2 > l2.log 2>&1 || rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat l2.log; fail "2 ranks for pieces that need 4: exit code $rc"; }
grep -q "such a piece is cut over 4 ranks, more than the world size 2; run on >= 4 ranks" l2.log \
  || { cat l2.log; fail "2 ranks for pieces that need 4: no message naming the ranks needed"; }

"$PY" - "$SRC/tests/python" <<'PY'
import csv, glob, json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses

ref = losses("l1")
ref_eval = json.load(open("runs/l1/summary.json"))["eval_loss"]
assert ref_eval is not None and np.isfinite(ref_eval), ref_eval
assert len(ref) == 4 and np.isfinite(ref).all(), ref
for run in ["l4", "l4h", "l4w"]:
    summary = json.load(open(f"runs/{run}/summary.json"))
    kv = 0.0
    for name in glob.glob(f"runs/{run}/metrics/rank-*.csv"):
        with open(name) as f:
            kv += sum(float(r["kv_tokens"]) for r in csv.DictReader(f))
    assert summary["long_piece_ranks_max"] == 4 and kv > 0, (run, summary["long_piece_ranks_max"], kv)
    l = losses(run)
    rel = np.max(np.abs(l - ref) / np.abs(ref))
    print(f"{run}: {kv:.0f} earlier tokens' K/V received; max relative loss difference to 1 rank {rel:.2e}")
    assert len(l) == 4 and rel < 1e-5, f"{run}: losses differ from 1 rank by {rel}"
    ev = summary["eval_loss"]
    assert ev is not None and abs(ev - ref_eval) / ref_eval < 1e-5, f"{run}: eval loss {ev} vs {ref_eval} on 1 rank"
PY
echo "cut_long_context: 1 passed, 0 failed"
