#!/bin/bash
# e2e (issue 9): slurm/train.sbatch on a real single-node Slurm started by this test (munged,
# slurmctld, slurmd on localhost; tests/e2e/slurm_cluster.sh).
#   1. A tiny 2-rank job (10 steps, KILTER_LAUNCHER=mpirun) runs to completion: stage-in verified,
#      summary.json says 10 steps.
#   2. A second job (srun --mpi=pmix) is sent USR1 mid-run (scancel --signal=USR1 --batch): kilter
#      checkpoints and exits 85, the script requeues the job, which runs again
#      (SLURM_RESTART_COUNT=1), resumes from the checkpoint and finishes: the total is train.steps,
#      the second run started where the first stopped.
# Every wait is bounded and fails with what it waited for; the daemons are stopped on any exit.
# Usage: slurm.sh KILTER_BINARY. Exit 77 (skipped) without root, slurm-wlm or munge.
set -euo pipefail

kilter_bin=$(readlink -f "$1")
source_dir=${KILTER_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
python=${KILTER_PYTHON:-/usr/bin/python3}
# shellcheck source=slurm_cluster.sh
source "$(dirname "$0")/slurm_cluster.sh"

if ! slurm_cluster_available; then
  echo "SKIP: a local Slurm cluster needs: $SLURM_CLUSTER_MISSING (scripts/install-deps.sh --with-test-extras)"
  exit 77
fi

work=$(mktemp -d /tmp/kilter-slurm.XXXXXX)
chmod 0755 "$work"   # munged (user munge) must reach its directory below
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/job*.out; do [[ -f $f ]] && { echo "----- $f" >&2; tail -n 40 "$f" >&2; }; done
  slurm_cluster_dump_logs
  exit 1
}
cleanup() {
  local rc=$?
  if [[ -n ${SLURM_CONF:-} ]]; then
    scancel --quiet --partition=debug 2>/dev/null || true
    # Bounded: jobs get KillWait (10 s) to end before the daemons go.
    slurm_wait_for 30 "jobs to leave the queue" test -z "$(squeue -h 2>/dev/null)" || true
  fi
  slurm_cluster_stop
  if (( rc == 0 )) && [[ -z ${KILTER_KEEP_TEST_DIR:-} ]]; then rm -rf "$work"; else echo "test files kept in $work"; fi
}
trap cleanup EXIT

slurm_cluster_start "$work/cluster" || fail "could not start the local Slurm cluster"

# ---- dataset and config -----------------------------------------------------------------------------
"$kilter_bin" prep synth --docs 300 --lengths lognormal:4,0.8,512 --vocab 257 --shards 2 --seed 1 \
  --out "$work/data" --quiet || fail "kilter prep synth failed"
cat >"$work/tiny.ini" <<EOF
[model]
n_layer = 1
n_head = 2
n_embd = 32
block_size = 64
[data]
dir = $work/data
max_tokens = 256
[train]
steps = 10
tokens_per_step = 1024
warmup = 2
[output]
log_every = 1
EOF

# The scripts come from the source tree; the binary from the build under test. The local node has
# no task plugin for CPU binding, hence no --cpu-bind; node-local storage is a directory of $work.
export KILTER_BIN=$kilter_bin
export KILTER_SRUN_FLAGS=""
export KILTER_STAGE_ROOT="$work/node-local"
export KILTER_MAX_REQUEUES=2
sbatch_args=(--parsable --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=10
             --chdir="$work")

