#!/usr/bin/env bash
# tests/gpu/ranks-on-one-gpu.sh, the launcher of several ranks on one GPU (issue 40), on the CPU:
# the mpirun it runs (visibly --allow-run-as-root --oversubscribe), the environment every rank
# gets (a distinct NCCL_HOSTID from its local rank, NCCL kept on loopback sockets and off shared
# memory, P2P, IB, NVLS and network plugins, kilter's test-only switch), mpirun options and
# arguments passed through intact, refusals of a bad command line, and a kilter run through it.
source "$(dirname "$0")/lib.sh"
LAUNCH=$SRC/tests/gpu/ranks-on-one-gpu.sh

# The mpirun command line, through a stand-in that records it.
printf '#!/bin/sh\nprintf "%%s\\n" "$@" > mpirun-args\n' > fake-mpirun && chmod +x fake-mpirun
MPIEXEC=$PWD/fake-mpirun bash "$LAUNCH" 3 -x PROBE -- kilter train --x="a b"
for word in --allow-run-as-root --oversubscribe "-np" 3 -x PROBE --as-rank kilter "--x=a b"; do
  grep -qxF -- "$word" mpirun-args || { cat mpirun-args; fail "mpirun was not given '$word'"; }
done

# Each rank's environment, and its arguments.
PROBE=42 MPIEXEC=$MPIEXEC bash "$LAUNCH" 4 -x PROBE -- sh -c 'env > env.$OMPI_COMM_WORLD_RANK; printf "%s|" "$@" > args.$OMPI_COMM_WORLD_RANK' _ "a b" c
"$PY" - "$(uname -n)" <<'PY'
import sys
host = sys.argv[1]
expected = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_NET": "Socket", "NCCL_NET_PLUGIN": "none", "NCCL_IB_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_MNNVL_ENABLE": "0",
            "NCCL_RAS_ENABLE": "0", "KILTER_TEST_SHARE_DEVICE": "1", "PROBE": "42"}
host_ids = set()
for rank in range(4):
    env = dict(line.rstrip("\n").split("=", 1) for line in open(f"env.{rank}") if "=" in line)
    for key, value in expected.items():
        assert env.get(key) == value, f"rank {rank}: {key}={env.get(key)!r}, expected {value!r}"
    local = env["OMPI_COMM_WORLD_LOCAL_RANK"]
    assert env["NCCL_HOSTID"] == f"{host}-kilter-rank-{local}", (rank, env["NCCL_HOSTID"])
    host_ids.add(env["NCCL_HOSTID"])
    args = open(f"args.{rank}").read()
    assert args == "a b|c|", f"rank {rank}: arguments arrived as {args!r}"
assert len(host_ids) == 4, f"NCCL_HOSTIDs not distinct: {sorted(host_ids)}"
print("4 ranks: distinct NCCL_HOSTIDs", sorted(host_ids), "and the loopback/socket settings")
PY

# Refusals: no command, no "--", a rank count that is not one, the rank mode outside mpirun.
for bad in "2" "2 -- " "x -- env" "0 -- env" "2 env"; do
  rc=0; MPIEXEC=$PWD/fake-mpirun bash "$LAUNCH" $bad > bad.log 2>&1 || rc=$?
  [ $rc -eq 2 ] && grep -q "usage:" bad.log || { cat bad.log; fail "'$bad' was not refused with usage (exit $rc)"; }
done
rc=0; env -u OMPI_COMM_WORLD_LOCAL_RANK bash "$LAUNCH" --as-rank -- env > alone.log 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "no local rank" alone.log || { cat alone.log; fail "--as-rank outside mpirun was not refused"; }

# kilter through it (the CPU backend: the switch and host ids are inert there).
"$KILTER" prep synth --docs 40 --lengths uniform:20,80 --vocab 50 --shards 1 --seed 3 --out data >/dev/null
MPIEXEC=$MPIEXEC bash "$LAUNCH" 2 -- "$KILTER" train --data.dir=data --model.n_layer=1 --model.n_head=2 \
  --model.n_embd=16 --model.block_size=64 --data.max_tokens=256 --train.tokens_per_step=512 --train.steps=2 \
  --train.backend=cpu --output.dir=runs/two > two.log 2>&1 || { cat two.log; fail "kilter train through the launcher failed"; }
grep -q "2 ranks" two.log && grep -q "kilter: done: 2 steps" two.log || { cat two.log; fail "not a 2-rank run"; }
echo "ranks_on_one_gpu: 1 passed, 0 failed"
