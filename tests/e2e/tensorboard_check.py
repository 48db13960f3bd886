"""Reads a kilter run's TensorBoard files back with TensorBoard's own readers and checks them
against the run's CSVs (tests/e2e/tensorboard.sh).

usage: tensorboard_check.py STRAIGHT_RUN RESUMED_RUN WORLD_SIZE STEPS LOG_EVERY EVAL_EVERY

Every scalar is at its step exactly once across a folder's event files (a resumed run skips the
steps its folder already holds), with the value the CSVs hold: train.csv's first row of the step
(the one written before any resume), the rank CSVs' first row of the step for the phases and the
balance figures. The straight run and the resumed one agree on loss, lr, grad norm and eval loss
(the CPU backend resumes bit for bit).
"""
import csv
import glob
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader, plugin_event_accumulator
from tensorboard.util import tensor_util

PHASES = ["data_wait", "h2d", "forward", "backward", "kv_wait", "gather_wait", "scatter_wait", "comm_exposed",
          "optimizer", "step_total"]
TRAIN_TAGS = ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_second", "train/mfu"]
EVAL_TAGS = ["eval/loss", "eval/perplexity"]
BALANCE_TAGS = ["balance/step_time_imbalance", "balance/sync_wait_share"]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def first_rows(path, key="step"):
    """Rows by step; the first row of a repeated step (what was logged before a resume)."""
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.setdefault(int(r[key]), r)
    return rows


def close(a, b, rel=1e-6, abs_tol=0.0):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def raw_events(folder):
    """(tag, step, value) of every scalar in the folder's event files, in file order; each file
    starts with its file_version record. The legacy loader gives the records as written (the
    other one rewrites simple_value into a tensor)."""
    files = sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))
    if not files:
        fail(f"{folder}: no event files")
    out = []
    for path in files:
        events = list(event_file_loader.LegacyEventFileLoader(path).Load())
        if not events or events[0].file_version != "brain.Event:2":
            fail(f"{path}: the first record is not file_version brain.Event:2")
        for e in events[1:]:
            for v in e.summary.value:
                out.append((v.tag, e.step, v.simple_value))
    return files, out


def read_folder(folder):
    """tag -> {step: value} through EventAccumulator, after checking the raw events hold no
    (tag, step) twice and that both readers agree."""
    files, raw = raw_events(folder)
    seen = set()
    for tag, step, _ in raw:
        if (tag, step) in seen:
            fail(f"{folder}: {tag} at step {step} written twice")
        seen.add((tag, step))
    acc = event_accumulator.EventAccumulator(folder, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    for tag, step, value in raw:
        if scalars.get(tag, {}).get(step) != value:
            fail(f"{folder}: EventAccumulator lost {tag} at step {step}")
    # What `tensorboard --logdir` itself shows: the server's accumulator migrates simple_value to
    # the scalars plugin's tensors.
    served = plugin_event_accumulator.EventAccumulator(folder, size_guidance={"tensors": 0})
    served.Reload()
    for tag, by_step in scalars.items():
        if served.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            fail(f"{folder}: {tag} is not served by the scalars plugin")
        got = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in served.Tensors(tag)}
        if got != by_step:
            fail(f"{folder}: TensorBoard's server reads {tag} as {got}, the event files hold {by_step}")
    return files, scalars


def expect_steps(folder, scalars, tags, steps):
    for tag in tags:
        got = sorted(scalars.get(tag, {}))
        if got != steps:
            fail(f"{folder}: {tag} at steps {got}, expected {steps}")


