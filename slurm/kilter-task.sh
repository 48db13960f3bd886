#!/bin/bash
# Runs one kilter rank under srun or mpirun (train.sbatch launches it): passes USR1/TERM on to
# kilter, and when kilter exits with 85 (checkpointed after a stop signal) leaves the marker file
# $KILTER_PREEMPT_MARK for the batch script.
# Why not rely on the launcher's exit code: with `srun --kill-on-bad-exit=1` the first rank to
# exit 85 makes srun terminate the others, and srun then reports 143 (TERM), not 85. The marker
# says "a rank finished its checkpoint and stopped on request" whatever srun reports.
#
# Usage: kilter-task.sh KILTER_BINARY ARGS...
set -uo pipefail

"$@" &
child=$!
# Slurm signals every process of the step, mpirun only its direct children (this script):
# forwarding makes both work; kilter treats a second identical signal as the same request.
stop_requested=0
trap 'stop_requested=1; kill -USR1 "$child" 2>/dev/null' USR1
trap 'stop_requested=1; kill -TERM "$child" 2>/dev/null' TERM

while :; do
  wait "$child"
  rc=$?
  # `wait` returns early (128+signal) when a trapped signal arrives; wait again for the real
  # exit status, which bash keeps for a child it has already reaped.
  if (( stop_requested == 1 )); then
    stop_requested=2
    continue
  fi
  break
done

if (( rc == 85 )) && [[ -n ${KILTER_PREEMPT_MARK:-} ]]; then
  echo "rank ${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-?}} on $(hostname -s): checkpointed and stopped (exit 85)" \
    >>"$KILTER_PREEMPT_MARK"
fi
exit "$rc"
