"""Parity of kilter's CPU llama model with Hugging Face transformers (issue 38): for each dump
that `kilter_model_dump OUT --llama CASE` wrote (layout.json, params.f32, grads.f32, logits.f32),
builds LlamaForCausalLM (Qwen2ForCausalLM where the model has q/k/v biases) from a config with
the dump's keys, loads kilter's weights under their own names (kilter's tensors carry HF's), runs
every packed piece as a sequence of its own in float64, and checks:
  logits   max |kilter - transformers| <= 1e-4 (kilter: its KV-cache generator, fp32)
  loss     |kilter - transformers| <= 1e-5 (the batch's mean over its targets)
  grads    per tensor, max |kilter - transformers| <= 1e-4 x max |transformers|
Prints one line per case; exit status 0 when every case is within them.
usage: hf_llama_parity.py DUMP_DIR...
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_dump import check_gradients, load_weights, packed_pieces, read_dump  # noqa: E402

LOGITS_TOL, LOSS_TOL, GRAD_TOL = 1e-4, 1e-5, 1e-4


def hf_model(cfg):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    common = dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["n_embd"], intermediate_size=cfg["ffn_hidden"],
                  num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"],
                  num_key_value_heads=cfg["n_kv_head"], hidden_act="silu",
                  max_position_embeddings=cfg["block_size"], rms_norm_eps=cfg["norm_eps"],
                  rope_theta=cfg["rope_theta"], tie_word_embeddings=cfg["tied"], attention_dropout=0.0,
                  attn_implementation="eager")
    if cfg["qkv_bias"]:
        assert cfg["rope_scaling"] == "none", "transformers 4.44's Qwen2 has no rope_scaling"
        return Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **common))
    scaling = None
    if cfg["rope_scaling"] == "llama3":
        scaling = {"rope_type": "llama3", "factor": float(cfg["rope_factor"]),
                   "low_freq_factor": float(cfg["rope_low_freq_factor"]),
                   "high_freq_factor": float(cfg["rope_high_freq_factor"]),
                   "original_max_position_embeddings": cfg["rope_original_context"]}
    return LlamaForCausalLM(LlamaConfig(rope_scaling=scaling, attention_bias=False, mlp_bias=False, **common))


def check(dump):
    meta, (params, grads, logits_kilter) = read_dump(dump, "params", "grads", "logits")
    cfg = meta["config"]
    assert params.size == grads.size == meta["num_params"], "dump sizes do not match layout.json"

    torch.manual_seed(0)
    model = hf_model(cfg).double().eval()
    named = dict(model.named_parameters())
    kilter_names = [t["name"] for t in meta["tensors"]]
    assert sorted(kilter_names) == sorted(named), \
        f"tensor names differ:\n kilter {sorted(kilter_names)}\n hf     {sorted(named)}"
    load_weights(named, meta, params, "transformers")

    inputs, targets, pieces = packed_pieces(meta)
    loss_sum, logits = 0.0, []
    for a, b in pieces:
        out = model(input_ids=inputs[a:b].view(1, -1), use_cache=False).logits[0]
        logits.append(out.detach())
        loss_sum = loss_sum + torch.nn.functional.cross_entropy(out, targets[a:b], ignore_index=-1, reduction="sum")
    (loss_sum * meta["loss_scale"]).backward()

    failures = []
    hf_logits = torch.cat(logits).numpy()
    logits_kilter = logits_kilter.reshape(hf_logits.shape)
    logits_err = float(np.abs(hf_logits - logits_kilter).max())
    if not logits_err <= LOGITS_TOL:
        failures.append(f"logits {logits_err:.2e}")
    loss_hf, loss_kilter = loss_sum.item() * meta["loss_scale"], meta["loss_sum"] * meta["loss_scale"]
    loss_err = abs(loss_hf - loss_kilter)
    if not loss_err <= LOSS_TOL:
        failures.append(f"loss {loss_err:.2e}")
    worst = check_gradients(named, meta, grads, GRAD_TOL, failures)
    kind = type(model).__name__
    print(f"{cfg['case']:7s} {kind}: heads {cfg['n_head']}/{cfg['n_kv_head']} kv, tied {cfg['tied']}, "
          f"rope {cfg['rope_scaling']}, qkv_bias {cfg['qkv_bias']}: logits max diff {logits_err:.1e}, "
          f"loss {loss_kilter:.6f} diff {loss_err:.1e}, grads worst {worst[0]:.1e} ({worst[1]})")
    if failures:
        print(f"FAILED {cfg['case']}: " + "; ".join(failures[:10]))
    return not failures


def main():
    ok = [check(d) for d in sys.argv[1:]]
    if not all(ok):
        return 1
    print(f"hf_llama_parity: {len(ok)} cases within logits {LOGITS_TOL}, loss {LOSS_TOL}, grads {GRAD_TOL} of scale")
    return 0


if __name__ == "__main__":
    sys.exit(main())
