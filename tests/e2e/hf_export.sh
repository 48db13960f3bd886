#!/usr/bin/env bash
# `kilter export --format hf` (issue 26): after a short training run, transformers'
# GPT2LMHeadModel.from_pretrained(out) gives kilter's logits (within 1e-4, fp32 export) and greedy
# generate() gives the tokens of `kilter sample --temperature 0`; --dtype bf16 stores the fp32
# weights rounded to nearest even; a dataset's HF tokenizer.json is exported byte for byte and
# loads in transformers; an existing --out is refused and no temporary directory is left behind.
# usage: hf_export.sh KILTER KILTER_HF_TOOL   (KILTER_HF_PYTHON: the venv with transformers)
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
TOOL=$(readlink -f "$2")
hf_python

# A corpus of simple sentences and a small model trained on it.
sentence_corpus corpus.txt
"$KILTER" prep --input corpus.txt --format fortune --shards 1 --out data --quiet >/dev/null
MODEL=(--model.n_layer=2 --model.n_head=2 --model.n_embd=64 --model.block_size=128 --data.max_tokens=1024)
timeout 300 "${MPIRUN[@]}" -np 2 "$KILTER" train --data.dir=data "${MODEL[@]}" --train.tokens_per_step=1024 \
  --train.steps=60 --train.warmup=5 --train.lr=3e-3 --output.trace_steps=0 --output.log_every=30 --output.dir=runs/t \
  > train.log 2>&1 || { cat train.log; fail "kilter train failed"; }

"$KILTER" export --format hf --run runs/t --out hf 2> export.log || { cat export.log; fail "export failed"; }
grep -q "step 60 of runs/t/checkpoints/step-00000060.h5 -> hf (fp32" export.log || { cat export.log; fail "export message"; }
for f in config.json generation_config.json model.safetensors; do [ -f "hf/$f" ] || fail "hf/$f missing"; done
[ ! -e hf/tokenizer.json ] || fail "a byte-level dataset has no tokenizer file to export"
"$KILTER" export --format hf --checkpoint runs/t/checkpoints/step-00000060.h5 --out hf16 --dtype bf16 2>/dev/null

# Logits and greedy tokens, kilter against transformers.
prompt="84,104,101,32,99,97,116,32,115,101,101,115,32,116,104,101,32,114,101,100,32,98,97,108,108,46,32,65,32"
"$TOOL" logits runs/t "$prompt" kilter_logits.f32 >/dev/null
"$KILTER" sample --run runs/t --prompt-tokens "$prompt" --temperature 0 --max-new-tokens 64 --ignore-eos --json \
  > greedy.json 2>/dev/null
"$HFPY" - "$prompt" <<'PY'
import json, sys
import numpy as np, torch
from transformers import GPT2LMHeadModel
ids = [int(x) for x in sys.argv[1].split(",")]
model = GPT2LMHeadModel.from_pretrained("hf").eval()
assert model.config.activation_function == "gelu_new" and model.config.tie_word_embeddings
with torch.no_grad():
    hf = model(torch.tensor([ids])).logits[0].numpy()
kilter = np.fromfile("kilter_logits.f32", dtype=np.float32).reshape(len(ids), -1)
assert hf.shape == kilter.shape, (hf.shape, kilter.shape)
diff = float(np.abs(hf - kilter).max())
print(f"hf_export: logits of {len(ids)} positions x {hf.shape[1]}: max |transformers - kilter| = {diff:.2e}")
assert diff <= 1e-4, diff

want = json.load(open("greedy.json"))["tokens"]
assert len(want) == 64, len(want)
with torch.no_grad():
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=64, eos_token_id=None, pad_token_id=0)
got = out[0][len(ids):].tolist()
assert got == want, f"greedy tokens differ:\n transformers {got}\n kilter       {want}"
assert len(set(got)) > 3, f"the model generates almost one token ({set(got)}): train it longer"
print(f"hf_export: greedy generate == kilter sample --temperature 0 for {len(got)} tokens")

# bf16: every tensor is the fp32 export rounded to nearest even (torch's rounding), stored as BF16.
from safetensors.torch import load_file as load_torch
fp32, t16 = load_torch("hf/model.safetensors"), load_torch("hf16/model.safetensors")
with open("hf16/model.safetensors", "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
assert all(v["dtype"] == "BF16" for k, v in header.items() if k != "__metadata__")
assert json.load(open("hf16/config.json"))["torch_dtype"] == "bfloat16"
for name, value in fp32.items():
    assert torch.equal(value.to(torch.bfloat16), t16[name]), name
print(f"hf_export: bf16 export == fp32 export rounded to bf16, {len(fp32)} tensors")
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
