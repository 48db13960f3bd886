#!/usr/bin/env bash
# The no-hang invariant covers the K/V exchange of cut pieces (issue 23; docs/design.md, invariant 4):
# a rank that holds an EARLIER part of a cut piece (or, kv_hang_backward, a LATER part) and stops
# mid-step, inside the exchange (right
# before it sends layer 1's K/V, after layer 0's went out), ends the job within comm.timeout_s
# plus a margin, non-zero, and the message names that rank and the piece. The test hook
# (lib/train/guards.h, KILTER_TEST_FAIL_MODE kv_hang | kv_exit) fires on rank 1 at the first step
# >= 2 where rank 1 holds an earlier part, and prints which piece it held back:
#   kv_hang  the rank stops taking part -> the rank holding the later part waits comm.timeout_s
#            in its forward_wait and ends the job naming rank 1 and the piece's tokens
#   kv_exit  the process dies without MPI_Abort (like a crash) -> the launcher ends the job
#   kv_hang_backward  the mirror: rank 1 holds a LATER part and stops in its backward before it
#            sends layer 1's dK/dV of that part's prefix -> the rank holding the earlier part waits
#            comm.timeout_s in its backward_wait_add and ends the job naming rank 1 and the document
# Coarse steps (one context per rank) over skewed lengths, so most steps cut pieces; the time
# bound is a coarse no-hang check (timeout_s + 40 s), not a performance assertion.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 300 --lengths lognormal:4.5,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
TIMEOUT_S=5
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=128 --train.tokens_per_step=256 --train.steps=40 --data.cost_calibration=off --output.trace_steps=0
        --comm.device_tflops=0.1 --comm.timeout_s=$TIMEOUT_S)

inject() {  # inject MODE
  local mode=$1 hook piece
  drill $mode 1 2 4 $((TIMEOUT_S + 40)) $mode
  hook=$(grep -m1 "rank 1: KILTER_TEST_FAIL_MODE=$mode at step" $mode.log) \
    || { cat $mode.log; fail "$mode: the drill did not fire (rank 1 held no part of a cut piece of that kind)"; }
  # "to rank R: document D, tokens A-B (part at offset 0 ...": the earlier part held back
  piece=$(echo "$hook" | grep -o "to rank [0-9]*: document [0-9]*, tokens [0-9]*-[0-9]*" | head -1) \
    || fail "$mode: the hook names no piece: $hook"
  echo "$hook"
  if [ $mode = kv_hang_backward ]; then
    # The rank holding the earlier part names rank 1 and the document whose dK/dV it held back.
    local msg doc
    msg=$(grep -m1 -o "K/V exchange: step [0-9]*, micro-batch [0-9]*, layer 1 (backward): rank [0-9]* waited $TIMEOUT_S s (comm.timeout_s) for the dK/dV of rank 1 \[document [0-9]*," $mode.log) \
      || { cat $mode.log; fail "$mode: no message naming rank 1 and the piece whose dK/dV it held back"; }
    doc=${msg##*\[}
    [[ $hook == *": ${doc%,},"* ]] || { cat $mode.log; fail "$mode: the message names ${doc%,}, which rank 1 did not hold back"; }
    echo "$msg"
  elif [ $mode = kv_hang ]; then
    # A rank holding a later part names rank 1 and earlier tokens the hook says it held back.
    local msg named
    msg=$(grep -m1 -o "rank [0-9]*: K/V exchange: step [0-9]*, micro-batch [0-9]*, layer 1 (forward): rank [0-9]* waited $TIMEOUT_S s (comm.timeout_s) for the K/V of rank 1 \[document [0-9]*, tokens [0-9]*-[0-9]*" $mode.log) \
      || { cat $mode.log; fail "$mode: no message naming rank 1 and the piece it held back"; }
    named=${msg##*\[}
    [[ $hook == *": $named ("* ]] || { cat $mode.log; fail "$mode: the message names $named, which rank 1 did not hold back"; }
  else
    grep -q "Process name: \[\[[0-9]*,[0-9]*\],1\]" $mode.log || { cat $mode.log; fail "$mode: the launcher does not name rank 1"; }
  fi
  echo "$mode: every rank ended $DRILL_SECONDS s after start (exit $DRILL_RC); held back: $piece"
}
inject kv_hang
inject kv_exit
inject kv_hang_backward
echo "fault_kv_exchange: 1 passed, 0 failed"
