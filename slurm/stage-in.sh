#!/bin/bash
# Node-local stage-in of a kilter dataset: copies SRC (index.h5 + shard-*.h5) to DEST on this
# node and verifies the copy with `kilter prep validate`, which checks every shard against the
# content hash recorded in index.h5. train.sbatch runs it once per node before the launch:
#   srun --nodes=N --ntasks=N --ntasks-per-node=1 stage-in.sh SRC DEST
# Reading shards from node-local NVMe keeps thousands of ranks from hammering the parallel file
# system with small preads during training; one sequential copy per node is what it handles well.
#
# Usage: stage-in.sh SRC DEST      (KILTER_BIN: the kilter binary, default: kilter on PATH)
# Exit: 0 when DEST holds a verified copy; 1 otherwise, with the node and the reason on stderr.
set -euo pipefail

node=$(hostname -s)
fail() { echo "stage-in[$node]: $*" >&2; exit 1; }

(( $# == 2 )) || fail "usage: stage-in.sh SRC DEST"
src=$1
dest=$2
kilter_bin=${KILTER_BIN:-kilter}
command -v "$kilter_bin" >/dev/null 2>&1 || fail "kilter binary '$kilter_bin' not found (load the kilter module or set KILTER_BIN)"
[[ -f $src/index.h5 ]] || fail "$src/index.h5 not found: is $src a kilter dataset (kilter prep --out)?"

validate() { "$kilter_bin" prep validate "$1" >"$2" 2>&1; }

# A copy left by an earlier run of this job on this node (a requeue that landed here again) is
# reused only if it still verifies.
if [[ -f $dest/.kilter-staged ]]; then
  if validate "$dest" "$dest.validate.log"; then
    echo "stage-in[$node]: $dest already holds a verified copy of $src"
    rm -f "$dest.validate.log"
    exit 0
  fi
  echo "stage-in[$node]: existing copy in $dest failed validation; copying again" >&2
  rm -rf "$dest"
fi

mkdir -p "$(dirname "$dest")"
need_kb=$(du -sk "$src" | awk '{print $1}')
free_kb=$(df -Pk "$(dirname "$dest")" | awk 'NR == 2 {print $4}')
if (( need_kb > free_kb )); then
  fail "$(dirname "$dest") has $((free_kb / 1024)) MiB free, the dataset $src needs $((need_kb / 1024)) MiB"
fi

# Copy into a temporary directory and rename it: DEST never holds a half-written dataset.
tmp="$dest.partial.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
start_ns=$(date +%s%N)
cp --preserve=timestamps "$src"/index.h5 "$src"/shard-*.h5 "$tmp"/ ||
  { rm -rf "$tmp"; fail "copying $src to $tmp failed"; }
copy_ns=$(( $(date +%s%N) - start_ns ))

if ! validate "$tmp" "$tmp.validate.log"; then
  cat "$tmp.validate.log" >&2
  rm -rf "$tmp" "$tmp.validate.log"
  fail "the copy of $src in $dest does not verify against its index (see above)"
fi
rm -f "$tmp.validate.log"
touch "$tmp/.kilter-staged"
rm -rf "$dest"
mv "$tmp" "$dest"

bytes=$(du -sb "$dest" | awk '{print $1}')
seconds=$(awk -v ns="$copy_ns" 'BEGIN {printf "%.2f", ns / 1e9}')
rate=$(awk -v b="$bytes" -v ns="$copy_ns" 'BEGIN {printf "%.1f", (ns > 0 ? b / 1048576 / (ns / 1e9) : 0)}')
echo "stage-in[$node]: $src -> $dest: $bytes bytes in $seconds s ($rate MiB/s), verified"
