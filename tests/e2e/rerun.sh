#!/usr/bin/env bash
# Re-running is safe (issue 25). A run interrupted after 3 of 6 steps (the preemption drill) is
# re-run with the same command: it continues from its checkpoint, and its metrics (rank CSVs and
# metrics/train.csv) keep the first 3 steps and gain the rest, none twice when read back. A re-run
# of the finished run has nothing to do. A changed config is refused before MPI (exit 2) naming
# the key, with the run untouched; --force moves the old run aside, whole, and starts over.
# train.csv's columns are those the README documents, and its rows match the progress lines.
source "$(dirname "$0")/lib.sh"

"$KILTER" prep synth --docs 80 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data --quiet >/dev/null
COMMON=(--data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=6 --output.trace_steps=0
        --output.log_every=1 --data.eval_fraction=0.1 --train.eval_every=2 --comm.timeout_s=60 --output.dir=runs/a)

stop_after first.log 2 3
[ "$(ls runs/a/checkpoints)" = "step-00000003.h5" ] || fail "the drill left $(ls runs/a/checkpoints)"
head -4 runs/a/metrics/train.csv > first_rows.csv
cp runs/a/metrics/rank-00000.csv first_rank0.csv

# The same command again: it continues.
train second.log 2
grep -q "continuing from runs/a/checkpoints/step-00000003.h5 (step 3)" second.log || { cat second.log; fail "no note that it continues"; }
grep -q "resumed from runs/a/checkpoints/step-00000003.h5 at step 3" second.log || { cat second.log; fail "did not resume"; }
grep -q "^step      1/6" second.log && fail "the re-run started at step 1"
head -4 runs/a/metrics/train.csv | cmp -s - first_rows.csv || fail "train.csv lost or changed its first rows"
head -n "$(wc -l < first_rank0.csv)" runs/a/metrics/rank-00000.csv | cmp -s - first_rank0.csv || fail "rank-00000.csv was truncated"

# train.csv: the README's columns, steps 1..6 once each, eval at 2/4/6, loss as printed.
header=$(head -1 runs/a/metrics/train.csv)
[ "$header" = "step,tokens,loss,lr,grad_norm,tokens_per_second,eval_loss,eval_perplexity,elapsed_seconds" ] || fail "header: $header"
for col in ${header//,/ }; do
  grep -q "^| \`$col\` |" "$SRC/README.md" || fail "README does not document train.csv column $col"
done
"$PY" - runs/a/metrics/train.csv second.log <<'PY'
import csv, math, re, sys
rows = {}
for r in csv.DictReader(open(sys.argv[1])):
    rows[int(r["step"])] = r  # a resumed run's repeated step: the later row wins, as kilter reads it
assert sorted(rows) == [1, 2, 3, 4, 5, 6], sorted(rows)
for s, r in rows.items():
    assert (r["eval_loss"] != "") == (s % 2 == 0), (s, r)
    if r["eval_loss"]:
        assert abs(math.exp(float(r["eval_loss"])) - float(r["eval_perplexity"])) < 1e-6 * float(r["eval_perplexity"])
    assert float(r["lr"]) > 0 and float(r["grad_norm"]) > 0 and float(r["tokens"]) > 0
assert [float(rows[s]["tokens"]) for s in range(1, 7)] == sorted(float(rows[s]["tokens"]) for s in range(1, 7))
printed = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step +(\d+)/6 \| loss ([0-9.]+)", open(sys.argv[2]).read(), re.M)}
evals = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^step +(\d+)/6 \| eval loss ([0-9.]+)", open(sys.argv[2]).read(), re.M)}
assert sorted(printed) == [4, 5, 6] and sorted(evals) == [4, 6], (printed, evals)
for s, loss in printed.items():
    assert abs(float(rows[s]["loss"]) - loss) < 1e-4, (s, rows[s]["loss"], loss)
for s, loss in evals.items():
    assert abs(float(rows[s]["eval_loss"]) - loss) < 1e-4, (s, rows[s]["eval_loss"], loss)
print("train.csv matches the run:", len(rows), "rows")
PY
grep -q "^lr = 0.0003$" runs/a/config.ini || fail "config.ini does not store lr = 0.0003"

# The finished run again: nothing to do, nothing written.
cp runs/a/metrics/train.csv done.csv
rc=0
timeout 120 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" > third.log 2>&1 || rc=$?
[ $rc -eq 0 ] || { cat third.log; fail "re-run of a finished run: exit $rc"; }
grep -q "already holds this run at step 6 (train.steps = 6): nothing to do" third.log || { cat third.log; fail "no nothing-to-do note"; }
cmp -s done.csv runs/a/metrics/train.csv || fail "the finished run's train.csv changed"

# Another config: refused before MPI, exit 2, the key named, the run untouched.
rc=0
timeout 120 "${MPIRUN[@]}" -np 2 "$KILTER" train "${COMMON[@]}" --train.lr=0.01 > other.log 2>&1 || rc=$?
[ $rc -eq 2 ] || { cat other.log; fail "another config: exit $rc, expected 2"; }
grep -q "output.dir runs/a holds a run of another config" other.log && grep -q "    train.lr = 0.0003 vs 0.01" other.log \
  || { cat other.log; fail "another config: the key is not named"; }
grep -q "train failed" other.log && fail "another config: refused only after MPI started"
cmp -s done.csv runs/a/metrics/train.csv || fail "the refused run touched train.csv"

# --force: the old run moves aside whole; the new one starts at step 1.
train forced.log 2 --train.lr=0.01 --force
old=$(ls -d runs/a.old-* 2>/dev/null | head -1)
[ -n "$old" ] || { cat forced.log; fail "--force: no runs/a.old-*"; }
grep -q "moved the run in runs/a to $old" forced.log || { cat forced.log; fail "--force: no note of the move"; }
cmp -s done.csv "$old/metrics/train.csv" || fail "--force: the old run's train.csv changed"
[ -f "$old/checkpoints/step-00000006.h5" ] || fail "--force: the old run's checkpoint is gone"
grep -q "^step      1/6" forced.log || { cat forced.log; fail "--force: did not start at step 1"; }
grep -q "^lr = 0.01$" runs/a/config.ini || fail "--force: the new run's config.ini"
# output.checkpoint_minutes: rank 0's clock makes every rank checkpoint at the same step. A
# limit of 1e-9 minutes has passed after every step, so each step writes one (no timing assumed).
COMMON=("${COMMON[@]/--output.dir=runs\/a/--output.dir=runs/timed}")
train timed.log 2 --output.checkpoint_minutes=1e-9 --output.keep_checkpoints=10
[ "$(ls runs/timed/checkpoints | tr '\n' ' ')" = "step-00000001.h5 step-00000002.h5 step-00000003.h5 step-00000004.h5 step-00000005.h5 step-00000006.h5 " ] \
  || fail "checkpoint_minutes: checkpoints $(ls runs/timed/checkpoints | tr '\n' ' ')"
echo PASS
