#!/usr/bin/env bash
# bench/sample_speed.sh — what the KV cache buys `kilter sample` (issue 14): a GPT-2 124M-shaped
# model (12 x 768, context 1024, vocab 50257; weights from one training step on a synthetic
# corpus) generates 32 greedy tokens after prompts of 8, 256 and 768 tokens. kilter (KV cache, one
# row per new token) is printed beside PyTorch generating the same tokens with a full forward over
# the whole sequence per token (what generation without a cache costs), one thread each, and the
# ratio. Checks what it times: the torch tokens must equal kilter's wherever torch's top-2 logit
# margin exceeds 1e-3 (the weights are nearly random, so exact ties are possible).
#
#   bench/sample_speed.sh [KILTER]     KILTER: the kilter binary (default: build/kilter)
#   env: NEW (new tokens, default 32), PROMPTS (default "8 256 768")
# Never run as a test (a few minutes on one core).
set -euo pipefail
KILTER=$(readlink -f "${1:-build/kilter}")
NEW=${NEW:-32}
PROMPTS=${PROMPTS:-"8 256 768"}
PY=${PY:-/usr/bin/python3}
SRC=$(cd "$(dirname "$0")/.." && pwd)
[[ -x "$KILTER" ]] || { echo "bench/sample_speed.sh: no kilter binary at $KILTER (pass its path)" >&2; exit 2; }
work=$(mktemp -d /tmp/kilter-sample-speed.XXXXXX)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
MPI_FLAGS=(--oversubscribe --bind-to none)
if [[ $(id -u) -eq 0 ]]; then MPI_FLAGS+=(--allow-run-as-root); fi

"$KILTER" prep synth --docs 8 --lengths uniform:1024,1024 --vocab 50257 --out "$work/data" --quiet > /dev/null
mpirun -np 1 "${MPI_FLAGS[@]}" "$KILTER" train --config "$SRC/inputs/gpt2-124m.ini" --data.dir="$work/data" \
  --train.precision=fp32 --train.backend=cpu --train.steps=1 --train.warmup=0 --train.tokens_per_step=1024 \
  --data.max_tokens=1024 --output.trace_steps=0 --output.dir="$work/run" > "$work/train.log" 2>&1 \
  || { cat "$work/train.log"; exit 1; }
for p in $PROMPTS; do
  ids=$(seq -s, 1 "$p")
  "$KILTER" sample --run "$work/run" --prompt-tokens "$ids" --temperature 0 --ignore-eos --max-new-tokens "$NEW" \
    --threads 1 --json > "$work/kilter-$p.json"
done

"$PY" - "$work" "$NEW" "$SRC" $PROMPTS <<'PY'
import glob, json, os, sys, time
import torch
work, new, src, prompts = sys.argv[1], int(sys.argv[2]), sys.argv[3], [int(p) for p in sys.argv[4:]]
sys.path.insert(0, os.path.join(src, "tests", "python"))
from load_checkpoint import load_kilter_checkpoint
from sample_greedy import next_logits
torch.set_num_threads(1)
model, _ = load_kilter_checkpoint(sorted(glob.glob(os.path.join(work, "run", "checkpoints", "step-*.h5")))[-1])
model.eval()
print(f"{'prompt':>7} {'kilter tok/s':>13} {'kilter prefill s':>17} {'torch no-cache tok/s':>21} {'ratio':>7}  checked")
for p in prompts:
    k = json.load(open(os.path.join(work, f"kilter-{p}.json")))
    assert len(k["tokens"]) == new and k["stop_reason"] == "max_new_tokens", k["stop_reason"]
    idx = torch.tensor([k["prompt_tokens"]], dtype=torch.long)
    checked = 0
    t0 = time.perf_counter()
    with torch.no_grad():
        for token in k["tokens"]:
            logits = next_logits(model, idx)
            top2 = torch.topk(logits, 2).values
            if float(top2[0] - top2[1]) > 1e-3:
                assert int(torch.argmax(logits)) == token, f"prompt {p}: torch and kilter disagree"
                checked += 1
            idx = torch.cat([idx, torch.tensor([[token]])], dim=1)  # follow kilter's tokens
    torch_rate = new / (time.perf_counter() - t0)
    rate = k["tokens_per_second"]
    print(f"{p:>7} {rate:>13.1f} {k['prefill_seconds']:>17.3f} {torch_rate:>21.1f} {rate / torch_rate:>7.2f}  {checked}/{new}")
PY
