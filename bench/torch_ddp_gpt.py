"""PyTorch DDP peer of `kilter train` for bench/train_vs_torch.sh: the same GPT-2 shape (or, with
--arch llama, the same Llama: tests/python/llama_torch.py), the same
tokens per step (micro-batches of B x T, gradient accumulation with no_sync), gloo backend, one
process per rank with one thread each. --precision bf16 runs forward and loss under
torch.cpu.amp.autocast(dtype=torch.bfloat16) (fp32 weights, gradients and AdamW). Prints one JSON
line with tokens/s measured after warmup."""
import argparse, json, math, os, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.H = H

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        # torch 1.13 (Debian 12) has no scaled_dot_product_attention: the explicit form.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, C, T, V):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")


def worker(rank, a):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)
    if a.arch == "llama":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
        from llama_torch import Llama
        net = Llama(a.n_layer, a.n_head, a.n_kv_head or a.n_head, a.n_embd, a.ffn, a.block_size, a.vocab)
    else:
        net = GPT(a.n_layer, a.n_head, a.n_embd, a.block_size, a.vocab)
    # gloo cannot broadcast bool tensors (the Llama's causal mask buffer): every rank builds the
    # same buffers, so DDP need not sync them.
    bool_buffers = [name for name, b in net.named_buffers() if b.dtype == torch.bool]
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, bool_buffers)
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    micro = a.tokens_per_step // (a.batch * a.block_size * a.ranks)
    g = torch.Generator().manual_seed(rank)
    data = torch.randint(0, a.vocab, (micro, a.batch, a.block_size + 1), generator=g)
    tokens_per_step = a.tokens_per_step
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for m in range(micro):
            x, y = data[m, :, :-1], data[m, :, 1:]
            ctx = model.no_sync() if m + 1 < micro else torch.enable_grad()
            with ctx:
                if a.precision == "bf16":
                    with torch.cpu.amp.autocast(dtype=torch.bfloat16):
                        loss = model(x, y).float() / tokens_per_step
                else:
                    loss = model(x, y) / tokens_per_step
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"peer": "torch_ddp_gloo", "arch": a.arch, "precision": a.precision, "ranks": a.ranks, "threads": a.threads,
                          "tokens_per_second": a.steps * tokens_per_step / dt, "micro_batches_per_rank": micro}))
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for k, v in dict(ranks=2, threads=1, n_layer=4, n_head=4, n_embd=256, block_size=256, vocab=8192,
                     batch=8, tokens_per_step=16384, steps=5, warmup=2, port=29531, precision="fp32",
                     arch="gpt2", n_kv_head=0, ffn=0).items():
        p.add_argument(f"--{k}", type=type(v), default=v)
    a = p.parse_args()
    mp.spawn(worker, args=(a,), nprocs=a.ranks, join=True)