job_state() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p'; }
job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
job_is() { [[ $(job_state "$1") == "$2" ]]; }
json_field() { "$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# ---- 1. a job that runs to completion (launched with mpirun; job 2 uses srun) --------------------------
job1=$(KILTER_LAUNCHER=mpirun KILTER_MPIRUN_FLAGS="--allow-run-as-root --oversubscribe" \
       sbatch "${sbatch_args[@]}" --output="$work/job1.out" "$source_dir/slurm/train.sbatch" "$work/tiny.ini") ||
  fail "sbatch slurm/train.sbatch was refused"
echo "job 1: $job1"
slurm_wait_for 240 "job $job1 to finish" bash -c "[[ \$(scontrol show job -o $job1 | grep -o 'JobState=[A-Z_]*') =~ COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY ]]" ||
  fail "job $job1 did not finish within 240 s (state $(job_state "$job1"))"
job_is "$job1" COMPLETED || fail "job $job1 ended $(job_state "$job1") (exit $(job_field "$job1" ExitCode))"
run1="$work/runs/kilter-train-$job1"
[[ -f $run1/summary.json ]] || fail "job $job1 completed but wrote no $run1/summary.json"
[[ $(json_field "$run1/summary.json" steps) == 10 ]] || fail "job $job1: summary.json steps is not 10"
[[ $(json_field "$run1/summary.json" world_size) == 2 ]] || fail "job $job1: summary.json world_size is not 2"
grep -q "stage-in\[.*verified" "$work/job1.out" || fail "job $job1: no verified stage-in in its log"
grep -q -- "--data.dir=$work/node-local/kilter-$job1/data" "$work/job1.out" ||
  fail "job $job1: kilter was not pointed at the node-local copy"
[[ ! -e $work/node-local/kilter-$job1 ]] || fail "job $job1: the node-local copy was not removed at the end"
grep -q "launch: mpirun --map-by ppr:2:node:PE=1 --bind-to core" "$work/job1.out" || fail "job $job1 was not launched with mpirun"
echo "ok: job $job1 completed (mpirun): 10 steps on 2 ranks, staged and verified, summary.json written"

# ---- 2. USR1 mid-run: checkpoint, exit 85, requeue, resume, finish -----------------------------------
# rank 1 sleeps 0.3 s per step (a diagnostics drill) so that the signal lands mid-run.
job2=$(sbatch "${sbatch_args[@]}" --output="$work/job2.out" "$source_dir/slurm/train.sbatch" "$work/tiny.ini" \
         --train.steps=40 --train.inject_delay=1:0.3 --data.cost_calibration=off) || fail "sbatch (job 2) was refused"
echo "job 2: $job2"
slurm_wait_for 180 "job $job2 to log step 3" grep -q "step      3/40" "$work/job2.out" ||
  fail "job $job2 did not reach step 3 within 180 s (state $(job_state "$job2"))"
scancel --signal=USR1 --batch "$job2" || fail "scancel --signal=USR1 --batch $job2 failed"
echo "job 2: sent USR1"
slurm_wait_for 120 "job $job2 to be requeued (Restarts=1)" bash -c "[[ \$(scontrol show job -o $job2 | grep -o 'Restarts=[0-9]*') == Restarts=1 ]]" ||
  fail "job $job2 was not requeued within 120 s (state $(job_state "$job2"))"
slurm_wait_for 240 "job $job2 to finish after its requeue" bash -c "[[ \$(scontrol show job -o $job2 | grep -o 'JobState=[A-Z_]*') =~ COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY ]]" ||
  fail "job $job2 did not finish within 240 s of its requeue (state $(job_state "$job2"))"
job_is "$job2" COMPLETED || fail "job $job2 ended $(job_state "$job2") (exit $(job_field "$job2" ExitCode))"

log2="$work/job2.out"
run2="$work/runs/kilter-train-$job2"
grep -q "received SIGUSR1" "$log2" || fail "job $job2: the batch script did not trap USR1"
grep -q "kilter: stop signal received: checkpoint of step" "$log2" || fail "job $job2: kilter did not checkpoint on the signal"
grep -q "checkpointed and stopped (exit 85)" "$log2" || fail "job $job2: no rank recorded exit 85"
grep -q "requeueing job $job2" "$log2" || fail "job $job2: the script did not requeue the job"
grep -q "SLURM_RESTART_COUNT=1" "$log2" || fail "job $job2: no second run with SLURM_RESTART_COUNT=1 in the log"
stopped_at=$(sed -n 's/.*kilter: stop signal received: checkpoint of step \([0-9]*\) written.*/\1/p' "$log2" | head -n 1)
[[ -n $stopped_at ]] && (( stopped_at >= 3 && stopped_at < 40 )) ||
  fail "job $job2: the signal did not stop the run mid-way (checkpoint of step '${stopped_at}')"
grep -q "resuming from $run2/checkpoints/step-$(printf %08d "$stopped_at").h5" "$log2" ||
  fail "job $job2: the script did not resume from the step-$stopped_at checkpoint"
grep -q "kilter: resumed from .* at step $stopped_at " "$log2" || fail "job $job2: kilter does not say it resumed at step $stopped_at"
[[ -f $run2/summary.json ]] || fail "job $job2: no summary.json after the resumed run"
[[ $(json_field "$run2/summary.json" steps) == 40 ]] || fail "job $job2: summary.json steps is not 40"
[[ $(json_field "$run2/summary.json" resumed_from_step) == "$stopped_at" ]] ||
  fail "job $job2: summary.json resumed_from_step is not $stopped_at"
[[ $(json_field "$run2/summary.json" steps_this_run) == $(( 40 - stopped_at )) ]] ||
  fail "job $job2: the resumed run did not do the remaining $(( 40 - stopped_at )) steps"
echo "ok: job $job2: USR1 at step >= 3 -> checkpoint of step $stopped_at, exit 85, requeued, resumed, 40 steps in total"
echo "PASS: slurm"
