"""Shared by tests/python/torch_parity.py and hf_llama_parity.py: what kilter_model_dump writes
(layout.json: the config, the tensor layout, the packed batch, the loss; raw float32 arrays in
layout order), read back; kilter's weights loaded into a torch module by tensor name; and the
per-tensor error both state their tolerances in, max |kilter - reference| / max |reference|.
"""
import json
import os

import numpy as np
import torch


def read_dump(dump, *arrays):
    """layout.json's contents and the float32 arrays NAME.f32 of `arrays`, in that order."""
    with open(os.path.join(dump, "layout.json")) as f:
        meta = json.load(f)
    return meta, [np.fromfile(os.path.join(dump, f"{name}.f32"), dtype=np.float32) for name in arrays]


def tensor_values(values, tensor):
    """One tensor's elements of a layout-ordered array, in float64."""
    return values[tensor["offset"]:tensor["offset"] + tensor["size"]].astype(np.float64)


def load_weights(named, meta, params, reference):
    """Copies kilter's weights into the parameters `named` (name -> torch parameter) of the
    `reference` model, checking every tensor's shape."""
    with torch.no_grad():
        for t in meta["tensors"]:
            p = named[t["name"]]
            assert list(p.shape) == t["shape"], f"{t['name']}: {reference} {list(p.shape)} vs kilter {t['shape']}"
            p.copy_(torch.from_numpy(tensor_values(params, t)).view(p.shape))


def packed_pieces(meta):
    """The dump's packed batch: its inputs and targets (long tensors) and each piece's [start, end)
    (from cu_seqlens). The references run every piece as a sequence of its own, so nothing can
    cross pieces and positions start at 0."""
    batch = meta["batch"]
    inputs = torch.tensor(batch["inputs"], dtype=torch.long)
    targets = torch.tensor(batch["targets"], dtype=torch.long)
    cu = batch["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == batch["N"] == inputs.numel(), "cu_seqlens do not match the batch"
    return inputs, targets, list(zip(cu[:-1], cu[1:]))


def relative_error(got, ref):
    """max |got - ref| / max |ref|; max |got| where ref is all zero."""
    scale = np.abs(ref).max()
    return float(np.abs(got - ref).max() / scale) if scale > 0 else float(np.abs(got).max())


def check_gradients(named, meta, grads, tol, failures):
    """kilter's gradient of every tensor against the reference's (.grad of `named`) within `tol`
    relative error; appends one line per tensor outside it to `failures`. Returns the worst
    (error, tensor name)."""
    worst = (0.0, "")
    for t in meta["tensors"]:
        err = relative_error(tensor_values(grads, t), named[t["name"]].grad.detach().numpy().reshape(-1))
        worst = max(worst, (err, t["name"]))
        if not err <= tol:
            failures.append(f"grad {t['name']} rel {err:.2e}")
    return worst
