# Times PyTorch's causal SDPA (flash) forward and backward at a GPT-2 shape, so
# the attention rows of a ZERORUN_PROFILE table have a reference from the same
# device call. Usage: python3 bench/torch_sdpa.py [B H T D]
import sys
import time

import torch
import torch.nn.functional as F

B, H, T, D = (int(x) for x in (sys.argv[1:] or [8, 12, 1024, 64]))
q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))


def timed(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
g = torch.randn_like(o)
both = timed(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g))
flops = 4 * B * H * T * T * D / 2
print(f"torch SDPA B={B} H={H} T={T} D={D}: fwd {fwd:.3f} ms ({flops / fwd / 1e9:.0f} TFLOP/s), "
      f"bwd {both - fwd:.3f} ms ({2.5 * flops / (both - fwd) / 1e9:.0f} TFLOP/s)")
