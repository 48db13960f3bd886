#!/usr/bin/env bash
# cluster (issue 15): losing a node mid-run ends the whole job (docs/design.md invariant 4, across
# real nodes). A 2 nodes x 2 run is started on scripts/vcluster and, once it trains, node2 is lost:
#   1. its link goes down (`ip link set eth0 down` in node2): the ranks of node1 wait in the
#      gradient reduction, their watchdog fires after comm.timeout_s and names ranks 2 and 3 as
#      not arrived, on host node2; mpirun ends with a non-zero exit;
#   2. its kilter processes are killed (SIGKILL): mpirun ends the job, non-zero, naming node2 and
#      the rank it lost.
# Each must end within comm.timeout_s plus a margin (the bound tells an ended job from a hung one;
# the time taken is printed).
source "$(dirname "$0")/lib.sh"

readonly timeout_s=5
readonly margin_s=40   # TCP gives up on node2 (tcp_retries2 = 3 in vcluster, ~3 s) + mpirun's teardown
vc up --nodes 2
"$KILTER" prep synth --docs 400 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 3 --out data >/dev/null
COMMON=(--data.dir="$WORK/data" --model.n_layer=1 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=100000 --train.warmup=1
        --output.log_every=1 --output.checkpoint_every=0 "--comm.timeout_s=$timeout_s")

# start NAME: the job in the background (its pid in $job_pid), waiting until it logged step 3.
start() {
  vc_mpirun -np 4 --npernode 2 "$KILTER" train "${COMMON[@]}" --output.dir="$WORK/runs/$1" > "$1.log" 2>&1 &
  job_pid=$!
  local waited
  for (( waited = 0; waited < 240; waited++ )); do
    grep -q "^step      3/" "$1.log" && return 0
    kill -0 "$job_pid" 2>/dev/null || { cat "$1.log"; fail "$1: the job ended before step 3"; }
    sleep 0.5
  done
  cat "$1.log"
  fail "$1: no step 3 within 120 s"
}
# finish NAME T0: waits (bounded) for the job; checks a non-zero exit; prints the time taken.
finish() {
  local name=$1 t0=$2 rc=0 waited
  for (( waited = 0; waited < (timeout_s + margin_s) * 4; waited++ )); do
    kill -0 "$job_pid" 2>/dev/null || break
    sleep 0.25
  done
  if kill -0 "$job_pid" 2>/dev/null; then
    cat "$name.log"
    fail "$name: the job still runs $(( timeout_s + margin_s )) s after node2 was lost (comm.timeout_s = $timeout_s)"
  fi
  wait "$job_pid" || rc=$?
  local elapsed
  elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  (( rc != 0 )) || { cat "$name.log"; fail "$name: the job exited 0 after losing node2"; }
  echo "$name: the job ended $elapsed s after node2 was lost, exit $rc (comm.timeout_s = $timeout_s)"
}

# ---- 1. node2's link goes down ------------------------------------------------------------------------
start link
t0=$(date +%s.%N)
ip -n vcluster-node2 link set eth0 down
finish link "$t0"
# The first bounded wait to expire names node2's ranks: the watchdog of a collective, or, where the
# step holds a piece cut between the nodes (data.cut_pieces, the default), the K/V exchange's wait.
grep -E "kilter: rank [01]: .* has not completed after [0-9]+ s; ranks not arrived: 2 \(no answer\), 3 \(no answer\) \[by host: node2: 2,3\]" link.log ||
  grep -E "rank [01]: K/V exchange: .* rank [01] waited [0-9.]+ s \(comm.timeout_s\) for the (K/V|dK/dV) of rank [23] " link.log ||
  { cat link.log; fail "link: no watchdog or K/V exchange message from node1's ranks naming node2's ranks"; }
echo "ok: link down: node1's ranks named node2's ranks"

# ---- 2. node2's kilter processes are killed ------------------------------------------------------------
vc down >/dev/null 2>&1   # a fresh cluster: node2's orted from the first part is stranded
vc up --nodes 2
start kill
victims=()
for pid in $(ip netns pids vcluster-node2); do
  [[ $(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline") == "$KILTER train "* ]] && victims+=("$pid")
done
(( ${#victims[@]} == 2 )) || fail "kill: expected 2 kilter ranks on node2, found ${#victims[@]}"
t0=$(date +%s.%N)
kill -KILL "${victims[@]}"
finish kill "$t0"
grep -E "process rank [23] .* on node node2 exited on signal 9" kill.log ||
  { cat kill.log; fail "kill: no message naming node2 and the rank it lost"; }
echo "ok: killed ranks on node2: the job ended, naming node2 and its rank"
echo "PASS: cluster node loss"
