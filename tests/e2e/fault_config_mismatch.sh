#!/usr/bin/env bash
# A config mismatch between ranks (issue 8) — here rank 1 gets another --train.lr through an MPMD
# command line — is a clear error naming the ranks, on every rank, and the job ends (no hang).
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR

"$KILTER" prep synth --docs 60 --lengths lognormal:4,0.9,300 --vocab 97 --shards 2 --seed 7 --out data >/dev/null
COMMON=(--data.dir=data --model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.block_size=64
        --data.max_tokens=256 --train.tokens_per_step=1024 --train.steps=4 --output.dir=runs/m
        --output.trace_steps=0 --comm.timeout_s=30)
rc=0
timeout 120 "${MPIRUN[@]}" -np 1 "$KILTER" train "${COMMON[@]}" : \
  -np 1 "$KILTER" train "${COMMON[@]}" --train.lr=0.01 > mismatch.log 2>&1 || rc=$?
[ $rc -ne 0 ] || { cat mismatch.log; fail "ranks with different configs trained"; }
[ $rc -ne 124 ] || { cat mismatch.log; fail "the job hung until the timeout"; }
grep -q "ranks disagree on the configuration" mismatch.log || { cat mismatch.log; fail "no mismatch message"; }
grep -q "ranks 1" mismatch.log || { cat mismatch.log; fail "the differing rank is not named"; }
grep -m3 -A3 "ranks disagree" mismatch.log
echo "fault_config_mismatch: 1 passed, 0 failed"
