#!/usr/bin/env bash
# e2e (issue 14): exact match with the reference tokenizers. A tokenizer is trained on Debian's
# fortunes by its own library (KIND hf: HF `tokenizers` byte-level BPE, vocab 4096; sp-bpe and
# sp-unigram: python3-sentencepiece, vocab 4000); kilter then encodes a different real corpus
# (/usr/share/doc/*/copyright) plus crafted documents, through tokenizer_tool and `kilter prep
# --tokenizer`, and every document's ids (and kilter's decode) must equal the library's.
# (hf-split: Llama-3's Split regex and ByteLevel without regex, behind an NFC normalizer;
# hf-extras: NFKC + Lowercase + Replace, add_prefix_space, added tokens with lstrip/rstrip).
# Usage: tokenizer_exact.sh /path/to/kilter hf|hf-split|hf-extras|sp-bpe|sp-unigram /path/to/tokenizer_tool
set -euo pipefail
KILTER=$(readlink -f "$1")
KIND=$2
TOOL=$(readlink -f "$3")
SRC=${KILTER_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
PY=${KILTER_PYTHON:-/usr/bin/python3}
FORTUNES=${KILTER_FORTUNES:-/usr/share/games/fortunes}
ORACLE="$SRC/tests/python/tokenizer_oracle.py"
WORK=$(mktemp -d /tmp/kilter-e2e-tok.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
fail() { echo "FAIL: $*" >&2; exit 1; }

[[ -d $FORTUNES ]] || fail "$FORTUNES is missing (scripts/install-deps.sh installs the fortunes packages)"
case $KIND in
  hf) TOK=tokenizer.json; ORACLE_KIND=hf; MAX_BYTES=16384
      "$PY" "$ORACLE" train-hf "$TOK" "$FORTUNES" ;;
  hf-split|hf-extras) TOK=tokenizer.json; ORACLE_KIND=hf; MAX_BYTES=16384
      "$PY" "$ORACLE" train-hf "$TOK" "$FORTUNES" "${KIND#hf-}" ;;
  # libsentencepiece encodes at ~1 MB/s per core: a shorter cut of each document keeps the test short.
  sp-bpe|sp-unigram) TOK=$KIND.model; ORACLE_KIND=sp; MAX_BYTES=6144
      "$PY" "$ORACLE" train-sp "${KIND#sp-}" "$TOK" "$FORTUNES" ;;
  *) fail "unknown kind $KIND" ;;
esac
"$PY" "$ORACLE" corpus corpus.jsonl $MAX_BYTES

timeout 120 "$TOOL" "$TOK" < corpus.jsonl > kilter.jsonl || fail "tokenizer_tool failed"
timeout 120 "$KILTER" prep --input corpus.jsonl --format jsonl --tokenizer "$TOK" --shards 2 \
  --out dataset > prep.out 2> prep.err || { cat prep.err; fail "kilter prep --tokenizer failed"; }
cat prep.out
"$KILTER" prep validate dataset || fail "kilter prep validate rejected the tokenized dataset"
"$PY" "$ORACLE" check "$ORACLE_KIND" "$TOK" corpus.jsonl kilter.jsonl dataset
