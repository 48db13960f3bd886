#!/usr/bin/env bash
# Hugging Face parity of the CPU llama model (issue 38): kilter_model_dump --llama CASE writes
# random weights, a packed batch, kilter's logits (KV-cache generator), loss and gradients for
# four models (gqa: GQA and an untied head; tied; llama3: RoPE scaling and one K/V head; qwen2:
# q/k/v biases); tests/python/hf_llama_parity.py rebuilds each with transformers'
# LlamaForCausalLM or Qwen2ForCausalLM from a random config and requires logits within 1e-4,
# the loss within 1e-5 and every gradient within 1e-4 of its tensor's max |grad|.
# Skipped (exit 77) where the test-only venv with transformers is missing.
# usage: llama_parity.sh PATH/TO/kilter_model_dump   (KILTER_HF_PYTHON: the venv with transformers)
set -euo pipefail
dump_tool=$(readlink -f "${1:?usage: llama_parity.sh PATH/TO/kilter_model_dump}")
source_dir=${KILTER_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
python=${KILTER_HF_PYTHON:-/opt/kilter-test-venv/bin/python}
if ! "$python" -c "import transformers, torch, numpy" 2>/dev/null; then
  echo "SKIP: llama_parity: $python lacks transformers/torch/numpy (scripts/install-deps.sh --with-test-extras sets up the venv)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cases=(gqa tied llama3 qwen2)
for c in "${cases[@]}"; do
  mkdir "$work/$c"
  "$dump_tool" "$work/$c" --llama "$c" >/dev/null
done
OPENBLAS_NUM_THREADS=1 "$python" "$source_dir/tests/python/hf_llama_parity.py" "${cases[@]/#/$work/}"
