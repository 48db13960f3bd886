"""Shared by tests/e2e/hf_export.sh and hf_llama_export.sh (run by the test venv's python in the
script's work directory): the checks of `kilter export --format hf` that do not depend on the
architecture. Each prints a line naming the script `who` when it holds and fails an assert
otherwise.
"""
import json

import torch
from safetensors.torch import load_file


def check_greedy(who, model, ids, greedy_json):
    """transformers' greedy generate() after the prompt `ids` gives the tokens that
    `kilter sample --temperature 0 --max-new-tokens 64 --ignore-eos --json` wrote to greedy_json."""
    want = json.load(open(greedy_json))["tokens"]
    assert len(want) == 64, len(want)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=64, eos_token_id=None, pad_token_id=0)
    got = out[0][len(ids):].tolist()
    assert got == want, f"greedy tokens differ:\n transformers {got}\n kilter       {want}"
    assert len(set(got)) > 3, f"the model generates almost one token ({set(got)}): train it longer"
    print(f"{who}: greedy generate == kilter sample --temperature 0 for {len(got)} tokens")


def check_bf16_export(who, fp32_dir, bf16_dir):
    """--dtype bf16: every tensor is the fp32 export's rounded to nearest even (torch's rounding),
    stored as BF16, and config.json says torch_dtype bfloat16."""
    fp32, bf16 = load_file(f"{fp32_dir}/model.safetensors"), load_file(f"{bf16_dir}/model.safetensors")
    with open(f"{bf16_dir}/model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert all(v["dtype"] == "BF16" for k, v in header.items() if k != "__metadata__")
    assert json.load(open(f"{bf16_dir}/config.json"))["torch_dtype"] == "bfloat16"
    assert sorted(fp32) == sorted(bf16), (sorted(fp32), sorted(bf16))
    for name, value in fp32.items():
        assert torch.equal(value.to(torch.bfloat16), bf16[name]), name
    print(f"{who}: bf16 export == fp32 export rounded to bf16, {len(fp32)} tensors")
