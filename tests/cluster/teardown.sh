#!/usr/bin/env bash
# cluster (issue 15): scripts/vcluster down leaves nothing behind (no network namespace, veth,
# bridge, /etc/hosts entry, mount, state directory or daemon), also when
#   1. a cluster test fails with the cluster, Slurm and an MPI job up (its trap tears down);
#   2. the test is killed outright (SIGKILL: no trap runs) and down runs afterwards;
#   3. `vcluster up` itself is killed half-way, or fails half-way (it removes what it made);
#   4. vcluster's own bookkeeping (pid files, the "up" mark) is lost: down finds the leftovers
#      by name (vcluster-* namespaces, "# vcluster" host lines, munged's socket path).
source "$(dirname "$0")/lib.sh"
have_slurm=1
for tool in slurmctld slurmd munged; do command -v "$tool" >/dev/null 2>&1 || have_slurm=0; done
[[ -r /etc/munge/munge.key ]] || have_slurm=0
export have_slurm

expect_clean() {  # expect_clean WHAT: nothing of vcluster is left
  local left
  left=$(vcluster_leftovers)
  [[ -z $left ]] || { echo "$left"; fail "$1: left behind (above)"; }
  vc status | grep -q "^vcluster: down" || fail "$1: vcluster status does not say down"
  echo "ok: $1: nothing left (${SECONDS} s into the test)"
}
# A cluster with everything that can be up: nodes, Slurm, an MPI job spanning both nodes.
# Sourced by child shells; signals "busy" once the MPI job runs.
cat > busy.sh <<'BUSY'
source "$TEST_LIB" "$KILTER"
vc up --nodes 2 >/dev/null 2>&1
(( have_slurm )) && { vc slurm up >/dev/null 2>&1 || fail "vcluster slurm up failed"; }
vc_mpirun -np 4 --npernode 2 sleep 600 >/dev/null 2>&1 &
for (( i = 0; i < 100; i++ )); do
  (( $(ip netns pids vcluster-node2 | xargs -r ps -o args= -p | grep -c '^sleep 600$') == 2 )) && break
  sleep 0.2
done
(( i < 100 )) || fail "the MPI job's 2 ranks on node2 did not start"
echo busy > "$BUSY_MARK"
BUSY
export TEST_LIB=$SRC/tests/cluster/lib.sh KILTER

# ---- 1. a failing test tears down through its trap ---------------------------------------------------
rc=0
BUSY_MARK=$WORK/busy1 bash -c 'source busy.sh; [[ -f $BUSY_MARK ]] || exit 3; fail "deliberate failure with the cluster up"' \
  > child1.log 2>&1 || rc=$?
grep -q "FAIL: deliberate failure" child1.log || { cat child1.log; fail "1: the child did not reach its deliberate failure (exit $rc)"; }
(( rc == 1 )) || { cat child1.log; fail "1: the failing child exited $rc, expected 1"; }
grep -q "left these behind" child1.log && { cat child1.log; fail "1: the failing test's teardown left something"; }
expect_clean "1 (failing test)"

# ---- 2. the test is killed outright ------------------------------------------------------------------
BUSY_MARK=$WORK/busy2 setsid bash -c 'source busy.sh; sleep 600' > child2.log 2>&1 &
child=$!
for (( i = 0; i < 300; i++ )); do [[ -f busy2 ]] && break; sleep 0.2; done
[[ -f busy2 ]] || { cat child2.log; fail "2: the cluster did not come up"; }
kill -KILL -- -"$child"   # the child's whole process group: no trap, nothing cleaned
wait "$child" 2>/dev/null || true
[[ -n $(ip netns list | grep '^vcluster-') ]] || fail "2: killing the test removed the cluster (the drill needs leftovers)"
vc down > down2.log 2>&1 || { cat down2.log; fail "2: vcluster down failed"; }
expect_clean "2 (test killed)"

# ---- 3. vcluster up killed half-way ------------------------------------------------------------------
vc up --nodes 4 > up3.log 2>&1 &
up_pid=$!
for (( i = 0; i < 100; i++ )); do
  [[ -n $(ip netns list | grep '^vcluster-node2') ]] && break
  sleep 0.05
done
kill -KILL "$up_pid" 2>/dev/null || true
wait "$up_pid" 2>/dev/null || true
vc down > down3.log 2>&1 || { cat down3.log; fail "3: vcluster down failed"; }
expect_clean "3 (up killed half-way)"
# An address the kernel refuses fails `up` after the namespaces and links exist.
if VCLUSTER_NET=10.213.300 vc up --nodes 2 > up3b.log 2>&1; then fail "3b: up with a bad subnet succeeded"; fi
grep -q "up failed; removing what was made" up3b.log || { cat up3b.log; fail "3b: the failed up did not clean up"; }
expect_clean "3b (up failed half-way)"

# ---- 4. bookkeeping lost --------------------------------------------------------------------------------
BUSY_MARK=$WORK/busy4 bash -c 'source busy.sh; trap - EXIT' > child4.log 2>&1 || { cat child4.log; fail "4: setup failed"; }
rm -f /run/vcluster/nodes /run/vcluster/node*/keeper.pid /run/vcluster/slurm/*.pid /run/vcluster/slurm/munge/munged.pid
vc down > down4.log 2>&1 || { cat down4.log; fail "4: vcluster down failed"; }
expect_clean "4 (bookkeeping lost)"
vc down > down5.log 2>&1 || fail "a second vcluster down (nothing to do) failed"
expect_clean "5 (down twice)"
echo "PASS: cluster teardown"
