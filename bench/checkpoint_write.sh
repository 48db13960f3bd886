#!/usr/bin/env bash
# What a sharded checkpoint costs (issue 24, docs/checkpoints.md "Sharded checkpoints"), side by
# side: one training step on NP ranks with train.shard_optimizer=true, ending with its checkpoint,
# for each kilter build given (e.g. this tree and one from before checkpoints were written by
# slices). For each: the run's wall time, the last checkpoint's cost as kilter prints it (how long
# the step waited, how long rank 0's writer took; older builds do not print it), and every rank's
# peak RSS (getrusage through time(1)). Then the checkpoints of the builds are compared
# bit for bit (params and both moments), when there are two.
#
# usage: bench/checkpoint_write.sh BUILD_DIR [OTHER_BUILD_DIR]
# env:   NP=2 LAYERS=12 EMBD=768 HEADS=12 (GPT-2 124M's shape, vocabulary 8192) REPEATS=1
#        SHARD=true (false: the unsharded writer, rank 0's snapshot, for comparison)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [OTHER_BUILD_DIR]" >&2; exit 2; }
builds=()
for b in "$@"; do builds+=("$(readlink -f "$b")"); done
np=${NP:-2}
repeats=${REPEATS:-1}
python=${PYTHON:-/usr/bin/python3}
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
work=$(mktemp -d /tmp/kilter-bench-ckpt.XXXXXX)
trap 'rm -rf "$work"' EXIT
first=$(readlink -f "${builds[0]}/kilter")
cd "$work"
echo "# checkpoint_write: $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), NP=$np," \
     "model ${LAYERS:-12} x ${EMBD:-768}, shard_optimizer ${SHARD:-true}"
"$first" prep synth --docs 400 --lengths lognormal:4.5,1.0,256 --vocab 8192 --shards 2 --seed 1 --out data >/dev/null 2>&1
args=(--data.dir=data --model.n_layer="${LAYERS:-12}" --model.n_embd="${EMBD:-768}" --model.n_head="${HEADS:-12}"
      --model.block_size=256 --data.max_tokens=256 --train.tokens_per_step=512 --train.steps=1
      --train.shard_optimizer="${SHARD:-true}" --output.trace_steps=0 --output.log_every=1 --comm.timeout_s=600)

for r in $(seq "$repeats"); do
  for i in "${!builds[@]}"; do
    kilter=${builds[$i]}/kilter
    name=b$i-$r
    start=$(date +%s.%N)
    "${mpirun[@]}" -np "$np" bash -c 'exec /usr/bin/time -o "$0.rss.$OMPI_COMM_WORLD_RANK" -f %M "$@"' \
      "$name" "$kilter" train "${args[@]}" --output.dir="runs/$name" > "$name.log" 2>&1 \
      || { cat "$name.log"; echo "FAIL: $name" >&2; exit 1; }
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    rss=""
    for k in $(seq 0 $((np - 1))); do rss+=" rank $k $(( $(tail -1 "$name.rss.$k") / 1024 )) MiB,"; done
    cost=$(grep -o "checkpoint .*writer took .*" "$name.log" | sed 's/^checkpoint [^:]*: //' || true)
    echo "${builds[$i]} (run $r): wall $(printf %.1f "$wall") s; peak RSS${rss%,}; ${cost:-no cost line (older build)}"
  done
done
if [ ${#builds[@]} -ge 2 ]; then
  "$python" - <<'PY'
import glob, h5py, numpy as np
a, b = (sorted(glob.glob(f"runs/b{i}-1/checkpoints/step-*.h5"))[-1] for i in (0, 1))
with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
    for group in ["params", "adam/m", "adam/v"]:
        for k in fa[group]:
            assert np.array_equal(fa[group][k][...].view(np.uint32), fb[group][k][...].view(np.uint32)), f"/{group}/{k}"
            assert fa[group][k].attrs["checksum"] == fb[group][k].attrs["checksum"], f"/{group}/{k} checksum"
print("the two builds' checkpoints are bit-identical (tensors and checksums)")
PY
fi
