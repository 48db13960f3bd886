#!/usr/bin/env bash
# The GPU machine's NCCL check (tests/gpu/nccl-check.sh, issue 40) rehearsed on the CPU: its
# CPU/MPI reference runs, then its matrix (fp32: flat 2 ranks, hierarchical 2 x 2, cut pieces,
# fully sharded parameters in groups of 2 on 4 ranks, a checkpoint written on 4 ranks and resumed
# on 2) with train.backend=cpu through tests/gpu/ranks-on-one-gpu.sh, the three fault drills
# (a rank that dies, one that stalls, one that stalls under parameters), and the table, which must pass every row and
# fail its control row (a run's losses off by 5e-5). What only a GPU can show runs on one.
source "$(dirname "$0")/lib.sh"
export TMPDIR=$WORK  # the check's own temporary folders go with this test's
KILTER_BUILD=$(dirname "$KILTER") KILTER_NCCL_CARRY=$WORK/carry MPIEXEC=$MPIEXEC \
  bash "$SRC/tests/gpu/nccl-check.sh" --cpu --quick > check.log 2>&1 || { cat check.log; fail "nccl-check.sh --cpu --quick failed"; }
sed -n '/^max relative loss difference/,$p' check.log
grep -q "pass (control failed as it must)" check.log || { cat check.log; fail "the control row did not fail"; }
[ "$(grep -c "(4 ranks): ended after" check.log)" -eq 3 ] || { cat check.log; fail "the three drills did not all run"; }
grep -q "parameters, groups of 2 (HSDP 2x2)" check.log || { cat check.log; fail "the parameters row did not run"; }
echo "nccl_check_cpu: 1 passed, 0 failed"
