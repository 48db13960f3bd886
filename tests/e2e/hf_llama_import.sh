#!/usr/bin/env bash
# `train.init_from` of the Llama family (issue 38): random LlamaForCausalLM (GQA, llama3 RoPE
# scaling, rope_theta 5e5), Qwen2ForCausalLM (q/k/v biases, tied, one K/V head) and
# MistralForCausalLM (a sliding window as long as the context) saved by transformers start kilter
# runs whose first-step loss equals the HF model's loss on the same batch (within 1e-5). With a
# learning rate too small to move a weight, the run's checkpoint holds the source's weights: its
# `kilter sample --temperature 0` equals transformers' greedy generate(), and `kilter export`
# gives back the source's tensors bit for bit (a bf16 source through --dtype bf16 too). Refusals
# name the config field and the model.* key.
# Skipped (exit 77) where the test-only venv with transformers is missing.
# usage: hf_llama_import.sh KILTER KILTER_HF_TOOL   (KILTER_HF_PYTHON: the venv with transformers)
source "$(dirname "$0")/lib.sh"
set -E
trap 'echo "FAIL: $(basename "$0"): the command at line $LINENO exited with $?" >&2' ERR
hf_python_or_skip

# Random models (larger init than HF's so every tensor matters) saved the way users get them.
"$HFPY" - <<'PY'
import json, shutil
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)
torch.manual_seed(7)
shape = dict(vocab_size=500, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, initializer_range=0.2)

def save(model, path, dtype=torch.float32):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))  # biases and norms away from 0 and 1
    model.to(dtype).save_pretrained(path, safe_serialization=True)

llama = LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
                                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                                     **shape))
save(llama, "llama")
llama.to(torch.bfloat16).save_pretrained("llama_bf16", safe_serialization=True)
save(Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=1, rms_norm_eps=1e-6, tie_word_embeddings=True, **shape)), "qwen2")
save(MistralForCausalLM(MistralConfig(num_key_value_heads=2, rms_norm_eps=1e-5, sliding_window=64, **shape)), "mistral")
# What kilter refuses: a sliding window shorter than the context, a RoPE scaling it does not compute.
for src, dst, key, value in [("mistral", "mistral_sw", "sliding_window", 32),
                             ("llama", "llama_yarn", "rope_scaling", {"rope_type": "yarn", "factor": 4.0})]:
    shutil.copytree(src, dst)
    config = json.load(open(f"{dst}/config.json"))
    config[key] = value
    json.dump(config, open(f"{dst}/config.json", "w"))
PY
for d in llama llama_bf16 qwen2 mistral; do [ -f "$d/model.safetensors" ] || fail "transformers wrote no $d/model.safetensors"; done

# Every document fits the context (one piece each) and one step holds them all; a learning rate of
# 1e-30 leaves every weight as it is (no weight is within 1e-22 of zero), so checkpoints hold the source.
"$KILTER" prep synth --docs 40 --lengths uniform:8,65 --vocab 500 --shards 2 --seed 1 --out data >/dev/null 2>&1
COMMON=(--data.dir=data --model.arch=llama --model.n_layer=2 --model.n_head=4 --model.n_embd=32 --model.ffn_hidden=48
        --model.block_size=64 --data.max_tokens=1024 --train.tokens_per_step=100000 --data.tail=redistribute
        --data.eval_fraction=0 --output.trace_steps=0 --train.steps=1 --train.lr=1e-30)
LLAMA=(--model.n_kv_head=2 --model.rope_theta=500000 --model.rope_scaling=llama3 --model.rope_original_context=16)
QWEN2=(--model.n_kv_head=1 --model.qkv_bias=true --model.tie_embeddings=true --model.norm_eps=1e-6)
MISTRAL=(--model.n_kv_head=2)
train llama.log 2 --train.init_from=llama "${LLAMA[@]}" --output.dir=runs/llama
grep -q "kilter: weights from Hugging Face Llama directory llama; optimizer state and data position start fresh" llama.log \
  || { cat llama.log; fail "no init_from note"; }
train qwen2.log 1 --train.init_from=qwen2 "${QWEN2[@]}" --output.dir=runs/qwen2
train mistral.log 1 --train.init_from=mistral "${MISTRAL[@]}" --output.dir=runs/mistral
train bf16.log 1 --train.init_from=llama_bf16 "${LLAMA[@]}" --output.dir=runs/llama_bf16

prompt="3,141,59,265,358,97,93,238,462,64,33,83,279,50"
"$KILTER" sample --run runs/llama --prompt-tokens "$prompt" --temperature 0 --max-new-tokens 20 --ignore-eos --json \
  > greedy.json 2>/dev/null
