"""Greedy `kilter sample` against an independent PyTorch GPT-2 (issue 14).

usage: sample_greedy.py CHECKPOINT SAMPLE_JSON [MIN_TOKENS]

SAMPLE_JSON is `kilter sample --checkpoint CHECKPOINT --temperature 0 --ignore-eos --json`'s
output. The checkpoint's weights go into tests/python/gpt2_torch.py's GPT (float64), which
generates greedily from the same prompt ids with a full forward over the whole sequence at every
step (no cache). Every one of kilter's tokens must equal torch's, and there must be at least
MIN_TOKENS (default 64) of them.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load_checkpoint import load_kilter_checkpoint  # noqa: E402


def next_logits(model, idx):
    """Logits after the last position of idx (1, T): the GPT of gpt2_torch.py without its loss."""
    t = model.transformer
    pos = torch.arange(idx.shape[1])
    x = t.wte(idx) + t.wpe(pos).unsqueeze(0)
    for block in t.h:
        x = block(x)
    x = t.ln_f(x)
    return x[0, -1] @ t.wte.weight.t()


def main():
    checkpoint, sample_json = sys.argv[1], sys.argv[2]
    min_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    with open(sample_json) as f:
        sample = json.load(f)
    model, _ = load_kilter_checkpoint(checkpoint)
    model = model.double().eval()
    kilter_tokens = sample["tokens"]
    assert len(kilter_tokens) >= min_tokens, f"kilter generated {len(kilter_tokens)} tokens, fewer than {min_tokens}"
    idx = torch.tensor([sample["prompt_tokens"]], dtype=torch.long)
    smallest_margin = float("inf")
    with torch.no_grad():
        for i, token in enumerate(kilter_tokens):
            logits = next_logits(model, idx)
            top2 = torch.topk(logits, 2)
            smallest_margin = min(smallest_margin, float(top2.values[0] - top2.values[1]))
            expected = int(torch.argmax(logits))
            assert token == expected, (f"token {i}: kilter {token}, torch {expected} (torch's top-2 margin "
                                       f"{float(top2.values[0] - top2.values[1]):.3g})")
            idx = torch.cat([idx, torch.tensor([[expected]])], dim=1)
    print(f"sample_greedy: {len(kilter_tokens)} greedy tokens equal torch's (float64, no cache); "
          f"smallest top-2 logit margin {smallest_margin:.3g}")


if __name__ == "__main__":
    main()
