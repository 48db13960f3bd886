"""The PyTorch peer of bench/gpu_step.sh on one GPU: the same GPT-2 shape (pre-LN, tied
embeddings, tanh GELU, 4C MLP), the same batch (B pieces of T tokens), the same step (zero grads,
forward, backward of the token-mean loss, AdamW), in the configuration a PyTorch GPU user would
pick: bf16 autocast (or fp32 with TF32 off, like kilter's fp32), scaled_dot_product_attention
(flash attention where available), fused AdamW, and with --compile torch.compile. Prints one JSON
object; tokens/s come from the median step (each step ends with a device synchronize). It checks
what it times: the first loss must be about ln(vocab) and some later loss must be lower.
usage: python3 bench/torch_gpu_step.py [--precision bf16] [--compile] [--B 16 --T 1024 ...]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, C, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1), reduction="sum")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"impl": "torch", "check": "skipped: no CUDA device"}))
        return 77
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # kilter's fp32 is fp32 (bf16 is its fast mode)
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1337)
    model = GPT(a.layers, a.heads, a.embd, a.T, a.vocab).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = torch.compile(model) if a.compile else model
    g = torch.Generator().manual_seed(42)
    idx = torch.randint(0, a.vocab, (a.B, a.T), generator=g).to(dev)
    targets = torch.randint(0, a.vocab, (a.B, a.T), generator=g).to(dev)
    n_targets = a.B * a.T
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = step_model(idx, targets) / n_targets
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if step >= a.warmup:
            times.append(dt)
    times.sort()
    median = times[len(times) // 2]
    ok = abs(losses[0] - math.log(a.vocab)) < 0.5 and all(math.isfinite(x) for x in losses) and \
        min(losses[1:], default=losses[0] - 1) < losses[0]
    print(json.dumps({"impl": "torch", "torch_version": torch.__version__, "device": torch.cuda.get_device_name(),
                      "precision": a.precision, "compile": a.compile, "n_layer": a.layers, "n_embd": a.embd,
                      "n_head": a.heads, "vocab": a.vocab, "B": a.B, "T": a.T, "steps": a.steps,
                      "tokens_per_s": round(a.B * a.T / median, 1), "median_step_s": round(median, 5),
                      "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
                      "check": "ok" if ok else "FAILED"}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
