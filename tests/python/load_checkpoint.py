"""Loads kilter checkpoints into a PyTorch GPT of the same shape and checks the loss (issue 8).

usage: load_checkpoint.py RUN_DIR DATA_DIR

The dataset holds one document repeated, so every micro-batch of every step is that document
and kilter's step loss (metrics/rank-00000.csv, row `step` = s, computed with the weights after
s optimizer steps) equals the mean cross-entropy of that one sequence under the weights in
checkpoints/step-s.h5. For every checkpoint that has such a row, the torch loss must match to
1e-4 relative. The loading code is the README snippet of docs/checkpoints.md.
"""
import csv
import glob
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import GPT  # noqa: E402  (the torch reference of tests/python)


def load_kilter_checkpoint(path):
    """The docs/checkpoints.md snippet: a torch GPT with the checkpoint's weights."""
    with h5py.File(path, "r") as f:
        shape = [int(f.attrs[k]) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")]
        step = int(f.attrs["step"])
        state = {name: torch.from_numpy(f["params"][name][...]) for name in f["params"]}
    model = GPT(*shape)
    model.load_state_dict(state, strict=True)  # every tensor present, every shape right
    return model, step


def the_document(data_dir):
    """The repeated document's tokens and eos_id, checking that every document is the same."""
    docs = []
    eos = None
    for shard in sorted(glob.glob(os.path.join(data_dir, "shard-*.h5"))):
        with h5py.File(shard, "r") as f:
            eos = int(f.attrs["eos_id"])
            tokens, offsets = f["tokens"][...], f["offsets"][...]
            docs += [tokens[offsets[i]:offsets[i + 1]].astype(np.int64) for i in range(len(offsets) - 1)]
    assert docs, f"no documents in {data_dir}"
    for d in docs[1:]:
        assert np.array_equal(d, docs[0]), "the dataset must repeat one document"
    return docs[0], eos


def main():
    run_dir, data_dir = sys.argv[1], sys.argv[2]
    doc, eos = the_document(data_dir)
    inputs = torch.from_numpy(doc).view(1, -1)
    targets = torch.from_numpy(np.append(doc[1:], eos)).view(1, -1)  # the token after the last is eos

    kilter_loss = {}
    with open(os.path.join(run_dir, "metrics", "rank-00000.csv")) as f:
        for row in csv.DictReader(f):
            kilter_loss[int(row["step"])] = float(row["loss"])

    checked = 0
    for path in sorted(glob.glob(os.path.join(run_dir, "checkpoints", "step-*.h5"))):
        model, step = load_kilter_checkpoint(path)
        if step not in kilter_loss:
            continue  # the run's last checkpoint: no step was computed with these weights
        with torch.no_grad():
            torch_loss = model(inputs, targets).item() / targets.numel()
        rel = abs(torch_loss - kilter_loss[step]) / abs(kilter_loss[step])
        print(f"{os.path.basename(path)}: torch loss {torch_loss:.7f}, kilter loss {kilter_loss[step]:.7f}, "
              f"relative difference {rel:.2e}")
        assert rel < 1e-4, f"{path}: torch and kilter losses differ by {rel:.2e}"
        checked += 1
    assert checked >= 2, f"expected at least 2 checkpoints with a matching step in {run_dir}, checked {checked}"
    print(f"load_checkpoint: {checked} checkpoints load into torch and give kilter's loss")


if __name__ == "__main__":
    main()
