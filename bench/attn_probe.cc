// Attention probe: the tensor-core flash-attention kernels on their own (16-bit qkv, output and gradients, as a
// 16-bit training step runs them), timed with CUDA events at a GPT-2 shape, so kernel changes can be compared
// in seconds against PyTorch's SDPA (bench/torch_sdpa.py, same shape) without a training run.
// Prints one JSON line: forward and backward (row term + dK/dV + dQ) ms a call and TFLOP/s (causal FLOPs:
// 4·B·H·T²·D/2 forward, 2.5× that backward, as bench/torch_sdpa.py counts them).
// Usage (device machine): zerorun_attn_probe [B H T]  (head size 64)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "bench/probe_util.h"
#include "kernels/cuda/flash_attention.h"
#include "zerorun/error.h"

namespace {
using zerorun::probe::dev_alloc;
using zerorun::probe::event_ms;
using zerorun::probe::fill_bf16;
}  // namespace

int main(int argc, char** argv) {
  const int64_t B = argc > 3 ? std::atoll(argv[1]) : 8, H = argc > 3 ? std::atoll(argv[2]) : 12,
                T = argc > 3 ? std::atoll(argv[3]) : 1024, D = 64, C = H * D;
  try {
    auto* qkv = static_cast<uint16_t*>(dev_alloc(B * T * 3 * C * 2));
    auto* out = static_cast<uint16_t*>(dev_alloc(B * T * C * 2));
    auto* dout = static_cast<uint16_t*>(dev_alloc(B * T * C * 2));
    auto* dqkv = static_cast<uint16_t*>(dev_alloc(B * T * 3 * C * 2));
    auto* lse = static_cast<float*>(dev_alloc(B * H * T * 4));
    auto* delta = static_cast<float*>(dev_alloc(B * H * T * 4));
    fill_bf16(qkv, B * T * 3 * C, 1);
    fill_bf16(dout, B * T * C, 2);
    using namespace zerorun::kernels::flash;
    const double fwd = event_ms([&] { tc_forward(true, qkv, nullptr, out, lse, B, T, C, H); });
    const double bwd =
        event_ms([&] { tc_backward(true, qkv, nullptr, out, lse, dout, nullptr, dqkv, false, delta, B, T, C, H); });
    if (cudaDeviceSynchronize() != cudaSuccess) throw zerorun::Error("a kernel failed");
    const double fl = 4.0 * B * H * T * T * D / 2;
    std::printf(
        "{\"probe\": \"zerorun tc attention\", \"B\": %lld, \"H\": %lld, \"T\": %lld, \"D\": %lld, \"fwd_ms\": %.4f, "
        "\"fwd_tflops\": %.1f, \"bwd_ms\": %.4f, \"bwd_tflops\": %.1f}\n",
        (long long)B, (long long)H, (long long)T, (long long)D, fwd, fl / fwd / 1e9, bwd, 2.5 * fl / bwd / 1e9);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerorun_attn_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
