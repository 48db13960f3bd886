#!/usr/bin/env bash
# cluster (issue 15): a Slurm job on 2 real nodes (scripts/vcluster slurm: slurmctld on node1,
# one slurmd per node, munge). slurm/train.sbatch is submitted from node2 with --nodes=2
# --ntasks-per-node=2 (srun --mpi=pmix, kilter's own per-node staging to the node-local
# directory); once it trains, the batch script is sent USR1: kilter checkpoints and exits 85,
# the script requeues the job, which runs again on both nodes, resumes from the checkpoint and
# finishes train.steps. Skipped (77) without slurm-wlm/munge.
source "$(dirname "$0")/lib.sh"
for tool in slurmctld slurmd munged sbatch; do
  command -v "$tool" >/dev/null 2>&1 || skip "'$tool' is missing (scripts/install-deps.sh --with-test-extras installs slurm-wlm and munge)"
done
[[ -r /etc/munge/munge.key ]] || skip "/etc/munge/munge.key is missing (the munge package makes it)"

vc up --nodes 2
vc slurm up || fail "vcluster slurm up failed"
on() { local node=$1; shift; vc exec "$node" "$@"; }   # Slurm clients run on a node
job_field() { on node1 scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
wait_for() {  # wait_for SECONDS WHAT CMD...
  local limit=$1 what=$2 deadline
  shift 2
  deadline=$(( SECONDS + limit ))
  until "$@" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || { echo "timed out after $limit s waiting for $what" >&2; return 1; }
    sleep 0.5
  done
}
job_ended() { [[ $(job_field "$1" JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]]; }
job_restarted() { [[ $(job_field "$1" Restarts) == 1 ]]; }

"$KILTER" prep synth --docs 300 --lengths lognormal:4,0.8,512 --vocab 257 --shards 2 --seed 1 --out "$WORK/data" >/dev/null
cat > tiny.ini <<INI
[model]
n_layer = 1
n_head = 2
n_embd = 32
block_size = 64
[data]
dir = $WORK/data
max_tokens = 256
[train]
steps = 40
tokens_per_step = 1024
warmup = 2
[output]
log_every = 1
INI

export KILTER_BIN=$KILTER KILTER_SRUN_FLAGS="" KILTER_STAGE=kilter KILTER_STAGE_ROOT=$LOCAL KILTER_MAX_REQUEUES=2
# Rank 1 sleeps 0.3 s per step (a diagnostics drill) so that the signal lands mid-run.
job=$(on node2 sbatch --parsable --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=10 \
        --chdir="$WORK" --output="$WORK/job.out" "$SRC/slurm/train.sbatch" "$WORK/tiny.ini" --train.inject_delay=1:0.3) ||
  fail "sbatch --nodes=2 from node2 was refused"
echo "job $job submitted from node2"
fail_job() { [[ -f job.out ]] && tail -n 60 job.out; tail -n 20 /run/vcluster/slurm/log/*.log 2>/dev/null; fail "$*"; }

wait_for 180 "step 3" grep -q "step      3/40" job.out || fail_job "job $job did not reach step 3 (state $(job_field "$job" JobState))"
on node1 scancel --signal=USR1 --batch "$job" || fail_job "scancel --signal=USR1 --batch $job failed"
wait_for 120 "requeue" job_restarted "$job" || fail_job "job $job was not requeued (state $(job_field "$job" JobState))"
wait_for 240 "the end" job_ended "$job" || fail_job "job $job did not finish after its requeue"
[[ $(job_field "$job" JobState) == COMPLETED ]] || fail_job "job $job ended $(job_field "$job" JobState)"

run="$WORK/runs/kilter-train-$job"
(( $(grep -c "start: run [12] .* on 2 node(s): node\[1-2\]" job.out) == 2 )) || fail_job "job $job did not run twice on node[1-2]"
for node in node1 node2; do
  (( $(grep -c "kilter: staged $LOCAL/kilter-$job/data on $node: " job.out) == 2 )) ||
    fail_job "job $job: $node did not stage the dataset in both runs"
done
grep -q "4 ranks (2 nodes x 2)" job.out || fail_job "job $job: kilter did not see 2 nodes x 2"
stopped_at=$(sed -n 's/.*kilter: stop signal received: checkpoint of step \([0-9]*\) written.*/\1/p' job.out | head -n 1)
[[ -n $stopped_at ]] && (( stopped_at >= 3 && stopped_at < 40 )) || fail_job "job $job: no checkpoint mid-run after USR1"
grep -q "checkpointed and stopped (exit 85)" job.out || fail_job "job $job: no rank recorded exit 85"
grep -q "requeueing job $job" job.out || fail_job "job $job: the script did not requeue it"
grep -q "kilter: resumed from .* at step $stopped_at " job.out || fail_job "job $job: kilter did not resume at step $stopped_at"
[[ $(json_field "$run/summary.json" steps) == 40 ]] || fail_job "job $job: summary.json steps is not 40"
[[ $(json_field "$run/summary.json" num_nodes) == 2 ]] || fail_job "job $job: summary.json num_nodes is not 2"
[[ $(json_field "$run/summary.json" resumed_from_step) == "$stopped_at" ]] || fail_job "job $job: resumed_from_step is not $stopped_at"
echo "ok: job $job on node[1-2]: USR1 -> checkpoint of step $stopped_at, exit 85, requeued, resumed on both nodes, 40 steps"
echo "PASS: cluster slurm"
