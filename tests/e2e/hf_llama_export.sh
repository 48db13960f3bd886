#!/usr/bin/env bash
# `kilter export --format hf` of llama checkpoints (issue 38): after a short training run (GQA,
# untied head), transformers' LlamaForCausalLM.from_pretrained(out) loads every tensor (none
# missing, none unexpected), its logits equal kilter's within 1e-4 and greedy generate() gives
# the tokens of `kilter sample --temperature 0`; a tied model with q/k/v biases loads as
# Qwen2ForCausalLM and one with llama3 RoPE scaling as LlamaForCausalLM, both with kilter's
# logits; --dtype bf16 stores the fp32 weights rounded to nearest even; import then export
# (train.init_from's reader, export's writer) gives the same tensors bit for bit, fp32 and bf16.
# Skipped (exit 77) where the test-only venv with transformers is missing.
# The steps shared with hf_export.sh: lib.sh (sentence_model, sentence_greedy) and
# tests/python/hf_export_checks.py.
# usage: hf_llama_export.sh KILTER KILTER_HF_TOOL   (KILTER_HF_PYTHON: the venv with transformers)
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
TOOL=$(readlink -f "$2")
hf_python_or_skip

MODEL=(--model.arch=llama --model.n_layer=2 --model.n_head=4 --model.n_kv_head=2 --model.n_embd=64
       --model.block_size=128 --data.max_tokens=1024)
sentence_model "${MODEL[@]}"
# Two more shapes, a few steps each: tied + q/k/v biases (Qwen2), llama3 RoPE scaling.
for variant in "qwen --model.tie_embeddings=true --model.qkv_bias=true --model.rope_theta=1000000" \
               "scaled --model.rope_scaling=llama3 --model.rope_factor=8 --model.rope_original_context=32"; do
  read -r name keys <<< "$variant"
  # shellcheck disable=SC2086
  timeout 300 "${MPIRUN[@]}" -np 1 "$KILTER" train --data.dir=data "${MODEL[@]}" $keys --train.tokens_per_step=1024 \
    --train.steps=3 --output.trace_steps=0 --output.dir="runs/$name" > "$name.log" 2>&1 || { cat "$name.log"; fail "$name: kilter train failed"; }
  "$KILTER" export --format hf --run "runs/$name" --out "hf_$name" 2> "export_$name.log" \
    || { cat "export_$name.log"; fail "$name: export failed"; }
done
grep -q "Qwen2ForCausalLM" export_qwen.log || { cat export_qwen.log; fail "a model with q/k/v biases is not exported as Qwen2"; }

"$KILTER" export --format hf --run runs/t --out hf 2> export.log || { cat export.log; fail "export failed"; }
grep -q "step 60 of runs/t/checkpoints/step-00000060.h5 -> hf (fp32, LlamaForCausalLM" export.log \
  || { cat export.log; fail "export message"; }
"$KILTER" export --format hf --run runs/t --out hf16 --dtype bf16 2>/dev/null

# kilter's logits (the KV-cache generator `kilter sample` runs) and greedy tokens.
for run in t qwen scaled; do "$TOOL" logits "runs/$run" "$SENTENCE_PROMPT" "logits_$run.f32" >/dev/null; done
sentence_greedy runs/t greedy.json

# Import then export: through train.init_from's reader and export's writer, fp32 and bf16.
"$TOOL" roundtrip hf back >/dev/null
"$TOOL" roundtrip hf16 back16 bf16 >/dev/null
"$TOOL" roundtrip hf_qwen back_qwen >/dev/null

"$HFPY" - "$SRC/tests/python" "$SENTENCE_PROMPT" <<'PY'
import json, sys
import numpy as np, torch
from safetensors.torch import load_file as load_torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM
sys.path.insert(0, sys.argv[1])
from hf_export_checks import check_bf16_export, check_greedy
ids = [int(x) for x in sys.argv[2].split(",")]

def load(path, cls):
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), f"{path}: {info}"
    assert type(AutoModelForCausalLM.from_pretrained(path)) is cls, path
    return model.eval()

for path, cls, run in [("hf", LlamaForCausalLM, "t"), ("hf_qwen", Qwen2ForCausalLM, "qwen"),
                       ("hf_scaled", LlamaForCausalLM, "scaled")]:
    model = load(path, cls)
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0].numpy()
    kilter = np.fromfile(f"logits_{run}.f32", dtype=np.float32).reshape(len(ids), -1)
    diff = float(np.abs(hf - kilter).max())
    c = model.config
    print(f"hf_llama_export: {cls.__name__} ({c.num_attention_heads}/{c.num_key_value_heads} heads, tied "
          f"{c.tie_word_embeddings}, rope_scaling {c.rope_scaling}): logits of {len(ids)} positions, "
          f"max |transformers - kilter| = {diff:.2e}")
    assert diff <= 1e-4, diff

model = load("hf", LlamaForCausalLM)
config = json.load(open("hf/config.json"))
assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2, config
assert config["tie_word_embeddings"] is False and config["rope_scaling"] is None, config
check_greedy("hf_llama_export", model, ids, "greedy.json")
check_bf16_export("hf_llama_export", "hf", "hf16")
LlamaForCausalLM.from_pretrained("hf16")

for src, back in [("hf", "back"), ("hf16", "back16"), ("hf_qwen", "back_qwen")]:
    theirs, ours = load_torch(f"{src}/model.safetensors"), load_torch(f"{back}/model.safetensors")
    assert sorted(theirs) == sorted(ours), (src, sorted(theirs), sorted(ours))
    for name in theirs:
        a, b = theirs[name], ours[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        # the stored bits, compared as integers (torch.equal on floats would let -0 == 0 and NaN != NaN)
        assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32),
                           b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32)), f"{src}: {name}"
    print(f"hf_llama_export: {src}: import then export, {len(theirs)} tensors bit-identical ({a.dtype})")
PY
echo "hf_llama_export: ok"
