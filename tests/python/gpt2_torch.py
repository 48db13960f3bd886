"""GPT-2 in PyTorch exactly as docs/design.md specifies it: the oracle kilter's CPU model is checked
against (tests/python/torch_parity.py) and the baseline bench/torch_step.py times.

nanoGPT's model without dropout: token + learned position embeddings (positions restart at 0 in
every row), pre-LN blocks (eps 1e-5), causal attention with scale 1/sqrt(head_dim), 4C MLP with
tanh GELU, final LayerNorm, LM head tied to wte. Rows may be padded: `lengths[b]` real positions;
keys at or beyond a row's length are masked out, and padded targets are -1 (ignored by the loss).
Parameter names match kilter's ParamLayout (transformer.wte.weight, transformer.h.0.ln_1.weight..).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("causal", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x, lengths=None):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = self.causal[:T, :T].view(1, 1, T, T)
        if lengths is not None:  # keys beyond the row's length are padding
            key_valid = torch.arange(T, device=x.device).view(1, T) < lengths.view(B, 1)
            mask = mask & key_valid.view(B, 1, 1, T)
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLP(n_embd)

    def forward(self, x, lengths=None):
        x = x + self.attn(self.ln_1(x), lengths)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, eps=1e-5),
        ))
        self.n_layer = n_layer

    def init_gpt2(self):
        """GPT-2 initialization (the same rules as kilter; its own random numbers)."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln_" in name:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layer))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets, lengths=None):
        """Returns the SUM of the cross-entropy over targets != -1."""
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx.clamp(min=0)) + self.transformer.wpe(pos).unsqueeze(0)
        for block in self.transformer.h:
            x = block(x, lengths)
        x = self.transformer.ln_f(x)
        logits = x @ self.transformer.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1,
                               reduction="sum")
