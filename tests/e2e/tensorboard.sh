#!/usr/bin/env bash
# TensorBoard event files end to end: a 2-rank run of 8 steps (log every 2, evaluation every 4)
# and the same run made in parts: stopped after 6 steps with checkpoints at 3 and 6, its step-6
# checkpoint deleted so the resume starts at 3 and recomputes steps 4-6 that its TensorBoard
# files already hold, then resumed to 8. tensorboard_check.py reads every file back with
# TensorBoard's own reader (PyPI `tensorboard`): each scalar at its step, once, with the value
# train.csv and the rank CSVs hold. Skipped (exit 77) where the reader is not installed.
source "$(dirname "$0")/lib.sh"
TB_PY=${KILTER_PYARROW_PYTHON:-/opt/kilter/pyarrow-venv/bin/python}
"$TB_PY" -c "import tensorboard" 2>/dev/null \
  || { echo "SKIP: no python with the tensorboard package at $TB_PY (scripts/install-deps.sh --with-test-extras)"; exit 77; }

"$KILTER" prep synth --docs 80 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data --quiet >/dev/null
COMMON=(--data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=8 --output.trace_steps=0
        --output.log_every=2 --data.eval_fraction=0.1 --train.eval_every=4 --comm.timeout_s=60)

train straight.log 2 --output.dir=runs/straight
stop_after part1.log 2 6 --output.dir=runs/part --output.checkpoint_every=3
[ -f runs/part/checkpoints/step-00000006.h5 ] || { ls runs/part/checkpoints; fail "part 1 wrote no step-6 checkpoint"; }
rm runs/part/checkpoints/step-00000006.h5
train part2.log 2 --resume runs/part --output.checkpoint_every=3
grep -q "resumed from runs/part/checkpoints/step-00000003.h5" part2.log || { cat part2.log; fail "part 2 did not resume from step 3"; }

# Off: no folder.
train off.log 2 --output.dir=runs/off --output.tensorboard=false
[ ! -e runs/off/tensorboard ] || fail "output.tensorboard=false wrote runs/off/tensorboard"

"$TB_PY" "$SRC/tests/e2e/tensorboard_check.py" runs/straight runs/part 2 8 2 4
echo "tensorboard: 1 passed, 0 failed"
