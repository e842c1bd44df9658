#!/usr/bin/env python3
"""PyTorch reference for bench/bench_gpt2.sh: GPT-2 from random init, bf16
autocast, SDPA (flash) attention, fused AdamW, torch.compile; prints tokens/s,
MFU and peak memory in the same format as the zerorun side."""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, C, L, H):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if n.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def bench(model, a):
    """Times a.steps steps (after 3 warm-up steps) of model(idx, targets) -> loss under bf16 autocast with fused
    AdamW and torch.compile (a.compile) on a fixed random batch; prints the JSON line bench_gpt2.sh reads."""
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_fn = torch.compile(model) if a.compile else model
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
    y = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(a.steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    tok_s = a.batch * a.seq / (sum(times) / len(times))
    flops_tok = 6 * n_params + 6 * a.layers * a.embd * a.seq
    print(json.dumps({"impl": "pytorch" + (" compile" if a.compile else ""), "size": a.size, "params": n_params,
                      "tokens_per_s": tok_s, "mfu": tok_s * flops_tok / 989e12,
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "loss": loss.item()}))


def args(extra=(), vocab=50304):
    """The command line both PyTorch references take (extra: (flag, type) pairs of their own)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--embd", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    for flag, t, *default in extra:  # (flag, type) required, (flag, type, default) optional
        if default:
            ap.add_argument(flag, type=t, default=default[0])
        else:
            ap.add_argument(flag, type=t, required=True)
    ap.add_argument("--vocab", type=int, default=vocab)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    return a


def main():
    a = args()
    bench(GPT(a.vocab, a.seq, a.embd, a.layers, a.heads).cuda(), a)


if __name__ == "__main__":
    main()
