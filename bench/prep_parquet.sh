#!/usr/bin/env bash
# `kilter prep` of a Parquet corpus against the same corpus as .jsonl.zst, and against a Python
# pipeline doing the same work (pyarrow reads the row groups, HF `tokenizers` encodes them with
# its own threads, the ids go to a flat uint16 file), side by side with ratios and peak RSS
# (/usr/bin/time -v). Each is timed with the tokenizer.json made from the corpus, and kilter's two
# also with its byte tokenizer (reading alone). Checked, not just timed: the Parquet and JSONL
# datasets have the same content hashes, and the Python pipeline counts the same tokens.
# The corpus is made here: documents of Zipf-distributed pseudo-words with log-normal lengths,
# written as Parquet (zstd, row groups of KILTER_BENCH_ROW_GROUP documents) and as .jsonl.zst.
#
# usage: bench/prep_parquet.sh [KILTER_BINARY]        (default build/kilter)
#   KILTER_BENCH_MB=1024         text size in MB (the issue's figure is at >= 1024)
#   KILTER_BENCH_THREADS=nproc   workers for all three
#   KILTER_BENCH_ROW_GROUP=8192  documents per Parquet row group
#   KILTER_BENCH_DIR=...         work folder (default a temporary one, removed at the end)
#   KILTER_BENCH_PYTHON=1        0: leave the Python pipeline out (it runs at ~1 MB/s on 2 cores)
#   KILTER_PYARROW_PYTHON=/opt/kilter/pyarrow-venv/bin/python (pyarrow + tokenizers: install-deps.sh --with-test-extras)
# Prints one line per run and the ratios; the machine's CPU with them.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
KILTER=$(readlink -f "${1:-$SRC/build/kilter}")
PQPY=${KILTER_PYARROW_PYTHON:-/opt/kilter/pyarrow-venv/bin/python}
MB=${KILTER_BENCH_MB:-1024}
THREADS=${KILTER_BENCH_THREADS:-$(nproc)}
ROW_GROUP=${KILTER_BENCH_ROW_GROUP:-8192}
[ -x /usr/bin/time ] || { echo "bench/prep_parquet.sh: /usr/bin/time is needed (Debian: apt-get install time)" >&2; exit 2; }
command -v zstd >/dev/null || { echo "bench/prep_parquet.sh: zstd is needed (Debian: apt-get install zstd)" >&2; exit 2; }
grep -q "^parquet: Apache Arrow" <<<"$("$KILTER" --version)" \
  || { echo "bench/prep_parquet.sh: $KILTER was built without Parquet input (scripts/install-deps.sh, then cmake)" >&2; exit 2; }
"$PQPY" -c "import pyarrow, tokenizers" || { echo "bench/prep_parquet.sh: $PQPY lacks pyarrow or tokenizers" >&2; exit 2; }
if [ -n "${KILTER_BENCH_DIR:-}" ]; then WORK=$KILTER_BENCH_DIR; mkdir -p "$WORK"; else
  WORK=$(mktemp -d /tmp/kilter-bench-parquet.XXXXXX); trap 'rm -rf "$WORK"' EXIT; fi
cd "$WORK"

if [ ! -f corpus.parquet ] || [ "$(cat corpus.mb 2>/dev/null)" != "$MB/$ROW_GROUP" ]; then
  echo "making a corpus of $MB MB of text (Parquet zstd, row groups of $ROW_GROUP documents, and .jsonl.zst) ..."
  "$PQPY" - "$MB" "$ROW_GROUP" <<'PY'
