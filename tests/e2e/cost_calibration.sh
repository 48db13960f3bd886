#!/usr/bin/env bash
# The in-run calibration (data.cost_calibration, issue 39), end to end. The fit's inputs come from a
# test hook (KILTER_TEST_CALIBRATION_SECONDS = ALPHA,B,C,RANK:SPEED: rank 0 takes each rank-step's
# compute seconds as ALPHA (tokens + B attention + C micro-batches) x SPEED), so the verdicts do not
# depend on the machine:
# - 2 and 3 ranks with auto: the first window (steps 2-21) fits B (data.cost_c is pinned to the
#   hook's C: micro-batches of 128 tokens leave no room for the default 256) and the slow rank's
#   speed exactly, the plan changes once (one log line naming them), the slower rank gets fewer tokens
#   from then on, and the losses stay those of 1 rank within 1e-5: a re-plan changes who computes
#   which tokens, never which tokens a step holds. summary.json and kilter report show the window,
#   the re-plan and the slow rank.
# - Stopped after the re-plan and resumed (without the hook: nothing is fitted again in the steps
#   left), the run divides its steps by the model its checkpoint records: every later step's
#   division (tokens, attention work, micro-batches per rank) is the uninterrupted run's.
#   Resumed with data.cost_calibration = off, it divides them as a run with off does.
# - off, and auto with every coefficient pinned, stay bit-identical (losses and weights) with each
#   other and from run to run.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 600 --lengths lognormal:4.5,0.9,300 --vocab 97 --shards 3 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=128 --train.tokens_per_step=512 --train.steps=40 --train.warmup=2
        --train.lr=3e-3 --output.log_every=10 --comm.device_tflops=0.1 --comm.timeout_s=60 --data.cost_c=16)
export KILTER_TEST_CALIBRATION_SECONDS=1e-6,5e-3,16,1:1.3
PLAIN_MPIRUN=("${MPIRUN[@]}")
MPIRUN+=(-x KILTER_TEST_CALIBRATION_SECONDS)

train p1.log 1 --output.dir=runs/p1
train a2.log 2 --output.dir=runs/a2 --data.cost_calibration=auto
train a3.log 3 --output.dir=runs/a3 --data.cost_calibration=auto
for log in a2.log a3.log; do
  [ "$(grep -c "the plan changes from step" $log)" -eq 1 ] || { cat $log; fail "$log: not one plan change"; }
  grep -q "divided by the cost model fitted on steps 2-21: cost_b 0.005 (was 0.00231), .*rank 1 runs 30% slower on equal work" $log \
    || { cat $log; fail "$log: the plan change does not name the fit"; }
done
"$KILTER" report runs/a2 > report.txt
grep -q "cost calibration (data.cost_calibration = auto; fits cost_b, cost_t and rank speeds): 1 window(s), 1 re-plan(s)" report.txt || { cat report.txt; fail "report: no calibration"; }
grep -q "steps 2-21: cost_b 0.005 (plan 0.00231), .*rank 1 x1.300.*re-planned from step [0-9]*: predicted imbalance .* -> .*; measured over" report.txt \
  || { cat report.txt; fail "report: the window and its re-plan are not shown"; }
grep -q "rank speed: rank 1 runs 30% slower on equal work; the plan gives it [0-9]*% fewer tokens" report.txt \
  || { cat report.txt; fail "report: the slow rank is not named"; }

# Stopped at step 34 (after the switch), resumed without the hook; and resumed with off.
stop_after part.log 2 34 --output.dir=runs/r2 --data.cost_calibration=auto
grep -q "the plan changes from step" part.log || { cat part.log; fail "part: no re-plan before the stop"; }
cp -r runs/r2 runs/r2off
env -u KILTER_TEST_CALIBRATION_SECONDS timeout 300 "${PLAIN_MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" \
  --resume runs/r2 --data.cost_calibration=auto > resume.log 2>&1 || { cat resume.log; fail "resume failed"; }
grep -q "kilter: plan: divided by the cost model this run fitted (cost_b 0.005, cost_c 16, .*rank 1 x1.300, from step" resume.log \
  || { cat resume.log; fail "resume: the fitted model was not taken from the checkpoint"; }
train resume_off.log 2 --resume runs/r2off --data.cost_calibration=off
grep -q "data.cost_calibration = off: the steps are divided by the configured cost model" resume_off.log \
  || { cat resume_off.log; fail "resume with off: not said"; }

# off twice, and auto with every coefficient pinned (nothing to fit): one and the same run.
PINNED=(--data.cost_b=0.002 --data.cost_t=0.01)
train off.log 2 --output.dir=runs/off --data.cost_calibration=off
train off_again.log 2 --output.dir=runs/off_again --data.cost_calibration=off
train pinned_off.log 2 --output.dir=runs/pinned_off --data.cost_calibration=off "${PINNED[@]}"
train pinned_auto.log 2 --output.dir=runs/pinned_auto --data.cost_calibration=auto "${PINNED[@]}"
for log in off.log off_again.log pinned_off.log pinned_auto.log; do
  if grep -q "the plan changes" $log; then cat $log; fail "$log: re-planned"; fi
