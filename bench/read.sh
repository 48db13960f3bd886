#!/usr/bin/env bash
# Reader throughput vs a plain sequential read of the same shard files, in one run.
#   bench/read.sh BUILD_DIR [TOKENS_MILLIONS=100] [THREADS=2] [PIECE=1024] [GROUP=65536]
# Prepares a synthetic dataset (uint16 tokens, lognormal lengths) of TOKENS_MILLIONS million
# tokens (~2 bytes each) in a scratch directory, reads every shard once to put it in the page
# cache (dropping caches needs root and a quiet machine, so both rates below are page-cache
# rates), then times `dd bs=4M` over the shard files and the reader streaming every token as
# context-sized pieces (groups of GROUP tokens, in document order). Prints both as tokens/s and their ratio. The reader's run checks the
# count and sum of the tokens it delivered against an independent HDF5 read.
set -euo pipefail
BUILD=$(readlink -f "${1:?usage: bench/read.sh BUILD_DIR [TOKENS_MILLIONS] [THREADS] [PIECE]}")
MTOKENS=${2:-100}
THREADS=${3:-2}
PIECE=${4:-1024}
GROUP=${5:-65536}   # tokens per micro-batch group
KILTER=$BUILD/kilter
BENCH=$BUILD/io_read_bench
[[ -x $KILTER && -x $BENCH ]] || { echo "build kilter and io_read_bench in $BUILD first" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kilter-read-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# lognormal:6,1,4096 has a mean of about 660 tokens per document.
DOCS=$(( MTOKENS * 1000000 / 660 ))
"$KILTER" prep synth --docs "$DOCS" --lengths lognormal:6,1,4096 --vocab 50257 --shards 4 \
  --seed 1 --out "$WORK/ds" --quiet
TOKENS=$("$KILTER" prep validate "$WORK/ds" | sed -n 's/.* documents, \([0-9]*\) tokens.*/\1/p')
BYTES=$(cat "$WORK"/ds/shard-*.h5 | wc -c)
echo "dataset: $TOKENS tokens in 4 shards, $BYTES bytes (validated)"

cat "$WORK"/ds/shard-*.h5 > /dev/null   # warm the page cache for both measurements

now() { date +%s.%N; }
# Best of ROUNDS for each, alternating dd and the reader so that both see the same machine
# (shared build machines are noisy; the best round is the least disturbed one).
ROUNDS=${ROUNDS:-3}
DD_SECONDS=""
READER_TPS=0
for round in $(seq "$ROUNDS"); do
  t0=$(now)
  for f in "$WORK"/ds/shard-*.h5; do dd if="$f" of=/dev/null bs=4M status=none; done
  t1=$(now)
  s=$(echo "$t1 - $t0" | bc -l)
  if [[ -z $DD_SECONDS ]] || (( $(echo "$s < $DD_SECONDS" | bc -l) )); then DD_SECONDS=$s; fi
  out=$("$BENCH" "$WORK/ds" --piece "$PIECE" --threads "$THREADS" --prefetch 4 --group "$GROUP")
  echo "round $round: $(echo "$out" | head -1)"
  echo "$out" | grep -q "check OK" || { echo "reader check failed" >&2; exit 1; }
  tps=$(echo "$out" | sed -n 's/^reader_tokens_per_s //p')
  if (( $(echo "$tps > $READER_TPS" | bc -l) )); then READER_TPS=$tps; fi
done

DD_TPS=$(echo "$TOKENS / $DD_SECONDS" | bc -l)
printf "dd bs=4M (page cache, best of %d): %.3f s = %.1f Mtokens/s (%.0f MB/s)\n" "$ROUNDS" "$DD_SECONDS" \
  "$(echo "$DD_TPS / 1000000" | bc -l)" "$(echo "$BYTES / $DD_SECONDS / 1000000" | bc -l)"
printf "reader   (page cache, best of %d): %.1f Mtokens/s (%d threads, pieces <= %d, groups of ~%d tokens)\n" \
  "$ROUNDS" "$(echo "$READER_TPS / 1000000" | bc -l)" "$THREADS" "$PIECE" "$GROUP"
printf "ratio reader/dd: %.2f\n" "$(echo "$READER_TPS / $DD_TPS" | bc -l)"
