#!/usr/bin/env bash
# `kilter sample` and training samples (issue 14): a small model trained on generated English-like
# text; greedy sampling equals an independent PyTorch GPT-2 token for token (>= 64 tokens);
# seeds, top-k, the context stop, periodic samples in `kilter train`, the tokenizer recorded in
# checkpoints (and older checkpoints without one), unprompted samples starting a document (byte
# and trained SentencePiece vocabularies), imported datasets with and without a tokenizer, and the
# errors a user can make.
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
"$PY" -c "import torch, h5py" 2>/dev/null || fail "$PY lacks torch/h5py (Debian: python3-torch python3-h5py)"
json() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }

sentence_corpus corpus.txt
"$KILTER" prep --input corpus.txt --format fortune --shards 1 --out data --quiet >/dev/null
timeout 300 "${MPIRUN[@]}" -np 2 "$KILTER" train --data.dir=data --model.n_layer=2 --model.n_head=2 \
  --model.n_embd=64 --model.block_size=128 --data.max_tokens=1024 --train.tokens_per_step=1024 \
  --train.steps=80 --train.warmup=5 --train.lr=3e-3 --output.trace_steps=0 --output.log_every=40 \
  --output.sample_every=40 --output.sample_tokens=40 --output.sample_prompt="The " --output.dir=runs/t \
  > train.log 2>&1 || { cat train.log; fail "kilter train failed"; }
grep -q "^sample at step 40: The " train.log || { cat train.log; fail "no training sample at step 40"; }
grep -q "^sample at step 80: The " train.log || { cat train.log; fail "no training sample at step 80"; }
[ "$(grep -c "^sample at step" train.log)" -eq 2 ] || fail "expected exactly 2 training samples (rank 0 only)"
ckpt=runs/t/checkpoints/step-00000080.h5
"$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1]); t=f.attrs['tokenizer']; t=t.decode() if isinstance(t,bytes) else t
assert t=='byte' and int(f.attrs['eos_id'])==256, (t, f.attrs['eos_id'])" "$ckpt"

# Greedy equals PyTorch, token for token.
"$KILTER" sample --checkpoint "$ckpt" --prompt "The " --temperature 0 --max-new-tokens 100 --ignore-eos --json > greedy.json
[ "$(json greedy.json 'd["stop_reason"]')" = max_new_tokens ] || fail "greedy run did not run to --max-new-tokens"
"$PY" "$SRC/tests/python/sample_greedy.py" "$ckpt" greedy.json 64
# --run picks the newest checkpoint; text mode prints prompt + completion.
"$KILTER" sample --run runs/t --prompt "The " --temperature 0 --max-new-tokens 100 --ignore-eos > greedy.txt 2> greedy.err
[ "$(cat greedy.txt)" = "$(json greedy.json 'd["prompt"] + d["completion"]')" ] || fail "text mode differs from --json"
grep -q "step 80 of runs/t/checkpoints/step-00000080.h5" greedy.err || { cat greedy.err; fail "stderr names no checkpoint"; }
# --top-k 1 is greedy whatever the temperature; seeds reproduce and differ.
"$KILTER" sample --run runs/t --prompt "The " --top-k 1 --temperature 1.5 --max-new-tokens 100 --ignore-eos --json > topk1.json
[ "$(json topk1.json 'd["tokens"]')" = "$(json greedy.json 'd["tokens"]')" ] || fail "--top-k 1 differs from greedy"
for s in 5 5 6; do
  "$KILTER" sample --run runs/t --prompt "The " --temperature 1 --top-k 20 --seed $s --max-new-tokens 100 --ignore-eos --json > seed$s.$RANDOM.json
done
files=(seed5.*.json)
[ "$(json "${files[0]}" 'd["tokens"]')" = "$(json "${files[1]}" 'd["tokens"]')" ] || fail "the same seed gave different tokens"
[ "$(json "${files[0]}" 'd["tokens"]')" != "$(json seed6.*.json 'd["tokens"]')" ] || fail "seeds 5 and 6 gave the same tokens"
# The context stop: 4 prompt tokens in a context of 128 leave room for 125 new tokens.
"$KILTER" sample --run runs/t --prompt "The " --temperature 0 --max-new-tokens 1000 --ignore-eos --json > context.json
[ "$(json context.json 'd["stop_reason"]')" = context ] || fail "no stop at the context"
[ "$(json context.json 'len(d["tokens"])')" -eq 125 ] || fail "context stop after $(json context.json 'len(d["tokens"])') tokens, expected 125"
[ "$(json context.json 'd["tokens"][:100]')" = "$(json greedy.json 'd["tokens"]')" ] || fail "context run differs from greedy"

