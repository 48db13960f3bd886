#!/usr/bin/env bash
# Tokenizer throughput: kilter's byte-level BPE beside HF `tokenizers` (Rust) batch encoding, on
# the same documents and the same number of cores, and `kilter prep` end to end beside kilter's
# tokenization alone.
#   bench/tokenize.sh BUILD_DIR [THREADS=nproc] [TOKENIZER=tokenizer.json] [CORPUS=corpus.jsonl]
# Without TOKENIZER, HF `tokenizers` trains a byte-level BPE (vocab 4096) on Debian's fortunes;
# without CORPUS, the corpus is every UTF-8 /usr/share/doc/*/copyright (about 28 MB, a text
# the tokenizer was not trained on) cut into documents of at most 16 KiB at paragraph breaks
# (whole multi-MB files are not typical documents, and HF `tokenizers` slows down super-linearly
# on them: 4 s for one 2 MB file here). Both sides run 3 times; the best time counts. The script
# checks that both produced the same number of tokens and the same sum of ids, and that prep's
# dataset holds that many tokens. Targets (issue 14): kilter >= 0.5x HF; prep <= 2x tokenization.
set -euo pipefail
BUILD=$(readlink -f "${1:?usage: bench/tokenize.sh BUILD_DIR [THREADS] [TOKENIZER] [CORPUS]}")
THREADS=${2:-$(nproc)}
SRC=$(cd "$(dirname "$0")/.." && pwd)
PY=${KILTER_PYTHON:-/usr/bin/python3}
KILTER=$BUILD/kilter
BENCH=$BUILD/tokenize_bench
[[ -x $KILTER && -x $BENCH ]] || { echo "build kilter and tokenize_bench in $BUILD first" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kilter-tokenize-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

TOKENIZER=${3:-}
if [[ -z $TOKENIZER ]]; then
  TOKENIZER=$WORK/tokenizer.json
  "$PY" "$SRC/tests/python/tokenizer_oracle.py" train-hf "$TOKENIZER" /usr/share/games/fortunes
fi
CORPUS=${4:-}
if [[ -z $CORPUS ]]; then
  CORPUS=$WORK/corpus.jsonl
  "$PY" - "$CORPUS" <<'PYEOF'
import glob, json, sys
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for path in sorted(glob.glob("/usr/share/doc/*/copyright")):
        try:
            text = open(path, "rb").read().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        doc = ""
        for paragraph in text.split("\n\n"):
            if doc and len(doc) + len(paragraph) > 16384:
                out.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
                doc = ""
            doc += paragraph + "\n\n"
        if doc:
            out.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
PYEOF
fi

KILTER_JSON=$("$BENCH" "$TOKENIZER" "$CORPUS" "$THREADS" 3)
echo "kilter tokenize: $KILTER_JSON"

HF_JSON=$(RAYON_NUM_THREADS=$THREADS TOKENIZERS_PARALLELISM=true "$PY" - "$TOKENIZER" "$CORPUS" <<'PYEOF'
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
texts = [json.loads(line)["text"] for line in open(sys.argv[2], encoding="utf-8")]
best = 1e30
for _ in range(3):
    start = time.perf_counter()
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    best = min(best, time.perf_counter() - start)
tokens = sum(len(e.ids) for e in encodings)
id_sum = sum(sum(e.ids) for e in encodings)
print(json.dumps({"documents": len(texts), "tokens": tokens, "id_sum": id_sum, "seconds": best}))
PYEOF
)
echo "HF tokenizers encode_batch: $HF_JSON"

start=$(date +%s.%N)
"$KILTER" prep --input "$CORPUS" --format jsonl --tokenizer "$TOKENIZER" --threads "$THREADS" \
  --out "$WORK/ds" --quiet > "$WORK/prep.out"
end=$(date +%s.%N)
cat "$WORK/prep.out"

"$PY" - "$KILTER_JSON" "$HF_JSON" "$start" "$end" "$WORK/prep.out" <<'PYEOF'
import json, re, sys
k, h = json.loads(sys.argv[1]), json.loads(sys.argv[2])
prep_seconds = float(sys.argv[4]) - float(sys.argv[3])
prep_tokens = int(re.search(r"documents, (\d+) tokens", open(sys.argv[5]).read()).group(1))
assert (k["tokens"], k["id_sum"]) == (h["tokens"], h["id_sum"]), \
    f"kilter and HF disagree: tokens {k['tokens']} vs {h['tokens']}, id sums {k['id_sum']} vs {h['id_sum']}"
assert prep_tokens == k["tokens"], f"prep wrote {prep_tokens} tokens, tokenization alone {k['tokens']}"
mb = k["bytes"] / 1e6
print(f"corpus: {k['documents']} documents, {mb:.1f} MB, {k['tokens']} tokens (equal count and id sum on both sides)")
print(f"threads: {k['threads']}")
print(f"kilter tokenize     {k['seconds']:8.3f} s  {mb / k['seconds']:7.2f} MB/s")
print(f"HF encode_batch     {h['seconds']:8.3f} s  {mb / h['seconds']:7.2f} MB/s")
print(f"kilter / HF throughput ratio: {h['seconds'] / k['seconds']:.2f}x (target >= 0.5x)")
print(f"kilter prep end to end {prep_seconds:8.3f} s  {mb / prep_seconds:7.2f} MB/s")
print(f"prep / tokenization-alone time ratio: {prep_seconds / k['seconds']:.2f}x (target <= 2x)")
PYEOF
