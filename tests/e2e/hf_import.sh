#!/usr/bin/env bash
# `train.init_from` (issue 26): a random GPT2LMHeadModel saved by transformers starts a kilter
# run whose first-step loss equals the HF model's loss on the same batch (within 1e-5); its
# weights go back out through export bit-identically; a kilter checkpoint is a source too (its
# optimizer state and data position are not taken); a shape or vocabulary mismatch is refused
# naming the tensor, both shapes and the config key, and train.init_vocab = resize loads anyway.
# usage: hf_import.sh KILTER KILTER_HF_TOOL   (KILTER_HF_PYTHON: the venv with transformers)
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
TOOL=$(readlink -f "$2")
hf_python

# A random GPT-2 (larger init than GPT-2's so every tensor matters) saved the way users get one.
"$HFPY" - <<'PY'
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(7)
config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=500, initializer_range=0.2,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(config)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith(".bias") or "ln_" in name:
            p.add_(0.1 * torch.randn_like(p))  # biases and LayerNorms away from 0 and 1
model.save_pretrained("hf", safe_serialization=True)
PY
[ -f hf/model.safetensors ] || fail "transformers wrote no model.safetensors"

# Every document fits the context (<= 65 tokens, one piece each) and one step holds them all.
"$KILTER" prep synth --docs 40 --lengths uniform:8,65 --vocab 500 --shards 2 --seed 1 --out data >/dev/null 2>&1
COMMON=(--data.dir=data --model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=64
        --data.max_tokens=1024 --train.tokens_per_step=100000 --data.tail=redistribute --data.eval_fraction=0
        --output.trace_steps=0)
"$KILTER" plan --data data --world-size 2 --json "${COMMON[@]:1}" > plan.json 2>/dev/null
json() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }
[ "$(json plan.json 'd["steps_per_epoch"]')" = 1 ] || fail "the test needs one step per epoch: $(cat plan.json)"
train hf.log 2 --train.init_from=hf --output.dir=runs/hf --train.steps=1
grep -q "kilter: weights from Hugging Face GPT-2 directory hf; optimizer state and data position start fresh" hf.log \
  || { cat hf.log; fail "no init_from note"; }

# The HF loss of the same batch (all documents), and the round trip of the weights.
"$TOOL" roundtrip hf back >/dev/null
"$HFPY" - "$(json runs/hf/summary.json 'd["final_loss"]')" <<'PY'
import glob, sys
import h5py, numpy as np, torch
from safetensors.numpy import load_file
from transformers import GPT2LMHeadModel
model = GPT2LMHeadModel.from_pretrained("hf").eval()
total, count = 0.0, 0
for path in sorted(glob.glob("data/shard-*.h5")):
    with h5py.File(path) as f:
        tokens, offsets, eos = f["tokens"][:].astype(np.int64), f["offsets"][:], int(f.attrs["eos_id"])
    for a, b in zip(offsets[:-1], offsets[1:]):
        doc = torch.from_numpy(tokens[a:b])
        targets = torch.cat([doc[1:], torch.tensor([eos])])  # a document's last token predicts EOS
        with torch.no_grad():
            logits = model(doc[None]).logits[0].double()
        total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += int(b - a)
hf_loss, kilter_loss = total / count, float(sys.argv[1])
print(f"hf_import: first-step loss kilter {kilter_loss:.8f}, transformers {hf_loss:.8f} ({count} targets)")
assert abs(hf_loss - kilter_loss) <= 1e-5, abs(hf_loss - kilter_loss)

ours, theirs = load_file("back/model.safetensors"), load_file("hf/model.safetensors")
theirs = {k if k.startswith("transformer.") else "transformer." + k: v for k, v in theirs.items()
          if k != "lm_head.weight" and not k.endswith((".attn.bias", ".attn.masked_bias"))}
assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
for name in theirs:
    assert ours[name].dtype == theirs[name].dtype and ours[name].shape == theirs[name].shape, name
    assert ours[name].tobytes() == theirs[name].tobytes(), f"{name} differs after import + export"
print(f"hf_import: {len(ours)} tensors round-trip bit-identically")
PY

# A kilter checkpoint as the source: weights only (the new run starts at step 0 of epoch 0).
train ckpt.log 1 --train.init_from=runs/hf --output.dir=runs/from_ckpt --train.steps=2
grep -q "kilter: weights from kilter checkpoint step 1 of runs/hf/checkpoints/step-00000001.h5" ckpt.log \
  || { cat ckpt.log; fail "no init_from note for a checkpoint"; }
[ "$(json runs/from_ckpt/summary.json 'd["steps"]')" = 2 ] || fail "a run from a checkpoint's weights takes its own steps"

# Refusals: a shape (naming tensor, shapes and key), the layer count, the vocabulary.
with() {  # with --key=value...: COMMON with those keys replaced (an option may be given once)
  local args=() a o
  for a in "${COMMON[@]}"; do
    for o in "$@"; do [ "${a%%=*}" = "${o%%=*}" ] && continue 2; done
    args+=("$a")
  done
  WITH=("${args[@]}" "$@")
}
expect_refusal() {  # expect_refusal LOG TEXT [--key=value...]
  local log=$1 text=$2; shift 2
  with "$@"
  if timeout 120 "${MPIRUN[@]}" -np 2 "$KILTER" train "${WITH[@]}" --output.dir=runs/refused > "$log" 2>&1; then
    fail "$log: the run was not refused"
  fi
  grep -qF -- "$text" "$log" || { cat "$log"; fail "$log: no '$text'"; }
}
expect_refusal shape.log "tensor transformer.wpe.weight is [64, 32] there and [32, 32] in the model: set model.block_size = 64" \
  --train.init_from=hf --model.block_size=32
expect_refusal embd.log "set model.n_embd = 32" --train.init_from=hf --model.n_embd=64
expect_refusal layers.log "has n_layer = 2, the model 3: set model.n_layer = 2" --train.init_from=hf --model.n_layer=3
"$KILTER" prep synth --docs 40 --lengths uniform:8,65 --vocab 300 --shards 1 --seed 1 --out data300 >/dev/null 2>&1
expect_refusal vocab.log "its vocabulary has 500 ids, the model's 300" --train.init_from=hf --data.dir=data300
grep -q "train.init_vocab = resize" vocab.log || fail "the vocabulary refusal does not name train.init_vocab"
with --data.dir=data300
COMMON=("${WITH[@]}")
train resize.log 2 --train.init_from=hf --train.init_vocab=resize --output.dir=runs/resized
grep -q "vocabulary resized" resize.log || { cat resize.log; fail "no resize note"; }
expect_refusal nothing.log "config key train.init_from = no_such_dir: no such file or folder" --train.init_from=no_such_dir
mkdir -p not_a_model && expect_refusal notmodel.log "neither a Hugging Face GPT-2 directory" --train.init_from=not_a_model
echo "hf_import: ok"
