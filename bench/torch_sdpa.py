# Times PyTorch's causal SDPA (the flash backend: FlashAttention-2) forward and backward in bf16 at the shapes
# bench/attn_probe.cc times zerorun's tensor-core kernels at, so both come from the same device call. Grouped-query
# shapes (K < H) run SDPA with enable_gqa (no repeated copy), as zerorun reads its key/value heads in place; where
# the flash backend refuses a shape, the row says which backend ran. CUDA-event timing, 3 warm-up calls, 20 timed.
# Usage: python3 bench/torch_sdpa.py            the probe's table (every head size at B 4, H 16, T 2048; GPT-2 124M)
#        python3 bench/torch_sdpa.py B H K T D  one shape
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, n=20):
    for _ in range(3):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n


def probe(B, H, K, T, D):
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, K, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    kw = {"enable_gqa": True} if K != H else {}
    backend = "flash"
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
        ctx = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])  # noqa: E731
    except RuntimeError:
        backend = "default (flash refused)"
        ctx = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,  # noqa: E731
                                   SDPBackend.MATH])
    with ctx():
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
        g = torch.randn_like(o)
        both = timed(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw),
                                                 (q, k, v), g))
    flops = 4 * B * H * T * (T + 1) / 2 * D
    bwd = both - fwd
    print(json.dumps({"probe": "torch sdpa", "backend": backend, "B": B, "H": H, "K": K, "T": T, "D": D,
                      "fwd_ms": round(fwd, 4), "fwd_tflops": round(flops / fwd / 1e9, 1), "bwd_ms": round(bwd, 4),
                      "bwd_tflops": round(2.5 * flops / bwd / 1e9, 1), "fwd_bwd_ms": round(both, 4),
                      "torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)


if len(sys.argv) > 5:
    probe(*(int(x) for x in sys.argv[1:6]))
else:
    probe(8, 12, 12, 1024, 64)
    for D in (64, 80, 96, 128, 256):
        probe(4, 16, 16, 2048, D)
    for D in (64, 128):
        probe(4, 16, 4, 2048, D)
    probe(16, 14, 2, 1024, 64)
    probe(4, 12, 2, 4096, 128)
    probe(2, 32, 8, 2048, 128)