done

"$PY" - "$SRC/tests/python" <<'PY'
import csv, glob, json, sys
import h5py, numpy as np
sys.path.insert(0, sys.argv[1])
from run_compare import losses, losses_of

ref = list(losses("p1"))


def same_losses(run, steps=40):
    got = list(losses_of([f"runs/{run}/metrics/rank-00000.csv"], steps))
    assert len(got) == steps, (run, len(got))
    for step, (a, b) in enumerate(zip(ref, got)):
        assert abs(a - b) <= 1e-5 * abs(a), f"{run}: step {step} loss {b} vs 1 rank's {a}"


def division(run):
    """(step, rank) -> (tokens computed, attention work, micro-batches) from the metrics."""
    out = {}
    for name in sorted(glob.glob(f"runs/{run}/metrics/rank-*.csv")):
        rank = int(name[-9:-4])
        with open(name) as f:
            for r in csv.DictReader(f):
                out[(int(r["step"]), rank)] = (int(r["tokens_computed"]), float(r["attn_work"]), int(r["micro_batches"]))
    return out


for run, ranks in (("a2", 2), ("a3", 3)):
    s = json.load(open(f"runs/{run}/summary.json"))
    cc = s["cost_calibration"]
    w = cc["windows"][0]
    assert w["steps"] == [2, 21] and w["decision"] == "replanned", w
    assert abs(w["cost_b"] - 5e-3) < 1e-9 and w["cost_c"] == 16 and not w["c_fitted"], w
    assert w["rank_speed"].keys() == {"1"} and abs(w["rank_speed"]["1"] - 1.3) < 1e-9, w
    assert w["predicted_imbalance_after"] < w["predicted_imbalance_before"], w
    start = w["replanned_from_step"]
    assert 22 <= start < 40 and cc["in_force"][0]["from_step"] == start, cc["in_force"]
    assert s["plan_rank_speed"] == w["rank_speed"], s["plan_rank_speed"]
    d = division(run)
    # From the switch on, rank 1 (1.3x slower) gets less than the others.
    others = [d[(step, r)][0] for step in range(start, 40) for r in range(ranks) if r != 1]
    slow = [d[(step, 1)][0] for step in range(start, 40)]
    share = (sum(slow) / len(slow)) / (sum(others) / len(others))
    assert share < 0.9, f"{run}: rank 1 gets {share:.2f} of the others' tokens after the re-plan"
    same_losses(run)
    print(f"{run}: re-planned from step {start}; rank 1 gets {share:.2f} of the others' tokens since; losses = 1 rank's")

# The resume keeps the fitted plan: steps 34-39 divided as in the run that was not stopped.
a2, r2 = division("a2"), division("r2")
for step in range(34, 40):
    for rank in range(2):
        assert a2[(step, rank)] == r2[(step, rank)], f"step {step} rank {rank}: {r2[(step, rank)]} vs {a2[(step, rank)]}"
with h5py.File("runs/r2/checkpoints/step-00000034.h5", "r") as f:
    text = f.attrs["cost_calibration"]
    text = text.decode() if isinstance(text, bytes) else text
models = json.loads(text)["models"]
assert len(models) == 1 and abs(models[0]["cost"]["b"] - 5e-3) < 1e-9 and models[0]["rank_speed"].keys() == {"1"}, models
same_losses("r2")
# Resumed with off: the configured model again, as a run with off divides those steps.
off, r2off = division("off"), division("r2off")
for step in range(34, 40):
    for rank in range(2):
        assert off[(step, rank)] == r2off[(step, rank)], f"off resume, step {step} rank {rank}"
same_losses("r2off")


def params(run):
    with h5py.File(f"runs/{run}/checkpoints/step-00000040.h5", "r") as f:
        return {k: np.array(f["params"][k]) for k in f["params"]}


def identical(x, y):
    lx = list(losses_of([f"runs/{x}/metrics/rank-00000.csv"], 40))
    ly = list(losses_of([f"runs/{y}/metrics/rank-00000.csv"], 40))
    assert lx == ly, f"{x} and {y}: losses differ"
    px, py = params(x), params(y)
    assert px.keys() == py.keys() and all(np.array_equal(px[k], py[k]) for k in px), f"{x} and {y}: weights differ"


identical("off", "off_again")
identical("pinned_off", "pinned_auto")
assert "cost_calibration" not in json.load(open("runs/pinned_auto/summary.json")), "pinned: nothing should be fitted"
print("off and pinned runs bit-identical; the resume kept the fitted plan")
PY
echo "PASS: cost_calibration"