def check_run(run, world, steps, log_every, eval_every):
    tb = os.path.join(run, "tensorboard")
    files, scalars = read_folder(tb)
    train_steps = sorted({1, steps} | set(range(log_every, steps + 1, log_every)))
    expect_steps(tb, scalars, TRAIN_TAGS, train_steps)
    expect_steps(tb, scalars, EVAL_TAGS, list(range(eval_every, steps + 1, eval_every)))
    log_steps = list(range(log_every, steps + 1, log_every))
    expect_steps(tb, scalars, BALANCE_TAGS, log_steps)
    extra = set(scalars) - set(TRAIN_TAGS + EVAL_TAGS + BALANCE_TAGS)
    if extra:
        fail(f"{tb}: unexpected tags {sorted(extra)}")

    train_csv = first_rows(os.path.join(run, "metrics", "train.csv"))
    summary = json.load(open(os.path.join(run, "summary.json")))
    n = 0
    for step in train_steps:
        row = train_csv[step]
        for tag, col in [("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                         ("train/tokens_per_second", "tokens_per_second")]:
            if not close(scalars[tag][step], float(row[col])):
                fail(f"{tb}: {tag} at step {step} = {scalars[tag][step]}, train.csv {row[col]}")
            n += 1
        tps = float(row["tokens_per_second"])
        mfu = tps * summary["model_flops_per_token"] / world / 1e12 / summary["mfu_peak_tflops"]
        if not (mfu > 0 and close(scalars["train/mfu"][step], mfu, rel=1e-5)):
            fail(f"{tb}: train/mfu at step {step} = {scalars['train/mfu'][step]}, expected {mfu}")
        n += 1
    for step in scalars["eval/loss"]:
        ev = float(train_csv[step]["eval_loss"])
        if not (close(scalars["eval/loss"][step], ev) and close(scalars["eval/perplexity"][step], math.exp(ev))):
            fail(f"{tb}: eval at step {step} = {scalars['eval/loss'][step]}, train.csv {ev}")
        n += 2

    rank_rows = [first_rows(os.path.join(run, "metrics", f"rank-{r:05d}.csv")) for r in range(world)]
    for step in log_steps:
        rows = [rank_rows[r][step - 1] for r in range(world)]  # the rank CSVs count steps from 0
        compute = [float(x["compute"]) for x in rows]
        arrival = [float(x["arrival"]) for x in rows]
        wait = sum(max(arrival) - a for a in arrival)
        share = wait / sum(float(x["step_total"]) for x in rows)
        imbalance = max(compute) / (sum(compute) / world)
        if not close(scalars["balance/step_time_imbalance"][step], imbalance, rel=1e-5):
            fail(f"{tb}: imbalance at step {step} = {scalars['balance/step_time_imbalance'][step]}, CSVs {imbalance}")
        if not close(scalars["balance/sync_wait_share"][step], share, rel=1e-4, abs_tol=1e-6):
            fail(f"{tb}: sync_wait_share at step {step} = {scalars['balance/sync_wait_share'][step]}, CSVs {share}")
        n += 2

    for r in range(world):
        folder = os.path.join(tb, f"rank-{r:05d}")
        _, phases = read_folder(folder)
        tags = [f"rank/{r}/{p}" for p in PHASES]
        if sorted(phases) != sorted(tags):
            fail(f"{folder}: tags {sorted(phases)}, expected {tags}")
        expect_steps(folder, phases, tags, log_steps)
        for step in log_steps:
            row = rank_rows[r][step - 1]
            for p in PHASES:
                if not close(phases[f"rank/{r}/{p}"][step], float(row[p]), rel=1e-6, abs_tol=1e-9):
                    fail(f"{folder}: rank/{r}/{p} at step {step} = {phases[f'rank/{r}/{p}'][step]}, CSV {row[p]}")
                n += 1
    return files, scalars, n


def main():
    straight, resumed = sys.argv[1], sys.argv[2]
    world, steps, log_every, eval_every = (int(x) for x in sys.argv[3:7])
    files_a, a, n_a = check_run(straight, world, steps, log_every, eval_every)
    files_b, b, n_b = check_run(resumed, world, steps, log_every, eval_every)
    if len(files_a) != 1 or len(files_b) != 2:
        fail(f"event files: {len(files_a)} in the straight run (expected 1), {len(files_b)} in the resumed one (expected 2)")
    for tag in ["train/loss", "train/lr", "train/grad_norm", "eval/loss"]:
        if a[tag] != b[tag]:
            fail(f"{tag}: straight {a[tag]} != resumed {b[tag]}")
    print(f"tensorboard: {n_a} + {n_b} scalars read back by TensorBoard match the CSVs; "
          f"the resumed run's {len(files_b)} event files repeat no step")


if __name__ == "__main__":
    main()
