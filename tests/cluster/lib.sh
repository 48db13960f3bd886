# shellcheck shell=bash
# Shared by the `cluster` tests (sourced): each test gets the kilter binary as $1, stands up its
# own scripts/vcluster (nodes as network + mount + UTS namespaces), and tears it down on every
# exit, passing or failing; the teardown itself is checked (nothing of vcluster may be left).
# Without root or network namespaces the test is skipped (exit 77) with the reason.
set -euo pipefail
KILTER=$(readlink -f "$1")   # the kilter under test, for the sourcing test
export KILTER
SRC=${KILTER_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
VCLUSTER=$SRC/scripts/vcluster
PY=${KILTER_PYTHON:-/usr/bin/python3}
export OPENBLAS_NUM_THREADS=1
readonly LOCAL=/vcluster/local   # the node-local directory (scripts/vcluster's default)

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "the cluster tests need root (network and mount namespaces)"
for tool in ip tc nsenter unshare; do
  command -v "$tool" >/dev/null 2>&1 || skip "'$tool' is missing (scripts/install-deps.sh installs iproute2)"
done
unshare --net --mount --uts true 2>/dev/null ||
  skip "this machine does not allow network/mount/UTS namespaces ($(unshare --net true 2>&1 | head -n 1))"
probe_ns=kilter-probe-$$
if ! ip netns add "$probe_ns" 2>/dev/null; then
  skip "'ip netns add' fails here (no /run/netns or no CAP_SYS_ADMIN): $(ip netns add "$probe_ns" 2>&1 | head -n 1)"
fi
ip netns del "$probe_ns"
if ip netns list 2>/dev/null | grep -q '^vcluster-' || [[ -e /run/vcluster/nodes ]]; then
  skip "a vcluster is already up on this machine and the cluster tests need their own (scripts/vcluster down)"
fi

# /tmp is shared by all nodes (the cluster's "parallel file system"): the work directory lives there.
WORK=$(mktemp -d /tmp/kilter-cluster.XXXXXX)
chmod 0755 "$WORK"
cd "$WORK"

# Everything scripts/vcluster can leave behind, one line each; empty when the machine is clean.
vcluster_leftovers() {
  ip netns list 2>/dev/null | awk '/^vcluster-/ {print "network namespace " $1}'
  grep -- ' # vcluster$' /etc/hosts 2>/dev/null | sed 's/^/host entry: /' || true
  findmnt -rn -o TARGET 2>/dev/null | grep -E '^(/vcluster|/run/vcluster)' | sed 's/^/mount: /' || true
  [[ -e /run/vcluster ]] && echo "state directory /run/vcluster"
  [[ -e $LOCAL ]] && echo "directory $LOCAL"
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline") || continue
    case $cmd in
      vcluster-keeper*|*/run/vcluster/*) echo "process ${p#/proc/}: ${cmd:0:120}" ;;
    esac
  done
  return 0
}

cluster_cleanup() {
  local rc=$?
  set +e
  "$VCLUSTER" down >"$WORK/down.log" 2>&1 || { echo "FAIL: scripts/vcluster down failed:"; cat "$WORK/down.log"; rc=1; }
  local left
  left=$(vcluster_leftovers)
  if [[ -n $left ]]; then
    echo "FAIL: scripts/vcluster down left these behind:"
    echo "$left"
    rc=1
  fi
  if (( rc == 0 )) && [[ -z ${KILTER_KEEP_TEST_DIR:-} ]]; then rm -rf "$WORK"; else echo "test files kept in $WORK"; fi
  exit "$rc"
}
trap cluster_cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

vc() { "$VCLUSTER" "$@"; }
# mpirun across the nodes, bounded (a hang fails the test instead of blocking ctest).
vc_mpirun() {
  timeout 300 "$VCLUSTER" mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS "$@"
}
json_field() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
