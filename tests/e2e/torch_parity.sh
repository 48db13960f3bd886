#!/usr/bin/env bash
# PyTorch parity of the CPU model (issue 2): kilter_model_dump writes weights, a packed batch,
# kilter's loss, gradients and one AdamW step; tests/python/torch_parity.py recomputes them with
# torch (float64) and requires every gradient within 1e-4 of the tensor's max |grad|.
# Extra arguments go to kilter_model_dump (--cut: kilter's side computes pieces cut between ranks).
# usage: torch_parity.sh PATH/TO/kilter_model_dump [--cut]
set -euo pipefail
dump_tool=${1:?usage: torch_parity.sh PATH/TO/kilter_model_dump}
source_dir=${KILTER_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
python=${KILTER_PYTHON:-/usr/bin/python3}
if ! "$python" -c "import torch, numpy" 2>/dev/null; then
  echo "torch_parity: $python lacks torch/numpy (Debian: apt-get install python3-torch python3-numpy)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$dump_tool" "$work" "${@:2}"
"$python" "$source_dir/tests/python/torch_parity.py" "$work"