import json, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
target, row_group = int(sys.argv[1]) << 20, int(sys.argv[2])
rng = np.random.default_rng(7)
syllables = ["ka", "ri", "to", "ne", "su", "ma", "lo", "vi", "da", "pe", "qu", "ix", "or", "an", "el", "ström", "ñu", "ça"]
words = sorted({"".join(rng.choice(syllables, rng.integers(1, 5))) for _ in range(40000)})
words = np.array([w + p for w in words for p in (" ", " ", ", ", ". ")], dtype=object)
zipf = 1.0 / np.arange(1, len(words) + 1) ** 1.1
zipf /= zipf.sum()
writer = pq.ParquetWriter("corpus.parquet", pa.schema([("id", pa.int64()), ("text", pa.string())]), compression="zstd")
written, doc_id, sample = 0, 0, []
with open("corpus.jsonl", "w") as jsonl:
    while written < target:
        lengths = np.clip(rng.lognormal(5.6, 0.9, row_group).astype(int), 5, 20000)  # words per document
        flat = words[rng.choice(len(words), int(lengths.sum()), p=zipf)]
        ends = np.cumsum(lengths)
        texts = ["".join(flat[e - n:e]) for n, e in zip(lengths, ends)]
        writer.write_table(pa.table({"id": np.arange(doc_id, doc_id + len(texts)), "text": texts}), row_group_size=row_group)
        jsonl.write("".join(json.dumps({"id": int(doc_id + i), "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(texts)))
        written += sum(len(t.encode()) for t in texts)
        doc_id += len(texts)
        if len(sample) < 2000: sample.extend(texts[:200])
writer.close()
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tok.save("tokenizer.json")
print(f"  {doc_id} documents, {written / 1e6:.0f} MB of text")
PY
  zstd -q -f --rm -T"$THREADS" corpus.jsonl -o corpus.jsonl.zst
  echo "$MB/$ROW_GROUP" > corpus.mb
fi

cat > python_pipeline.py <<'PY'
# pyarrow + HF tokenizers: row group by row group, encode_batch on the tokenizer's threads
# (RAYON_NUM_THREADS), ids appended to a flat uint16 file; prints the documents and tokens.
import sys
import numpy as np, pyarrow.parquet as pq
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[2])
docs = tokens = 0
with open(sys.argv[3], "wb") as out:
    f = pq.ParquetFile(sys.argv[1])
    for g in range(f.num_row_groups):
        texts = [t for t in f.read_row_group(g, columns=["text"]).column(0).to_pylist() if t]
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            ids = np.asarray(enc.ids, dtype=np.uint16)
            if len(ids):
                out.write(ids.tobytes()); docs += 1; tokens += len(ids)
print(docs, tokens)
PY

declare -A SECONDS_OF RSS_OF
run() {  # run NAME COMMAND...: wall seconds and peak RSS (MB) of one run
  local name=$1; shift
  rm -rf "ds_$name"
  /usr/bin/time -v -o "$name.time" "$@" > "$name.out" 2> "$name.err" || { cat "$name.err" "$name.time" >&2; exit 1; }
  SECONDS_OF[$name]=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; ++i) s = s * 60 + t[i]; print s}' "$name.time")
  RSS_OF[$name]=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$name.time")
  printf "%-22s %8.2f s  %7.1f MB/s of text  peak RSS %6s MB\n" "$name" "${SECONDS_OF[$name]}" \
    "$(awk -v s="${SECONDS_OF[$name]}" -v b="$TEXT_BYTES" 'BEGIN {printf "%.1f", b / 1e6 / s}')" "${RSS_OF[$name]}"
}
TEXT_BYTES=$(zstd -l -v corpus.jsonl.zst 2>/dev/null | awk '/Decompressed Size/ {gsub(/[(),]/, "", $5); print $5; exit}')
[ -n "$TEXT_BYTES" ] || TEXT_BYTES=$((MB << 20))
lscpu | sed -n 's/^Model name: *//p' | head -1 | sed 's/^/CPU: /'
echo "corpus: $(du -m corpus.parquet | cut -f1) MB Parquet, $(du -m corpus.jsonl.zst | cut -f1) MB .jsonl.zst; $THREADS threads; rates count the JSONL's bytes ($((TEXT_BYTES / 1000000)) MB)"
PREP=(prep --shards 8 --quiet --threads "$THREADS")
run kilter_parquet_bpe "$KILTER" "${PREP[@]}" --input corpus.parquet --format parquet --tokenizer tokenizer.json --out ds_kilter_parquet_bpe
run kilter_jsonl_zst_bpe "$KILTER" "${PREP[@]}" --input corpus.jsonl.zst --format jsonl --tokenizer tokenizer.json --out ds_kilter_jsonl_zst_bpe
WITH_PYTHON=${KILTER_BENCH_PYTHON:-1}
if [ "$WITH_PYTHON" != 0 ]; then
  run python_pyarrow_bpe env RAYON_NUM_THREADS="$THREADS" "$PQPY" python_pipeline.py corpus.parquet tokenizer.json python.bin
fi
run kilter_parquet_bytes "$KILTER" "${PREP[@]}" --input corpus.parquet --format parquet --out ds_kilter_parquet_bytes
run kilter_jsonl_zst_bytes "$KILTER" "${PREP[@]}" --input corpus.jsonl.zst --format jsonl --out ds_kilter_jsonl_zst_bytes

# Checks: the same datasets from both inputs; the Python pipeline's token count is kilter's.
for kind in bpe bytes; do
  a=$(sed -n 's/.*documents, \([0-9]*\) tokens.*/\1/p' "kilter_parquet_$kind.out"); b=$(sed -n 's/.*documents, \([0-9]*\) tokens.*/\1/p' "kilter_jsonl_zst_$kind.out")
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: $kind: $a tokens from Parquet, $b from .jsonl.zst" >&2; exit 1; }
  "$KILTER" prep validate "ds_kilter_parquet_$kind" > /dev/null
done
k_tokens=$(sed -n 's/.*documents, \([0-9]*\) tokens.*/\1/p' kilter_parquet_bpe.out)
if [ "$WITH_PYTHON" != 0 ]; then
  py_tokens=$(awk '{print $2}' python_pyarrow_bpe.out)
  [ "$py_tokens" = "$k_tokens" ] || { echo "FAIL: the Python pipeline made $py_tokens tokens, kilter $k_tokens" >&2; exit 1; }
fi
if /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  for kind in bpe bytes; do
    /usr/bin/python3 -c "
import h5py, sys
a, b = (list(h5py.File(d + '/index.h5', 'r')['shard_hash'][:]) for d in sys.argv[1:])
sys.exit(0 if a == b else 1)" "ds_kilter_parquet_$kind" "ds_kilter_jsonl_zst_$kind" \
      || { echo "FAIL: $kind: the Parquet and .jsonl.zst datasets' content hashes differ" >&2; exit 1; }
  done
  echo "checked: Parquet and .jsonl.zst datasets have the same content hashes (bpe and bytes)$([ "$WITH_PYTHON" = 0 ] || echo "; the Python pipeline made the same $k_tokens tokens")"
else
  echo "checked: the same token counts (h5py not found: content hashes not compared)"
fi
ratio() { awk -v a="${SECONDS_OF[$1]}" -v b="${SECONDS_OF[$2]}" 'BEGIN {printf "%.2f", b / a}'; }
echo "speed, Parquet against .jsonl.zst (bpe):   $(ratio kilter_parquet_bpe kilter_jsonl_zst_bpe)x"
echo "speed, Parquet against .jsonl.zst (bytes): $(ratio kilter_parquet_bytes kilter_jsonl_zst_bytes)x"
[ "$WITH_PYTHON" = 0 ] || echo "speed, kilter Parquet against pyarrow + tokenizers: $(ratio kilter_parquet_bpe python_pyarrow_bpe)x"
