#!/usr/bin/env bash
# Weighted mixtures (issue 26): `data.sources = a:0.7, b:0.2, c:0.1` over three synthetic sources.
# Over an epoch the token shares are within 1% of the weights (kilter plan and the run summary);
# sources wrap into their next epoch independently and the log says at which step; the losses
# are the same on 1, 2 and 4 ranks (1e-5); a run stopped mid-mixture and resumed equals the
# straight run bit for bit; eval reports a loss per source; sources with different vocabularies
# are refused naming both, as is data.dir together with data.sources.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
json() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }

# Sources of different sizes and lengths, one vocabulary.
"$KILTER" prep synth --docs 300 --lengths uniform:20,200 --vocab 300 --shards 2 --seed 1 --out a >/dev/null 2>&1
"$KILTER" prep synth --docs 120 --lengths lognormal:4,0.8,400 --vocab 300 --shards 1 --seed 2 --out b >/dev/null 2>&1
"$KILTER" prep synth --docs 60 --lengths uniform:10,120 --vocab 300 --shards 3 --seed 3 --out c >/dev/null 2>&1
MIX="a:0.7, b:0.2, c:0.1"
COMMON=("--data.sources=$MIX" --model.n_layer=1 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=512 --train.tokens_per_step=1024 --train.warmup=2 --train.lr=3e-3
        --output.log_every=1 --output.trace_steps=0 --comm.timeout_s=60)

# Shares over one epoch, from the plan (world size 4) and from a whole-epoch run's summary.
"$KILTER" plan "${COMMON[@]}" --world-size 4 --json > plan.json 2>/dev/null
"$PY" - <<'PY'
import json
d = json.load(open("plan.json"))
want = {"a": 0.7, "b": 0.2, "c": 0.1}
for k, w in want.items():
    share = d["tokens_per_source"][k]["share"]
    assert abs(share - w) <= 0.01, f"plan: source {k} has share {share:.4f}, weight {w}"
print("mixture: plan shares", {k: round(v["share"], 4) for k, v in d["tokens_per_source"].items()},
      "over", d["steps_per_epoch"], "steps")
# c holds less than a tenth of all tokens: it wraps within the epoch; a (more than 70%) does not.
assert any(w.startswith("source c runs out in step") for w in d["source_wraps"]), d["source_wraps"]
assert not any(w.startswith("source a ") for w in d["source_wraps"]), d["source_wraps"]
PY
steps=$(json plan.json 'd["steps_per_epoch"]')
train epoch.log 2 --output.dir=runs/epoch --train.steps="$steps"
"$PY" - <<'PY'
import json
d = json.load(open("runs/epoch/summary.json"))
t = d["tokens_per_source"]; total = sum(t.values())
for k, w in {"a": 0.7, "b": 0.2, "c": 0.1}.items():
    assert abs(t[k] / total - w) <= 0.01, f"run: source {k} has share {t[k] / total:.4f}, weight {w}"
print("mixture: run shares", {k: round(v / total, 4) for k, v in t.items()})
PY

# A run past the smaller sources' data: they wrap on their own, and the log names the step.
train long.log 1 --output.dir=runs/long --train.steps=$((2 * steps))
grep -q "kilter: mixture epoch [0-9]*: source c runs out in step [0-9]* and wraps into its epoch 2" long.log \
  || { cat long.log; fail "no wrap message for source c"; }

# World-size invariance: the same losses on 1, 2 and 4 ranks.
for np in 1 2 4; do train ranks$np.log $np --output.dir=runs/np$np --train.steps=12; done
"$PY" - <<'PY'
import csv
def losses(run):
    with open(f"runs/{run}/metrics/rank-00000.csv") as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]
ref = losses("np1")
assert len(ref) == 12, len(ref)
for run in ("np2", "np4"):
    other = losses(run)
    worst = max(abs(a - b) for a, b in zip(ref, other))
    assert len(other) == 12 and worst <= 1e-5, f"{run}: losses differ from 1 rank by {worst}"
print("mixture: losses on 1, 2, 4 ranks agree within 1e-5")
PY

# Resume mid-mixture: stopped after 5 steps, resumed to 12 == straight, bit for bit.
stop_after part1.log 2 5 --output.dir=runs/part --train.steps=12 && cp runs/part/metrics/rank-00000.csv part1.csv
train part2.log 2 --resume runs/part --train.steps=12 && cp runs/part/metrics/rank-00000.csv part2.csv
"$PY" - <<'PY'
import csv
import h5py, numpy as np
def losses(*files):
    rows = {}
    for name in files:
        with open(name) as f:
            for r in csv.DictReader(f):
                rows[int(r["step"])] = r["loss"]
    return rows
a, b = losses("runs/np2/metrics/rank-00000.csv"), losses("part1.csv", "part2.csv")
assert sorted(a) == sorted(b) == list(range(12)), (sorted(a), sorted(b))
assert all(a[s] == b[s] for s in range(12)), [(s, a[s], b[s]) for s in range(12) if a[s] != b[s]]
fa = h5py.File("runs/np2/checkpoints/step-00000012.h5", "r")
fb = h5py.File("runs/part/checkpoints/step-00000012.h5", "r")
for group in ("params", "adam/m", "adam/v"):
    for name in fa[group]:
        assert np.array_equal(fa[group][name][...], fb[group][name][...]), f"{group}/{name} differs"
print("mixture: resumed mid-mixture == straight run, bit-identical")
PY

# Eval loss per source.
train eval.log 2 --output.dir=runs/eval --train.steps=12 --data.eval_fraction=0.1 --train.eval_every=6 --train.eval_batches=2
for s in a b c; do grep -q "eval loss [0-9.]* on $s$" eval.log || { cat eval.log; fail "no eval loss for source $s"; }; done
[ "$(json runs/eval/summary.json 'sorted(d["eval_loss_per_source"])')" = "['a', 'b', 'c']" ] || fail "summary eval_loss_per_source"

# Refusals.
"$KILTER" prep synth --docs 30 --lengths uniform:10,50 --vocab 400 --shards 1 --seed 4 --out d400 >/dev/null 2>&1
if timeout 120 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]:1}" "--data.sources=a:0.5, d400:0.5" \
     --output.dir=runs/bad > vocab.log 2>&1; then fail "sources with different vocabularies were accepted"; fi
grep -q "a (vocab_size 300, eos_id 299, tokenizer synthetic) and d400 (vocab_size 400" vocab.log \
  || { cat vocab.log; fail "the refusal does not name both sources"; }
if "$KILTER" train "${COMMON[@]}" --data.dir=a --train.steps=2 --output.dir=runs/bad > both.log 2>&1; then fail "data.dir with data.sources"; fi
grep -q "data.dir and data.sources are both set" both.log || { cat both.log; fail "both keys message"; }
if "$KILTER" train "${COMMON[@]:1}" "--data.sources=a:0.5, b:x" --output.dir=runs/bad > weight.log 2>&1; then fail "bad weight"; fi
grep -q "the weight of b ('x') is not a positive number" weight.log || { cat weight.log; fail "weight message"; }
echo "mixture: ok"
