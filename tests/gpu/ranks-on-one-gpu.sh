#!/usr/bin/env bash
# Several MPI ranks on one GPU, each an NCCL "host" of its own (issue 40), so that every NCCL
# call kilter makes (communicator set-up through MPI, reduce-scatter, allreduce, all-gather,
# send/recv of the K/V exchange, abort) runs for real on a machine with a single GPU. NCCL refuses
# two ranks on one device when it sees them on one host ("Duplicate GPU detected": it compares host
# hash and bus id); a distinct NCCL_HOSTID per rank gives each rank a host hash of its own, and NCCL
# then joins the ranks with its network transport: Socket, over loopback. The speed means nothing;
# the code paths and their numerics are real. A test layout only: kilter refuses ranks that share
# a device unless KILTER_TEST_SHARE_DEVICE=1 is set, as here, together with the per-rank host id.
#
# usage: tests/gpu/ranks-on-one-gpu.sh NP [MPIRUN OPTIONS...] -- COMMAND [ARGS...]
#   e.g. tests/gpu/ranks-on-one-gpu.sh 4 -- build/kilter train --train.backend=cuda ...
# mpirun is $MPIEXEC (default: mpirun on PATH) with --allow-run-as-root --oversubscribe (test
# machines run as root, and several ranks share the cores) and --bind-to none. Every rank runs
# COMMAND through this script's --as-rank mode, which sets, from the rank's local rank:
#   NCCL_HOSTID=<host>-kilter-rank-<local rank>   a "host" per rank
#   NCCL_SOCKET_IFNAME=lo NCCL_NET=Socket          bootstrap and data over loopback sockets
#   NCCL_NET_PLUGIN=none NCCL_IB_DISABLE=1         no network plugin found in the image, no IB
#   NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1          nor shared memory or P2P between the "hosts"
#                                                  (NCCL uses neither across hosts anyway)
#   NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0         no NVLink SHARP or multi-node NVLink probing
#   NCCL_RAS_ENABLE=0                              no RAS listener per process on one machine
#   KILTER_TEST_SHARE_DEVICE=1                     kilter's test-only switch (lib/comm/device_sharing.h)
# No setting of the GPU changes (no MPS daemon, no MIG, no clocks): the ranks' CUDA contexts
# time-share the device, which a GPU in the Exclusive_Process compute mode refuses.
set -euo pipefail
self=$(readlink -f "${BASH_SOURCE[0]}")

usage() {
  echo "usage: $0 NP [MPIRUN OPTIONS...] -- COMMAND [ARGS...]" >&2
  exit 2
}

if [[ ${1:-} == --as-rank ]]; then
  shift
  [[ ${1:-} == -- ]] && shift
  local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${MPI_LOCALRANKID:-${MV2_COMM_WORLD_LOCAL_RANK:-${PMI_LOCAL_RANK:-}}}}}
  if [[ -z $local_rank ]]; then
    echo "ranks-on-one-gpu.sh: no local rank in the environment (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, ...):" \
         "run it under mpirun through $self NP -- COMMAND" >&2
    exit 2
  fi
  export NCCL_HOSTID="$(uname -n)-kilter-rank-$local_rank"
  export NCCL_SOCKET_IFNAME=lo NCCL_NET=Socket NCCL_NET_PLUGIN=none NCCL_IB_DISABLE=1
  export NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 NCCL_RAS_ENABLE=0
  export KILTER_TEST_SHARE_DEVICE=1
  exec "$@"
fi

[[ $# -ge 3 && ${1:-} =~ ^[1-9][0-9]*$ ]] || usage
np=$1
shift
mpirun_options=()
while [[ $# -gt 0 && $1 != -- ]]; do
  mpirun_options+=("$1")
  shift
done
[[ ${1:-} == -- && $# -ge 2 ]] || usage
shift
exec "${MPIEXEC:-mpirun}" --allow-run-as-root --oversubscribe --bind-to none -np "$np" "${mpirun_options[@]}" \
  bash "$self" --as-rank -- "$@"
