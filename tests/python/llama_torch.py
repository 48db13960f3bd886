"""A Llama-family decoder in plain PyTorch, as docs/design.md specifies model.arch = llama: the
baseline bench/torch_step.py and bench/torch_ddp_gpt.py time beside kilter's (transformers'
LlamaForCausalLM, the parity oracle of tests/e2e, runs the same eager ops on Debian's torch 1.13,
with more Python per layer around them).

Token embedding, blocks of RMSNorm -> causal grouped-query attention with RoPE (Hugging Face's
rotate-half convention, base `rope_theta`) and no biases -> residual, RMSNorm -> SwiGLU MLP
down(silu(gate(x)) * up(x)) -> residual, a final RMSNorm, an untied LM head. Rows are whole
sequences starting at position 0 (no padding).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n_embd, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_embd))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, block_size, rope_theta):
        super().__init__()
        self.n_head, self.n_kv_head, self.hd = n_head, n_kv_head, n_embd // n_head
        self.q_proj = nn.Linear(n_embd, n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(n_embd, n_kv_head * self.hd, bias=False)
        self.v_proj = nn.Linear(n_embd, n_kv_head * self.hd, bias=False)
        self.o_proj = nn.Linear(n_head * self.hd, n_embd, bias=False)
        inv = 1.0 / (rope_theta ** (torch.arange(0, self.hd, 2).float() / self.hd))
        angles = torch.outer(torch.arange(block_size).float(), inv)
        emb = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.register_buffer("causal", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        cos, sin = self.cos[:T], self.sin[:T]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, self.n_head * self.hd)
        return self.o_proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, ffn, block_size, rope_theta):
        super().__init__()
        self.input_layernorm = RMSNorm(n_embd)
        self.self_attn = Attention(n_embd, n_head, n_kv_head, block_size, rope_theta)
        self.post_attention_layernorm = RMSNorm(n_embd)
        self.gate_proj = nn.Linear(n_embd, ffn, bias=False)
        self.up_proj = nn.Linear(n_embd, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, n_embd, bias=False)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, n_layer, n_head, n_kv_head, n_embd, ffn, block_size, vocab_size, rope_theta=10000.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, n_embd)
        self.layers = nn.ModuleList([Block(n_embd, n_head, n_kv_head, ffn, block_size, rope_theta)
                                     for _ in range(n_layer)])
        self.norm = RMSNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.n_layer = n_layer

    def init_weights(self):
        """kilter's rules for llama (lib/model/spec.cpp): N(0, 0.02); o_proj and down_proj
        N(0, 0.02/sqrt(2 n_layer)); norms 1."""
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layer))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        """Returns the SUM of the cross-entropy over targets != -1."""
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                               reduction="sum")
