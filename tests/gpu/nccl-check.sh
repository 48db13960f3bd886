#!/usr/bin/env bash
# kilter's NCCL paths on the one GPU of a lent machine (issue 40), within 8 minutes: 1, 2 and 4
# ranks on the one device, each an NCCL "host" of its own (tests/gpu/ranks-on-one-gpu.sh), train
# the same tiny configs as CPU/MPI runs made beforehand on a build machine (after
# kilter_gpu_nccl_test, the communicator's exact-sum collectives, then the parameter shards'
# exact gathers and reduce-scatters, on 2 and 4 ranks), the way tests/e2e/invariance.sh compares
# world sizes, in fp32 and bf16:
#   flat on 2 and 4 ranks; hierarchical on 4 ranks as 2 x 2 (comm.ranks_per_node = 2); ZeRO-1
#   sharded (the default on 2+ ranks) and unsharded; cut pieces, whose K/V exchange runs on NCCL
#   send/recv; fully sharded parameters (train.shard = parameters) in groups of 2 on 2 ranks and
#   on 4 (HSDP), under bf16 the 2-rank one (the bf16 working copy gathered alone) also against
#   `optimizer`'s distributed optimizer on the same ranks (a peer row, within 1e-4); a sharded
#   checkpoint written on 4 GPU ranks and resumed on 2.
# Each run's losses must match the 1-rank GPU run's (train.shard = none) and the CPU/MPI run's of
# the same config (tolerances in tests/gpu/nccl_compare.py). Then three fault drills on 4 ranks:
# rank 1 dies while the others reduce, rank 1 stalls, and rank 1 stalls under parameters; the
# others must end within comm.timeout_s plus a margin, naming rank 1 (under parameters, in the
# watchdog's section of the unit gathers). A table comes last; exit 0 when every row passed.
#
# The lent machine has the CUDA toolkit but no MPI, HDF5 or package registry, so the runs need a
# runtime carried from here: `--build-only` (on a build machine, after the CUDA build in
# $KILTER_BUILD, default build/) packs the stripped kilter, the shared libraries it and Open MPI
# need beyond glibc, libstdc++ and CUDA, and a relocatable Open MPI (mpirun, its components and
# help files, PMIx's) into build-nccl-carry/kilter-nccl.tar.xz, with the datasets and the CPU/MPI
# reference runs, and rehearses the unpacked runtime with the system's Open MPI, HDF5 and oneDNN
# hidden. NCCL itself (about 200 MB) does not travel: the machine's is used (the CUDA toolkit's,
# or PyTorch's nvidia-nccl wheel).
#
# usage: tests/gpu/nccl-check.sh [--build-only | --cpu] [--quick]
#   (none)        on the GPU machine: unpack $KILTER_NCCL_CARRY (default build-nccl-carry/), run
#   --build-only  on a build machine: pack the carry, make the CPU/MPI references, rehearse
#   --cpu         everything but the GPU here: the same matrix with train.backend=cpu, the build's
#                 kilter and the system's mpirun (references made first when missing), plus a
#                 control row with perturbed losses that must fail: proves the launcher, the
#                 drills and the table's logic and tolerances on a CPU
#   --quick       fp32 only, fewer rows (the CTest e2e_nccl_check_cpu runs --cpu --quick)
# With $OUT set (the device tool), the logs, metrics and table go to $OUT/nccl-check/.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${KILTER_NCCL_CARRY:-$root/build-nccl-carry}
build=${KILTER_BUILD:-$root/build}
mode=device quick=0
for arg in "$@"; do
  case "$arg" in
    --build-only) mode=build ;;
    --cpu) mode=cpu ;;
    --quick) quick=1 ;;
    *) echo "usage: $0 [--build-only | --cpu] [--quick]" >&2; exit 2 ;;
  esac
done
start=$SECONDS
say() { echo "== [$((SECONDS - start))s] $*"; }
die() { echo "nccl-check: $*" >&2; exit 1; }
source "$root/tests/gpu/nccl_check_lib.sh"

case $mode in
  build) pack_carry && make_references && rehearse_carry; exit $? ;;
  cpu) cpu_runtime ;;
  device) device_runtime ;;
esac
run_matrix
