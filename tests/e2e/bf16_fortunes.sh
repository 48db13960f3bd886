#!/usr/bin/env bash
# e2e (issue 16): train.precision=bf16 on the CPU backend tracks fp32 over a real training run.
# The same small byte-level GPT trains 300 steps on Debian's fortunes on 2 ranks, once in fp32
# and once in bf16; the mean loss of the last 20 steps must agree within 2% (both runs see the
# same batches), the 20-step moving mean of the loss within 5% of fp32's all along (single steps
# may spike differently), and the bf16 run's summary must
# name its precision. A second bf16 run must give bit-identical losses (determinism). Skips
# (exit 77) where the CPU has no bf16 instructions and kilter refuses the key.
source "$(dirname "$0")/lib.sh"
FORTUNES=${KILTER_FORTUNES:-/usr/share/games/fortunes}
[[ -d $FORTUNES ]] || fail "$FORTUNES is missing (scripts/install-deps.sh installs the fortunes packages)"

"$KILTER" prep --input "$FORTUNES" --format fortune --shards 2 --out data > prep.log 2>&1 || { cat prep.log; fail "prep failed"; }
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=4 --model.n_embd=96 --model.block_size=128
        --data.max_tokens=1024 --data.eval_fraction=0 --train.tokens_per_step=4096
        --train.warmup=20 --train.lr=3e-3 --train.threads=1 --output.log_every=50 --output.checkpoint_every=0)

if ! "${MPIRUN[@]}" -np 1 "$KILTER" train "${COMMON[@]}" --train.steps=1 --train.precision=bf16 \
     --output.dir=runs/probe > probe.log 2>&1; then
  if grep -q "train.precision=bf16 needs bf16 GEMM instructions" probe.log; then
    echo "SKIPPED: $(grep -m1 -o 'this CPU.*' probe.log)"
    exit 77
  fi
  cat probe.log
  fail "the bf16 probe run failed"
fi

train fp32.log 2 --train.steps=300 --data.cost_calibration=off --train.precision=fp32 --output.dir=runs/fp32
train bf16.log 2 --train.steps=300 --data.cost_calibration=off --train.precision=bf16 --output.dir=runs/bf16
train bf16b.log 2 --train.steps=300 --data.cost_calibration=off --train.precision=bf16 --output.dir=runs/bf16b

"$PY" - <<'PY'
import csv, json
import numpy as np

def losses(run):
    with open(f"runs/{run}/metrics/rank-00000.csv") as f:
        return np.array([float(r["loss"]) for r in csv.DictReader(f)])

fp32, bf16, again = losses("fp32"), losses("bf16"), losses("bf16b")
assert len(fp32) == len(bf16) == 300, (len(fp32), len(bf16))
assert (bf16 == again).all(), "bf16 training is not bit-identical run to run"
assert fp32[-1] < fp32[0] - 2.0, f"fp32 did not learn: {fp32[0]} -> {fp32[-1]}"
final32, final16 = fp32[-20:].mean(), bf16[-20:].mean()
rel = abs(final16 - final32) / final32
smooth = lambda x: np.convolve(x, np.ones(20) / 20, mode="valid")
step_rel = np.max(np.abs(smooth(bf16) - smooth(fp32)) / smooth(fp32))
print(f"final loss (mean of the last 20 steps): fp32 {final32:.4f}, bf16 {final16:.4f}, "
      f"relative difference {rel:.4f}; largest difference of the 20-step moving means {step_rel:.4f}")
assert rel < 0.02, f"bf16 final loss {final16} is not within 2% of fp32's {final32}"
assert step_rel < 0.05, f"the bf16 loss curve (20-step moving mean) departs from fp32's by {step_rel:.3f}"
assert not (bf16 == fp32).all(), "bf16 and fp32 losses are identical: bf16 did not run"
detail = json.load(open("runs/bf16/summary.json"))["backend_detail"]
assert "bf16" in detail, detail
print("bf16_fortunes: 1 passed, 0 failed")
PY
