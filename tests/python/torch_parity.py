"""PyTorch parity of kilter's CPU model: reads what kilter_model_dump wrote (layout.json,
params.f32, grads.f32, params_after_adamw.f32), rebuilds the same model with the same weights
in float64 (each packed piece run as its own sequence), and checks the summed loss, every parameter's gradient and one AdamW step
(torch.optim.AdamW with kilter's decay groups applied to kilter's gradients).

Tolerance: |kilter - torch| <= 1e-4 * max|torch| per tensor (and 1e-4 relative for the loss);
for the AdamW step the same on the update (new - old parameters).
Exit status 0 when everything is within it; prints the worst tensor either way.
usage: torch_parity.py DUMP_DIR
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import GPT  # noqa: E402

TOL = 1e-4


def main():
    dump = sys.argv[1]
    with open(os.path.join(dump, "layout.json")) as f:
        meta = json.load(f)
    cfg = meta["config"]
    params = np.fromfile(os.path.join(dump, "params.f32"), dtype=np.float32)
    grads = np.fromfile(os.path.join(dump, "grads.f32"), dtype=np.float32)
    after = np.fromfile(os.path.join(dump, "params_after_adamw.f32"), dtype=np.float32)
    n = meta["num_params"]
    assert params.size == n and grads.size == n and after.size == n, "dump sizes do not match layout.json"

    torch.manual_seed(0)
    model = GPT(cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"], cfg["vocab_size"]).double()
    named = dict(model.named_parameters())
    named["transformer.wte.weight"] = model.transformer.wte.weight  # tied head: one tensor
    with torch.no_grad():
        for t in meta["tensors"]:
            p = named[t["name"]]
            assert list(p.shape) == t["shape"], f"{t['name']}: torch {list(p.shape)} vs kilter {t['shape']}"
            p.copy_(torch.from_numpy(params[t["offset"]:t["offset"] + t["size"]].astype(np.float64)).view(p.shape))

    # kilter's batch is packed (pieces concatenated, boundaries in cu_seqlens); the reference runs
    # every piece as a sequence of its own, so nothing can cross pieces and positions start at 0.
    batch = meta["batch"]
    inputs = torch.tensor(batch["inputs"], dtype=torch.long)
    targets = torch.tensor(batch["targets"], dtype=torch.long)
    cu = batch["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == batch["N"] == inputs.numel(), "cu_seqlens do not match the batch"
    loss_sum = sum(model(inputs[a:b].view(1, -1), targets[a:b].view(1, -1)) for a, b in zip(cu[:-1], cu[1:]))
    print(f"batch: {len(cu) - 1} packed pieces of lengths {[b - a for a, b in zip(cu[:-1], cu[1:])]}")
    (loss_sum * meta["loss_scale"]).backward()

    failures = []
    loss_rel = abs(loss_sum.item() - meta["loss_sum"]) / abs(loss_sum.item())
    print(f"loss: torch {loss_sum.item():.8f} kilter {meta['loss_sum']:.8f} rel {loss_rel:.2e}")
    if not loss_rel <= TOL:
        failures.append("loss")

    worst = (0.0, "")
    for t in meta["tensors"]:
        ref = named[t["name"]].grad.detach().numpy().reshape(-1)
        got = grads[t["offset"]:t["offset"] + t["size"]].astype(np.float64)
        scale = np.abs(ref).max()
        err = np.abs(got - ref).max() / scale if scale > 0 else np.abs(got).max()
        worst = max(worst, (err, t["name"]))
        if not err <= TOL:
            failures.append(f"grad {t['name']} rel {err:.2e}")
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
            g = grads[t["offset"]:t["offset"] + t["size"]].astype(np.float64) * a["grad_scale"]
            named[t["name"]].grad.copy_(torch.from_numpy(g).view(named[t["name"]].shape))
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"])
    opt.step()
    worst_step = (0.0, "")
    for t in meta["tensors"]:
        ref_new = named[t["name"]].detach().numpy().reshape(-1)
        ref_old = params[t["offset"]:t["offset"] + t["size"]].astype(np.float64)
        got_new = after[t["offset"]:t["offset"] + t["size"]].astype(np.float64)
        # Compare the updates (new - old), relative to the largest update of the tensor.
        ref_upd, got_upd = ref_new - ref_old, got_new - ref_old
        scale = np.abs(ref_upd).max()
        err = np.abs(got_upd - ref_upd).max() / scale if scale > 0 else np.abs(got_upd).max()
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