# Unprompted samples start a new document: the first token is one of the training documents' first
# tokens (the checkpoint records their counts), never the model's guess after an EOS it never saw as
# an input. Here every document starts with 'T', 'A' or 'M'.
"$PY" - "$ckpt" <<'PY'
import h5py, sys
starts = {int(i): int(c) for i, c in h5py.File(sys.argv[1])["document_starts"][()]}
assert set(starts) == {ord("T"), ord("A"), ord("M")}, starts
assert 250 <= sum(starts.values()) <= 300, starts  # the training split of 300 documents
PY
for s in 1 2 3 4 5; do
  "$KILTER" sample --run runs/t --temperature 1 --seed $s --max-new-tokens 30 --json > unprompted$s.json
  [ "$(json unprompted$s.json 'd["start"]')" = document_starts ] || fail "unprompted sample $s: start is not document_starts"
  [ "$(json unprompted$s.json 'd["prompt_tokens"]')" = "[]" ] || fail "unprompted sample $s has prompt tokens"
  [ "$(json unprompted$s.json 'd["tokens"][0] in (84, 65, 77) and len(d["completion"]) > 0')" = True ] \
    || fail "unprompted sample $s does not start a document: $(cat unprompted$s.json)"
done
# Training's samples with an empty output.sample_prompt (the default) start the same way.
timeout 300 "${MPIRUN[@]}" -np 1 "$KILTER" train --data.dir=data --model.n_layer=1 --model.n_head=2 \
  --model.n_embd=32 --model.block_size=64 --data.max_tokens=512 --train.tokens_per_step=512 --train.steps=2 \
  --output.trace_steps=0 --output.sample_every=1 --output.sample_tokens=8 \
  --output.dir=runs/u > unprompted-train.log 2>&1 || { cat unprompted-train.log; fail "kilter train (empty sample_prompt) failed"; }
[ "$(grep -cE "^sample at step [12]: [TAM]" unprompted-train.log)" -eq 2 ] \
  || { cat unprompted-train.log; fail "training samples with an empty prompt do not start a document"; }

# A checkpoint written before checkpoints recorded their tokenizer decodes as bytes (vocab 257).
cp "$ckpt" old.h5
"$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); del f.attrs['tokenizer']; del f.attrs['eos_id']; del f['document_starts']" old.h5
"$KILTER" sample --checkpoint old.h5 --prompt "The " --temperature 0 --max-new-tokens 100 --ignore-eos --json > old.json 2> old.err
grep -q "records no tokenizer" old.err || { cat old.err; fail "no note about the older checkpoint"; }
[ "$(json old.json 'd["completion"]')" = "$(json greedy.json 'd["completion"]')" ] || fail "older checkpoint decodes differently"
# Without document starts, an empty prompt falls back to the EOS id, and says so.
"$KILTER" sample --checkpoint old.h5 --max-new-tokens 5 --json > old-unprompted.json 2> old-unprompted.err
grep -q "records no document starts" old-unprompted.err || { cat old-unprompted.err; fail "no note about the EOS start"; }
[ "$(json old-unprompted.json 'd["start"] + str(d["prompt_tokens"])')" = "eos[256]" ] || fail "older checkpoint: no EOS start"

# Errors a user can make: one line, exit code 1, naming the cause.
expect_error() {  # expect_error NEEDLE ARGS...
  local needle=$1; shift
  local rc=0
  "$KILTER" sample "$@" > err.out 2> err.txt || rc=$?
  [ $rc -eq 1 ] || { cat err.txt; fail "kilter sample $*: exit code $rc, expected 1"; }
  grep -q "$needle" err.txt || { cat err.txt; fail "kilter sample $*: message lacks '$needle'"; }
}
expect_error "exactly one of --run" --run runs/t --checkpoint "$ckpt" --prompt x
expect_error "no checkpoint found" --run runs/none --prompt x
expect_error "more than the model's context of 128" --run runs/t --prompt "$(printf 'x%.0s' $(seq 200))"
expect_error "not a token id" --run runs/t --prompt-tokens 72,abc
expect_error "outside the model's vocabulary" --run runs/t --prompt-tokens 72,300
expect_error "temperature" --run runs/t --prompt x --temperature -1

