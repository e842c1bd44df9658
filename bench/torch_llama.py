#!/usr/bin/env python3
"""PyTorch reference for the llama-* sizes of bench/bench_gpt2.sh: a Llama
(RMSNorm, rotary q/k, grouped-query SDPA attention, SwiGLU, untied head, no
biases; --tied 1 --qkv_bias 1: Qwen2's tied head and q/k/v biases) from random init, timed by torch_gpt2.py's bench (bf16 autocast, fused
AdamW, torch.compile); prints tokens/s, MFU and peak memory in the zerorun
side's format."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_gpt2 import args, bench  # the command line and the timing loop, shared


def rotate(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, C, H, K, FF, L, qkv_bias=False):
        super().__init__()
        self.H, self.K, self.D = H, K, C // H
        self.ln_1, self.ln_2 = nn.RMSNorm(C, eps=1e-6), nn.RMSNorm(C, eps=1e-6)
        self.qkv = nn.Linear(C, (H + 2 * K) * self.D, bias=qkv_bias)
        self.o = nn.Linear(C, C, bias=False)
        self.gate, self.up = nn.Linear(C, FF, bias=False), nn.Linear(C, FF, bias=False)
        self.down = nn.Linear(FF, C, bias=False)
        for w in (self.o.weight, self.down.weight):
            nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * L))

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split([self.H * self.D, self.K * self.D, self.K * self.D], dim=2)
        q = rotate(q.view(B, T, self.H, self.D).transpose(1, 2), cos, sin)
        k = rotate(k.view(B, T, self.K, self.D).transpose(1, 2), cos, sin)
        v = v.view(B, T, self.K, self.D).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.ln_2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, V, T, C, L, H, K, FF, tied=False, qkv_bias=False):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.h = nn.ModuleList(Block(C, H, K, FF, L, qkv_bias) for _ in range(L))
        self.norm = nn.RMSNorm(C, eps=1e-6)
        self.head = nn.Linear(C, V, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        for n, p in self.named_parameters():
            if p.dim() >= 2 and not n.endswith(("o.weight", "down.weight")):
                nn.init.normal_(p, 0.0, 0.02)
            elif n.endswith("qkv.bias"):
                nn.init.zeros_(p)
        D = C // H
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float32), inv)] * 2, dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.emb(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.h:
            x = b(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    a = args((("--kv_heads", int), ("--ffn", int), ("--tied", int, 0), ("--qkv_bias", int, 0)), vocab=32000)
    bench(Llama(a.vocab, a.seq, a.embd, a.layers, a.heads, a.kv_heads, a.ffn, a.tied == 1, a.qkv_bias == 1).cuda(), a)


if __name__ == "__main__":
    main()
