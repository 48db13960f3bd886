#!/usr/bin/env bash
# e2e (issue 14): the tokenizer CLI. `kilter prep tokenizer train` writes a SentencePiece model
# that Debian's python3-sentencepiece loads and whose ids kilter reproduces; `kilter prep
# --tokenizer` shows progress, writes the same shards whatever --threads is, and the dataset
# trains (model.vocab_size from the tokenizer); unsupported or bad tokenizer files are refused
# with the component or file named.
# Usage: tokenizer_prep.sh /path/to/kilter
source "$(dirname "$0")/lib.sh"
FORTUNES=${KILTER_FORTUNES:-/usr/share/games/fortunes}
ORACLE="$SRC/tests/python/tokenizer_oracle.py"
TOOL=$(dirname "$KILTER")/tokenizer_tool

grep -q -- "--tokenizer" <<<"$("$KILTER" prep --help)" || fail "prep --help does not document --tokenizer"
grep -q -- "--kind" <<<"$("$KILTER" prep tokenizer train --help)" || fail "prep tokenizer train --help lacks --kind"

# Train with kilter's trainer (bpe and unigram) on the fortunes.
for kind in bpe unigram; do
  timeout 120 "$KILTER" prep tokenizer train --input "$FORTUNES" --format fortune --vocab 2000 \
    --kind $kind --sample 10000 --out tok/$kind.model --quiet > train-$kind.out \
    || fail "kilter prep tokenizer train --kind $kind failed"
  cat train-$kind.out
  grep -q "vocab_size 2000" train-$kind.out || fail "train report lacks the vocabulary size"
  [[ -s tok/$kind.model ]] || fail "no model written"
done
ls tok | grep -q tmp && fail "a temporary model file was left behind"
"$PY" -c "import sentencepiece" 2>/dev/null || { echo "SKIP: python3-sentencepiece missing"; exit 77; }
"$PY" - tok/unigram.model <<'PYEOF'
import sys, sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
assert sp.get_piece_size() == 2000, sp.get_piece_size()
# Unigram pieces carry log-probabilities; BPE pieces carry integer ranks.
scores = [sp.get_score(i) for i in range(sp.get_piece_size())]
assert any(s != int(s) for s in scores), "the model's scores are ranks: not a unigram model"
print("python3-sentencepiece loads kilter's unigram model:", sp.encode("Hello, world!", out_type=str))
PYEOF

# The kilter-trained BPE model against the library's encode, through the tool and through prep.
"$PY" "$ORACLE" corpus corpus.jsonl 4096 > /dev/null
timeout 120 "$TOOL" tok/bpe.model < corpus.jsonl > kilter.jsonl || fail "tokenizer_tool failed"
timeout 120 "$KILTER" prep --input corpus.jsonl --format jsonl --tokenizer tok/bpe.model --shards 2 \
  --out ds > prep.out 2> prep.err || { cat prep.err; fail "prep --tokenizer failed"; }
grep -q "prep tokenize" prep.err || fail "no tokenize progress on stderr"
grep -q "docs/s" prep.err || fail "no docs/s in the progress"
grep -q "tokenizer: sentencepiece, vocab_size 2000, eos_id 2" prep.out || { cat prep.out; fail "report lacks the tokenizer"; }
"$PY" "$ORACLE" check sp tok/bpe.model corpus.jsonl kilter.jsonl ds

# The output does not depend on the thread count.
"$KILTER" prep --input corpus.jsonl --format jsonl --tokenizer tok/bpe.model --shards 2 --threads 1 \
  --out ds1 --quiet > /dev/null || fail "prep --threads 1 failed"
for f in shard-00000.h5 shard-00001.h5; do
  "$PY" -c "import h5py,sys,numpy as np; a,b=(h5py.File(p,'r') for p in sys.argv[1:]); \
assert all(np.array_equal(a[k][()], b[k][()]) for k in ('tokens','offsets')), 'differ'" ds/$f ds1/$f \
    || fail "$f differs between --threads default and --threads 1"
done

# The tokenized dataset trains: model.vocab_size comes from the tokenizer.
timeout 120 "$KILTER" train --model.n_layer=1 --model.n_head=2 --model.n_embd=32 --model.block_size=64 \
  --data.dir=ds --data.max_tokens=512 --train.steps=3 --train.tokens_per_step=1024 --train.warmup=1 \
  --output.dir=run --output.log_every=1 > train.out 2>&1 || { cat train.out; fail "training on the tokenized dataset failed"; }

# Refusals name what is wrong.
expect_error() {  # expect_error NEEDLE ARGS...
  local needle=$1; shift
  local rc=0
  "$KILTER" "$@" > err.out 2>&1 || rc=$?
  [[ $rc -ne 0 ]] || fail "'$*' succeeded"
  grep -qF -- "$needle" err.out || { cat err.out; fail "'$*': message lacks '$needle'"; }
}
"$PY" - <<'PYEOF'
import json
base = {"version": "1.0", "added_tokens": [], "normalizer": None, "post_processor": None, "decoder": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}}
json.dump(dict(base, model={"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "a"}), open("wordpiece.json", "w"))
json.dump(dict(base, model={"type": "BPE", "vocab": {"a": 0}, "merges": []},
               pre_tokenizer={"type": "Metaspace", "replacement": "_"}), open("metaspace.json", "w"))
PYEOF
echo '{"text": "hello"}' > one.jsonl
expect_error "model.type = WordPiece is not supported" prep --input one.jsonl --format jsonl --tokenizer wordpiece.json --out x
expect_error "pre_tokenizer.type = Metaspace is not supported" prep --input one.jsonl --format jsonl --tokenizer metaspace.json --out x
expect_error "missing.model" prep --input one.jsonl --format jsonl --tokenizer missing.model --out x
echo "junk" > junk.model
expect_error "junk.model: not a SentencePiece model nor a tokenizer.json" prep --input one.jsonl --format jsonl --tokenizer junk.model --out x
expect_error "--kind: 'word' is not one of bpe, unigram" prep tokenizer train --input one.jsonl --format jsonl --vocab 100 --kind word --out w.model
expect_error "expected \`train\`" prep tokenizer
[[ ! -e x ]] || fail "a refused prep left an output directory"
echo "OK: tokenizer CLI"
