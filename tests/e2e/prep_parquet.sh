#!/usr/bin/env bash
# `kilter prep --format parquet` end to end: Parquet files that pyarrow writes here (several row
# groups; snappy, zstd and gzip; a struct column; null cells and empty strings) prep to the same
# dataset, token for token and hash for hash, as the same texts given as JSONL, with the byte
# tokenizer and with a tokenizer.json; --threads 1 and 2 give the same dataset; a folder, a
# quoted glob and the files listed agree; the skipped cells are counted in one line; a file cut
# short, a damaged row group and a wrong column name each give one error naming the file (and the
# row group). Arrow IPC input (--format arrow), as a file (Feather v2) and as a stream (Hugging
# Face datasets' cache files), gives the same dataset too. Skipped (exit 77) where kilter was
# built without Parquet or no python has pyarrow.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
PQPY=${KILTER_PYARROW_PYTHON:-/opt/kilter/pyarrow-venv/bin/python}
if grep -q "^parquet: not built" <<<"$("$KILTER" --version)"; then
  echo "SKIP: this kilter was built without Parquet input (scripts/install-deps.sh, then cmake with ENABLE_PARQUET=AUTO)"
  exit 77
fi
"$PQPY" -c "import pyarrow, tokenizers" 2>/dev/null \
  || { echo "SKIP: no python with pyarrow and tokenizers at $PQPY (scripts/install-deps.sh --with-test-extras)"; exit 77; }

"$PQPY" - <<'PY'
import json, os, random
import pyarrow as pa, pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
random.seed(11)
words = ["alpha", "beta", "gamma", "délta", "épsilon", "zeta", "日本", "théta", "iota", "kappa", "\n", "\t"]
def text():
    n = random.choice([1, 3, 20, 200, 2000])
    return " ".join(random.choice(words) for _ in range(random.randint(1, n)))
os.makedirs("pq")
ids, texts, metas = [], [], []
for i in range(3000):
    t = text()
    if i % 37 == 5: t = None
    elif i % 41 == 7: t = ""
    m = {"content": t.upper() if t else t, "lang": "x"}
    if i % 53 == 9: m = None  # a null struct: its content is null too
    ids.append(i); texts.append(t); metas.append(m)
table = pa.table({"id": ids, "text": texts, "meta": metas})
# Three files, each its own codec and row-group size.
for k, (codec, rows) in enumerate([("snappy", 97), ("zstd", 250), ("gzip", 1000)]):
    pq.write_table(table.slice(k * 1000, 1000), f"pq/part-{k}.parquet", row_group_size=rows, compression=codec)
    assert pq.ParquetFile(f"pq/part-{k}.parquet").metadata.num_row_groups > 1 or rows >= 1000
with open("text.jsonl", "w") as f:
    for t in texts:
        if t: f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
with open("meta.jsonl", "w") as f:
    for m in metas:
        if m and m["content"]: f.write(json.dumps({"meta": {"content": m["content"]}}, ensure_ascii=False) + "\n")
nulls = sum(t is None for t in texts); empty = sum(t == "" for t in texts)
mnulls = sum(m is None or m["content"] is None for m in metas); mempty = sum(m is not None and m["content"] == "" for m in metas)
open("expected_skips", "w").write(f"{nulls} {empty} {mnulls} {mempty}\n")
# A damaged row group: the page header of row group 2's text column in part-0 overwritten.
raw = bytearray(open("pq/part-0.parquet", "rb").read())
col = pq.ParquetFile("pq/part-0.parquet").metadata.row_group(2).column(1)
start = col.dictionary_page_offset or col.data_page_offset
raw[start:start + 16] = b"\xff" * 16
open("damaged.parquet", "wb").write(bytes(raw))
open("cut.parquet", "wb").write(open("pq/part-1.parquet", "rb").read()[:-100])
# Arrow IPC: the file format in batches of 700 rows, and the stream format (datasets' cache files).
os.makedirs("ipc")
with pa.ipc.new_file("ipc/a.arrow", table.schema) as w:
    for batch in table.to_batches(max_chunksize=700): w.write_batch(batch)
