"""PyTorch parity of kilter's CPU model: reads what kilter_model_dump wrote (layout.json,
params.f32, grads.f32, params_after_adamw.f32), rebuilds the same model with the same weights
in float64 (each packed piece run as its own sequence), and checks the summed loss, every parameter's gradient and one AdamW step
(torch.optim.AdamW with kilter's decay groups applied to kilter's gradients).

Tolerance: |kilter - torch| <= 1e-4 * max|torch| per tensor (and 1e-4 relative for the loss);
for the AdamW step the same on the update (new - old parameters).
Exit status 0 when everything is within it; prints the worst tensor either way.
usage: torch_parity.py DUMP_DIR
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import GPT  # noqa: E402
from model_dump import (check_gradients, load_weights, packed_pieces, read_dump,  # noqa: E402
                        relative_error, tensor_values)

TOL = 1e-4


def main():
    meta, (params, grads, after) = read_dump(sys.argv[1], "params", "grads", "params_after_adamw")
    cfg = meta["config"]
    n = meta["num_params"]
    assert params.size == n and grads.size == n and after.size == n, "dump sizes do not match layout.json"

    torch.manual_seed(0)
    model = GPT(cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"], cfg["vocab_size"]).double()
    named = dict(model.named_parameters())
    named["transformer.wte.weight"] = model.transformer.wte.weight  # tied head: one tensor
    load_weights(named, meta, params, "torch")

    # kilter's batch is packed (pieces concatenated, boundaries in cu_seqlens).
    inputs, targets, pieces = packed_pieces(meta)
    loss_sum = sum(model(inputs[a:b].view(1, -1), targets[a:b].view(1, -1)) for a, b in pieces)
    print(f"batch: {len(pieces)} packed pieces of lengths {[b - a for a, b in pieces]}")
    (loss_sum * meta["loss_scale"]).backward()

    failures = []
    loss_rel = abs(loss_sum.item() - meta["loss_sum"]) / abs(loss_sum.item())
    print(f"loss: torch {loss_sum.item():.8f} kilter {meta['loss_sum']:.8f} rel {loss_rel:.2e}")
    if not loss_rel <= TOL:
        failures.append("loss")

    worst = check_gradients(named, meta, grads, TOL, failures)
    print(f"gradients: {len(meta['tensors'])} tensors, worst {worst[1]} rel {worst[0]:.2e}")

    # One AdamW step from zero moments with kilter's hyper-parameters and decay groups.
    a = meta["adamw"]
    decay = [named[t["name"]] for t in meta["tensors"] if t["decay"]]
    no_decay = [named[t["name"]] for t in meta["tensors"] if not t["decay"]]
    # The step starts from kilter's own gradients: torch's float64 ones differ in noise-level
    # elements (e.g. the key biases, whose exact gradient is 0), which Adam's normalization
    # would amplify to full-size steps.
    with torch.no_grad():
        for t in meta["tensors"]:
            g = tensor_values(grads, t) * a["grad_scale"]
            named[t["name"]].grad.copy_(torch.from_numpy(g).view(named[t["name"]].shape))
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"])
    opt.step()
    worst_step = (0.0, "")
    for t in meta["tensors"]:
        ref_new = named[t["name"]].detach().numpy().reshape(-1)
        ref_old = tensor_values(params, t)
        # Compare the updates (new - old), relative to the largest update of the tensor.
        err = relative_error(tensor_values(after, t) - ref_old, ref_new - ref_old)
        worst_step = max(worst_step, (err, t["name"]))
        if not err <= TOL:
            failures.append(f"adamw {t['name']} rel {err:.2e}")
    print(f"adamw step: worst {worst_step[1]} rel {worst_step[0]:.2e}")

    if failures:
        print("FAILED: " + "; ".join(failures[:10]))
        return 1
    print("torch parity: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