for run in llama qwen2 mistral; do "$KILTER" export --format hf --run "runs/$run" --out "back_$run" 2>/dev/null; done
"$KILTER" export --format hf --run runs/llama_bf16 --out back_llama_bf16 --dtype bf16 2>/dev/null

json() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }
"$HFPY" - "$prompt" "$(json runs/llama/summary.json 'd["final_loss"]')" "$(json runs/qwen2/summary.json 'd["final_loss"]')" \
  "$(json runs/mistral/summary.json 'd["final_loss"]')" <<'PY'
import glob, json, sys
import h5py, numpy as np, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
docs = []
for path in sorted(glob.glob("data/shard-*.h5")):
    with h5py.File(path) as f:
        tokens, offsets, eos = f["tokens"][:].astype(np.int64), f["offsets"][:], int(f.attrs["eos_id"])
    docs += [torch.from_numpy(tokens[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
for name, kilter_loss in zip(["llama", "qwen2", "mistral"], map(float, sys.argv[2:5])):
    model = AutoModelForCausalLM.from_pretrained(name).eval()
    total, count = 0.0, 0
    for doc in docs:
        targets = torch.cat([doc[1:], torch.tensor([eos])])  # a document's last token predicts EOS
        with torch.no_grad():
            logits = model(doc[None], use_cache=False).logits[0].double()
        total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += len(doc)
    hf_loss = total / count
    print(f"hf_llama_import: {type(model).__name__}: first-step loss kilter {kilter_loss:.8f}, transformers "
          f"{hf_loss:.8f} ({count} targets)")
    assert abs(hf_loss - kilter_loss) <= 1e-5, abs(hf_loss - kilter_loss)

ids = [int(x) for x in sys.argv[1].split(",")]
model = AutoModelForCausalLM.from_pretrained("llama").eval()
with torch.no_grad():
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=20, eos_token_id=None, pad_token_id=0)
got, want = out[0][len(ids):].tolist(), json.load(open("greedy.json"))["tokens"]
assert got == want, f"greedy tokens differ:\n transformers {got}\n kilter       {want}"
print(f"hf_llama_import: greedy generate == kilter sample --temperature 0 for {len(got)} tokens")

def bits(t):  # the stored bits as integers
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)
for src in ["llama", "llama_bf16", "qwen2", "mistral"]:
    theirs, ours = load_file(f"{src}/model.safetensors"), load_file(f"back_{src}/model.safetensors")
    assert sorted(theirs) == sorted(ours), (src, sorted(set(theirs) ^ set(ours)))
    for name, a in theirs.items():
        b = ours[name]
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b)), f"{src}: {name} differs"
    print(f"hf_llama_import: {src}: init_from, then export: {len(theirs)} tensors bit-identical ({a.dtype})")
PY

# Refusals name the config field, both values and the key to set.
expect_refusal() {  # expect_refusal LOG TEXT [--key=value...]: COMMON and these keys (an option may be given
  # once: the last value of a key wins)
  local log=$1 text=$2 i key
  shift 2
  local all=("${COMMON[@]}" "$@") args=()
  local -A seen=()
  for ((i = ${#all[@]} - 1; i >= 0; i--)); do
    key=${all[i]%%=*}
    [ -z "${seen[$key]:-}" ] || continue
    seen[$key]=1
    args=("${all[i]}" "${args[@]}")
  done
  if timeout 120 "${MPIRUN[@]}" -np 1 "$KILTER" train "${args[@]}" --output.dir=runs/refused > "$log" 2>&1; then
    fail "$log: the run was not refused"
  fi
  grep -qF -- "$text" "$log" || { cat "$log"; fail "$log: no '$text'"; }
}
expect_refusal kv.log "num_key_value_heads = 2 in llama/config.json, model.n_kv_head = 4 in the run: set model.n_kv_head = 2" \
  --train.init_from=llama "${LLAMA[@]}" --model.n_kv_head=4
expect_refusal bias.log "q/k/v biases (model_type qwen2) = true in qwen2/config.json, model.qkv_bias = false in the run: set model.qkv_bias = true" \
  --train.init_from=qwen2 "${QWEN2[@]}" --model.qkv_bias=false
expect_refusal window.log "sliding_window = 32 in mistral_sw/config.json is shorter than the context, model.block_size = 64" \
  --train.init_from=mistral_sw "${MISTRAL[@]}"
expect_refusal yarn.log 'rope_scaling.rope_type = "yarn" in llama_yarn/config.json is not supported' \
  --train.init_from=llama_yarn "${LLAMA[@]}"
expect_refusal arch.log "model_type = llama in llama/config.json, model.arch = gpt2 in the run: set model.arch = llama" \
  --train.init_from=llama --model.arch=gpt2
echo "hf_llama_import: ok"
