#!/usr/bin/env bash
# `kilter export --format hf` (issue 26): after a short training run, transformers'
# GPT2LMHeadModel.from_pretrained(out) gives kilter's logits (within 1e-4, fp32 export) and greedy
# generate() gives the tokens of `kilter sample --temperature 0`; --dtype bf16 stores the fp32
# weights rounded to nearest even; a dataset's HF tokenizer.json is exported byte for byte and
# loads in transformers; an existing --out is refused and no temporary directory is left behind.
# The steps shared with hf_llama_export.sh: lib.sh (sentence_model, sentence_greedy) and
# tests/python/hf_export_checks.py.
# usage: hf_export.sh KILTER KILTER_HF_TOOL   (KILTER_HF_PYTHON: the venv with transformers)
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
TOOL=$(readlink -f "$2")
hf_python

# A corpus of simple sentences and a small model trained on it.
MODEL=(--model.n_layer=2 --model.n_head=2 --model.n_embd=64 --model.block_size=128 --data.max_tokens=1024)
sentence_model "${MODEL[@]}"

"$KILTER" export --format hf --run runs/t --out hf 2> export.log || { cat export.log; fail "export failed"; }
grep -q "step 60 of runs/t/checkpoints/step-00000060.h5 -> hf (fp32" export.log || { cat export.log; fail "export message"; }
for f in config.json generation_config.json model.safetensors; do [ -f "hf/$f" ] || fail "hf/$f missing"; done
[ ! -e hf/tokenizer.json ] || fail "a byte-level dataset has no tokenizer file to export"
"$KILTER" export --format hf --checkpoint runs/t/checkpoints/step-00000060.h5 --out hf16 --dtype bf16 2>/dev/null

# Logits and greedy tokens, kilter against transformers.
"$TOOL" logits runs/t "$SENTENCE_PROMPT" kilter_logits.f32 >/dev/null
sentence_greedy runs/t greedy.json
"$HFPY" - "$SRC/tests/python" "$SENTENCE_PROMPT" <<'PY'
import sys
import numpy as np, torch
from transformers import GPT2LMHeadModel
sys.path.insert(0, sys.argv[1])
from hf_export_checks import check_bf16_export, check_greedy
ids = [int(x) for x in sys.argv[2].split(",")]
model = GPT2LMHeadModel.from_pretrained("hf").eval()
assert model.config.activation_function == "gelu_new" and model.config.tie_word_embeddings
with torch.no_grad():
    hf = model(torch.tensor([ids])).logits[0].numpy()
kilter = np.fromfile("kilter_logits.f32", dtype=np.float32).reshape(len(ids), -1)
assert hf.shape == kilter.shape, (hf.shape, kilter.shape)
diff = float(np.abs(hf - kilter).max())
print(f"hf_export: logits of {len(ids)} positions x {hf.shape[1]}: max |transformers - kilter| = {diff:.2e}")
assert diff <= 1e-4, diff

check_greedy("hf_export", model, ids, "greedy.json")
check_bf16_export("hf_export", "hf", "hf16")
GPT2LMHeadModel.from_pretrained("hf16")
PY

# An existing --out is refused (and nothing is left beside it); --force replaces it.
if "$KILTER" export --format hf --run runs/t --out hf 2> again.log; then fail "export over an existing --out succeeded"; fi
grep -q "exists and is not empty (pass --force" again.log || { cat again.log; fail "refusal message"; }
"$KILTER" export --format hf --run runs/t --out hf --force 2>/dev/null
[ -z "$(ls -d hf.* 2>/dev/null)" ] || fail "temporary directories left: $(ls -d hf.*)"
if "$KILTER" export --format hf --checkpoint runs/none.h5 --out x 2> missing.log; then fail "export of a missing checkpoint"; fi
grep -q "runs/none.h5" missing.log || { cat missing.log; fail "missing checkpoint not named"; }
if "$KILTER" export --format onnx --run runs/t --out x 2> format.log; then fail "unknown format accepted"; fi
grep -q -- "--format onnx is unknown" format.log || { cat format.log; fail "format message"; }

# A dataset with an HF byte-level BPE tokenizer: tokenizer.json travels byte for byte and loads.
"$HFPY" - <<'PY'
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train(["corpus.txt"], trainer)
tok.save("tokenizer.json")
PY
"$KILTER" prep --input corpus.txt --format fortune --shards 1 --tokenizer tokenizer.json --out data_bpe --quiet >/dev/null
timeout 300 "${MPIRUN[@]}" -np 1 "$KILTER" train --data.dir=data_bpe "${MODEL[@]}" --train.tokens_per_step=1024 \
  --train.steps=2 --output.trace_steps=0 --output.dir=runs/bpe > bpe.log 2>&1 || { cat bpe.log; fail "bpe training"; }
"$KILTER" export --format hf --run runs/bpe --out hf_bpe 2>/dev/null
cmp tokenizer.json hf_bpe/tokenizer.json || fail "tokenizer.json not exported byte for byte"
"$HFPY" - <<'PY'
from tokenizers import Tokenizer
from transformers import AutoTokenizer, GPT2LMHeadModel
text = "The old man brings the long road."
ours = AutoTokenizer.from_pretrained("hf_bpe")
assert ours.encode(text) == Tokenizer.from_file("tokenizer.json").encode(text).ids
model = GPT2LMHeadModel.from_pretrained("hf_bpe")
assert model.config.vocab_size == len(ours), (model.config.vocab_size, len(ours))
print("hf_export: tokenizer.json exported and loaded by AutoTokenizer")
PY
echo "hf_export: ok"