# Imported datasets: with the byte tokenizer attached they decode text; without one, ids only.
"$PY" -c "
import numpy as np
text = open('corpus.txt', 'rb').read().replace(b'\n%\n', b'\x00')
ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16); ids[ids == 0] = 256
h = np.zeros(256, dtype=np.int32); h[0], h[1], h[2] = 20240520, 1, len(ids)
open('bytes.bin', 'wb').write(h.tobytes() + ids.tobytes())"
"$KILTER" prep --format llmc --input bytes.bin --tokenizer byte --out imp-byte --quiet > /dev/null
"$KILTER" prep --format llmc --input bytes.bin --eot 256 --vocab 257 --out imp-ids --quiet > /dev/null
for d in imp-byte imp-ids; do
  timeout 300 "${MPIRUN[@]}" -np 1 "$KILTER" train --data.dir=$d --model.n_layer=1 --model.n_head=2 \
    --model.n_embd=32 --model.block_size=64 --data.max_tokens=512 --train.tokens_per_step=512 \
    --train.steps=3 --output.trace_steps=0 --output.dir=runs/$d > $d.log 2>&1 || { cat $d.log; fail "training on $d failed"; }
done
"$KILTER" sample --run runs/imp-byte --prompt "The " --max-new-tokens 10 --ignore-eos --json > imp-byte.json
[ "$(json imp-byte.json 'd["tokenizer"]')" = byte ] || fail "the imported byte dataset's checkpoint has no byte tokenizer"
expect_error "no tokenizer to encode a text prompt" --run runs/imp-ids --prompt "The "
"$KILTER" sample --run runs/imp-ids --prompt-tokens 84,104,101,32 --max-new-tokens 10 --ignore-eos --json > imp-ids.json
[ "$(json imp-ids.json 'd["tokenizer"]')" = imported ] || fail "tokenizer kind of the imported dataset"
[ "$(json imp-ids.json 'd["completion"][0]')" = "[" ] || fail "an ids-only completion prints its ids"
# A trained SentencePiece vocabulary: unprompted samples are non-empty valid UTF-8 that begins at a
# word boundary (a "▁" piece that some document starts with), so the text never begins mid-word or
# with a space; a prompt's continuation keeps the space its first piece stands for.
"$KILTER" prep tokenizer train --input corpus.txt --format fortune --vocab 80 --out sp.model > /dev/null 2>&1
"$KILTER" prep --input corpus.txt --format fortune --tokenizer sp.model --shards 1 --out sp-data --quiet > /dev/null
timeout 300 "${MPIRUN[@]}" -np 1 "$KILTER" train --data.dir=sp-data --model.n_layer=1 --model.n_head=2 \
  --model.n_embd=32 --model.block_size=64 --data.max_tokens=1024 --train.tokens_per_step=1024 --train.steps=40 \
  --train.lr=3e-3 --output.trace_steps=0 --output.dir=runs/sp > sp-train.log 2>&1 || { cat sp-train.log; fail "training on sp-data failed"; }
for s in 1 2 3 4 5; do
  "$KILTER" sample --run runs/sp --temperature 1 --seed $s --max-new-tokens 20 --json > sp$s.json
done
"$KILTER" sample --run runs/sp --prompt "The cat" --temperature 0 --max-new-tokens 5 --ignore-eos --json > sp-prompt.json
"$PY" - sp.model sp-data/shard-00000.h5 sp*.json <<'PY'
import h5py, json, sentencepiece, sys
sp = sentencepiece.SentencePieceProcessor(model_file=sys.argv[1])
shard = h5py.File(sys.argv[2])
tokens, offsets = shard["tokens"][()], shard["offsets"][()]
firsts = {int(tokens[o]) for o, e in zip(offsets[:-1], offsets[1:]) if e > o}
for path in sys.argv[3:]:
    raw = open(path, "rb").read()
    raw.decode("utf-8")  # strict: the JSON holds valid UTF-8
    d = json.loads(raw)
    text, ids = d["completion"], d["tokens"]
    assert ids and text and text == text.strip(" ") or path.endswith("prompt.json"), (path, text)
    if path.endswith("prompt.json"):
        assert d["prompt"] == "The cat" and text.startswith(" ") == sp.id_to_piece(ids[0]).startswith("\u2581"), (path, d)
        assert text == sp.decode(d["prompt_tokens"] + ids)[len("The cat"):], (path, d)
        continue
    assert ids[0] in firsts and sp.id_to_piece(ids[0]).startswith("\u2581"), (path, ids[0], sp.id_to_piece(ids[0]))
    assert text == sp.decode(ids), (path, text, sp.decode(ids))
PY

echo "sample_cli: passed"
