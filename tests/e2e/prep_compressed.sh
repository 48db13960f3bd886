#!/usr/bin/env bash
# `kilter prep` on corpora as they are shipped (issue 26): the same JSONL corpus plain, gzip
# (two concatenated members) and zstd (two frames) gives identical datasets (shard hashes);
# progress counts the compressed bytes read; --text-key reaches a dotted path; a bad line is
# refused naming FILE:LINE, or skipped and counted under --max-bad-lines; a truncated .gz or .zst
# is refused naming the file.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
command -v gzip >/dev/null && command -v zstd >/dev/null || fail "gzip and zstd (Debian: gzip zstd) are needed"

"$PY" - <<'PY'
import json, random
random.seed(5)
words = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "eta", "théta", "iota", "kappa"]
with open("a.jsonl", "w") as a, open("b.jsonl", "w") as b:
    for i in range(6000):
        text = " ".join(random.choice(words) for _ in range(random.randint(5, 60)))
        record = {"id": i, "meta": {"content": text, "lang": "x"}, "text": text.upper()}
        (a if i < 3000 else b).write(json.dumps(record, ensure_ascii=False) + "\n")
PY
cat a.jsonl b.jsonl > corpus.jsonl
{ gzip -c a.jsonl; gzip -c b.jsonl; } > corpus.jsonl.gz
{ zstd -q -c a.jsonl; zstd -q -c b.jsonl; } > corpus.jsonl.zst

hashes() { "$PY" -c "import h5py,sys; print(list(h5py.File(sys.argv[1] + '/index.h5')['shard_hash'][:]))" "$1"; }
for f in corpus.jsonl corpus.jsonl.gz corpus.jsonl.zst; do
  "$KILTER" prep --input "$f" --format jsonl --text-key meta.content --shards 3 --out "data_$f" \
    > "$f.out" 2> "$f.err" || { cat "$f.err"; fail "prep $f"; }
  # Progress ends at 100% of the file's size on disk: the compressed bytes for .gz and .zst.
  mb=$("$PY" -c "import os,sys; print('%.1f MB' % (os.path.getsize(sys.argv[1]) / 1e6))" "$f")
  grep -q "prep scan: 100.0% 6000 docs, $mb" "$f.err" || { cat "$f.err"; fail "$f: progress does not end at $mb"; }
done
plain=$(hashes data_corpus.jsonl)
[ "$(hashes data_corpus.jsonl.gz)" = "$plain" ] || fail "gzip dataset differs from the plain one"
[ "$(hashes data_corpus.jsonl.zst)" = "$plain" ] || fail "zstd dataset differs from the plain one"
# The dotted path was read, not the upper-case "text" field.
"$PY" -c "
import h5py
f = h5py.File('data_corpus.jsonl/shard-00000.h5'); t = bytes(f['tokens'][:200].astype('uint8'))
assert t.decode('utf-8', 'ignore').islower(), t"
"$KILTER" prep --input corpus.jsonl.zst --format jsonl --out data_text --quiet >/dev/null
[ "$(hashes data_text)" != "$plain" ] || fail "--text-key made no difference"

# Bad lines: refused naming FILE:LINE by default, skipped and counted up to --max-bad-lines.
{ head -n 10 a.jsonl; echo '{"meta": {"lang": "x"}}'; echo 'not json'; tail -n 5 a.jsonl; } | gzip -c > bad.jsonl.gz
if "$KILTER" prep --input bad.jsonl.gz --format jsonl --text-key meta.content --out d_bad --quiet 2> bad.err; then
  fail "a bad line was accepted"
fi
grep -q 'input bad.jsonl.gz:11: expected an object with a string field "meta.content"' bad.err || { cat bad.err; fail "bad line 11 not named"; }
grep -q -- "--max-bad-lines" bad.err || { cat bad.err; fail "the refusal does not name --max-bad-lines"; }
if "$KILTER" prep --input bad.jsonl.gz --format jsonl --text-key meta.content --max-bad-lines 1 --out d_bad --quiet 2> bad1.err; then
  fail "two bad lines passed --max-bad-lines 1"
fi
grep -q "input bad.jsonl.gz:12: not valid JSON" bad1.err || { cat bad1.err; fail "line 12 not named"; }
grep -q "more than --max-bad-lines 1 bad lines" bad1.err || { cat bad1.err; fail "the budget is not named"; }
"$KILTER" prep --input bad.jsonl.gz --format jsonl --text-key meta.content --max-bad-lines 2 --out d_bad --quiet \
  > bad2.out 2> bad2.err
grep -q "15 documents" bad2.out && grep -q "2 bad lines skipped" bad2.out || { cat bad2.out; fail "skipped lines not counted"; }
grep -q "prep: skipped bad.jsonl.gz:11: " bad2.err && grep -q "prep: skipped bad.jsonl.gz:12: " bad2.err \
  || { cat bad2.err; fail "skipped lines not named"; }

# Truncated compressed files are refused, naming the file.
for f in corpus.jsonl.gz corpus.jsonl.zst; do
  head -c 20000 "$f" > "cut_$f"
  if "$KILTER" prep --input "cut_$f" --format jsonl --text-key meta.content --out d_cut --quiet 2> cut.err; then
    fail "truncated $f accepted"
  fi
  grep -q "input cut_$f: the .* stream ends early (truncated file?)" cut.err || { cat cut.err; fail "truncated $f: message"; }
done
echo "prep_compressed: ok"
