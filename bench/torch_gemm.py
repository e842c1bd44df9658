# GEMM probe: bf16 products at GPT-2 shapes (M = 8192 tokens), timed with CUDA
# events in PyTorch, bf16 output vs fp32 output (out_dtype), so the cost of
# fp32 activations in the linear layers can be read off. Prints TFLOP/s.
import json, sys, torch

M = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
shapes = [("qkv", 768, 2304), ("attn_proj", 768, 768), ("fc", 768, 3072), ("fc_proj", 3072, 768), ("lm_head", 768, 50304)]


def bench(f, reps=20):
    for _ in range(3): f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(reps): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


for name, k, n in shapes:
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(M, n, device="cuda", dtype=torch.bfloat16)
    fl = 2 * M * k * n
    r = {"shape": name, "M": M, "K": k, "N": n}
    r["fwd_bf16_ms"] = bench(lambda: x @ w.t())
    try:
        r["fwd_f32out_ms"] = bench(lambda: torch.mm(x, w.t(), out_dtype=torch.float32))
    except Exception as ex:  # older PyTorch
        r["fwd_f32out_ms"] = None
    r["dx_bf16_ms"] = bench(lambda: dy @ w)
    r["dw_bf16_ms"] = bench(lambda: dy.t() @ x)
    for key in list(r):
        if key.endswith("_ms") and r[key]:
            r[key.replace("_ms", "_tflops")] = round(fl / r[key] / 1e9, 1)
    print(json.dumps(r))