with pa.ipc.new_stream("ipc/b.arrow", table.schema) as w:
    for batch in table.to_batches(max_chunksize=1100): w.write_batch(batch)
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator([t for t in texts if t], trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save("tokenizer.json")
PY
read -r nulls empty mnulls mempty < expected_skips

prep() {  # prep OUT ARGS...: a prep that must succeed; its stderr in OUT.err
  local out=$1; shift
  "$KILTER" prep --shards 3 --out "$out" --quiet "$@" > "$out.out" 2> "$out.err" || { cat "$out.err"; fail "prep $out"; }
}
prep bytes_jsonl --input text.jsonl
prep bytes_pq --input pq --format parquet
prep bytes_glob --input 'pq/*.parquet'
prep bytes_files --input pq/part-0.parquet pq/part-1.parquet pq/part-2.parquet --threads 1
prep bytes_meta_jsonl --input meta.jsonl --text-key meta.content
prep bytes_meta_pq --input pq --format parquet --text-key meta.content --threads 2
prep bpe_jsonl --input text.jsonl --tokenizer tokenizer.json
prep arrow_file --input ipc/a.arrow
prep arrow_stream --input ipc/b.arrow --format arrow
prep arrow_meta --input ipc --format arrow --text-key meta.content
prep bpe_pq1 --input pq --format parquet --tokenizer tokenizer.json --threads 1
prep bpe_pq2 --input pq --format parquet --tokenizer tokenizer.json --threads 2
grep -qx "prep: skipped $nulls null and 0 non-string cells of the text column (and $empty empty strings)" bytes_pq.err \
  || { cat bytes_pq.err; fail "the skipped cells' line (expected $nulls null, $empty empty)"; }
grep -qx "prep: skipped $mnulls null and 0 non-string cells of the text column (and $mempty empty strings)" bytes_meta_pq.err \
  || { cat bytes_meta_pq.err; fail "the nested column's skipped cells (expected $mnulls null, $mempty empty)"; }

"$PY" - <<'PY'
import h5py, numpy as np
def load(d):
    index = h5py.File(f"{d}/index.h5", "r")
    shards = [h5py.File(f"{d}/shard-{s:05d}.h5", "r") for s in range(3)]
    return (list(index["shard_hash"][:]), [s["tokens"][:] for s in shards], [s["offsets"][:] for s in shards],
            index.attrs["tokenizer"])
pairs = [("bytes_jsonl", "bytes_pq"), ("bytes_jsonl", "bytes_glob"), ("bytes_jsonl", "bytes_files"),
         ("bytes_meta_jsonl", "bytes_meta_pq"), ("bpe_jsonl", "bpe_pq1"), ("bpe_jsonl", "bpe_pq2"),
         ("bytes_jsonl", "arrow_file"), ("bytes_jsonl", "arrow_stream")]
for a, b in pairs:
    ha, ta, oa, ka = load(a)
    hb, tb, ob, kb = load(b)
    assert ha == hb, f"{a} and {b}: content hashes differ"
    assert ka == kb, (ka, kb)
    for s in range(3):
        assert ta[s].dtype == tb[s].dtype and np.array_equal(ta[s], tb[s]), f"{a} and {b}: shard {s} tokens differ"
        assert np.array_equal(oa[s], ob[s]), f"{a} and {b}: shard {s} offsets differ"
assert load("bpe_pq1")[3] in ("hf-bpe", b"hf-bpe"), load("bpe_pq1")[3]
docs = sum(len(o) - 1 for o in load("bytes_pq")[2])
# Both IPC files hold the corpus once each: twice the JSONL's documents, in order.
ha, ta, _, _ = load("arrow_meta")
hm, tm, _, _ = load("bytes_meta_jsonl")
assert np.array_equal(np.concatenate(ta), np.concatenate(tm + tm)), "arrow_meta: not the nested column twice"
print(f"prep_parquet: {len(pairs)} Parquet and Arrow datasets equal their JSONL twins ({docs} documents), threads 1 = 2")
PY

one_error() {  # one_error NAME PATTERN ARGS...: prep fails (exit 1) with one line matching PATTERN
  local name=$1 pattern=$2; shift 2
  local rc=0
  "$KILTER" prep --out "err_$name" --quiet "$@" > "$name.out" 2> "$name.err" || rc=$?
  [ $rc -eq 1 ] || { cat "$name.err"; fail "$name: exit code $rc, expected 1"; }
  [ "$(wc -l < "$name.err")" -eq 1 ] || { cat "$name.err"; fail "$name: more than one line on stderr"; }
  grep -q -- "$pattern" "$name.err" || { cat "$name.err"; fail "$name: the message does not say '$pattern'"; }
  [ ! -e "err_$name" ] || fail "$name: a failed prep left err_$name behind"
}
one_error cut "input cut.parquet: not a readable Parquet file: its footer is missing or damaged" --input cut.parquet
one_error damaged "input damaged.parquet: row group 2 of [0-9]* does not decode" --input damaged.parquet --threads 2
one_error column 'input pq/part-0.parquet: no column "txt" (its columns: id, text, meta.content, meta.lang); did you mean text' \
  --input pq --format parquet --text-key txt
one_error arrow_column 'input ipc/a.arrow: no column "txt" (its columns: id, text, meta); did you mean text' \
  --input ipc/a.arrow --text-key txt
head -c 5000 ipc/a.arrow > cut.arrow
one_error arrow_cut "input cut.arrow: not an Arrow IPC file or stream" --input cut.arrow
one_error not_strings "cells that hold no string were skipped: name the text column with --text-key" \
  --input pq --format parquet --text-key id
echo "prep_parquet: 1 passed, 0 failed"
