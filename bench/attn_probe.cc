// Attention probe: the tensor-core flash-attention kernels on their own (16-bit qkv, output and gradients, as a
// 16-bit training step runs them), timed with CUDA events at a GPT-2 shape, so kernel changes can be compared
// in seconds against PyTorch's SDPA (bench/torch_sdpa.py, same shape) without a training run.
// Prints a JSON line per forward tiling (with its largest difference from tiling 0, the one training uses) and
// one per backward path (row term + dK/dV + dQ as two deterministic kernels, or one with dQ atomics): ms a call and
// TFLOP/s (causal FLOPs: 4·B·H·T²·D/2 forward, 2.5× that backward, as bench/torch_sdpa.py counts them). Usage (device
// machine): zerorun_attn_probe [B H T]  (head size 64)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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
    AttnDims dm;
    dm.B = B, dm.T = T, dm.H = dm.K = H, dm.D = D, dm.scale = 1.f / std::sqrt(static_cast<float>(D));
    const double fl = 4.0 * B * H * T * T * D / 2;
    auto bf = [](uint16_t h) {
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &u, 4);
      return v;
    };
    // Every forward tiling, checked against tiling 0's output and log-sum-exp.
    std::vector<uint16_t> ref_o(B * T * C), o(B * T * C);
    std::vector<float> ref_l(B * H * T), l(B * H * T);
    for (int cfg = 0; cfg < tc_forward_configs(D); ++cfg) {
      const double ms = event_ms([&] { tc_forward(true, qkv, nullptr, out, lse, dm, cfg); });
      if (cudaDeviceSynchronize() != cudaSuccess) ZR_FAIL("forward tiling ", cfg, " failed");
      cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(l.data(), lse, l.size() * 4, cudaMemcpyDeviceToHost);
      if (cfg == 0) ref_o = o, ref_l = l;
      double d = 0;
      for (size_t i = 0; i < o.size(); ++i) d = std::max(d, (double)std::fabs(bf(o[i]) - bf(ref_o[i])));
      for (size_t i = 0; i < l.size(); ++i) d = std::max(d, (double)std::fabs(l[i] - ref_l[i]));
      std::printf(
          "{\"probe\": \"zerorun tc attention fwd\", \"tiling\": %d, \"what\": \"%s\", \"ms\": %.4f, "
          "\"tflops\": %.1f, \"max_diff_vs_0\": %.3g}\n",
          cfg, tc_forward_config_name(D, cfg), ms, fl / ms / 1e9, d);
    }
    tc_forward(true, qkv, nullptr, out, lse, dm, 0);
    // Both backward paths: the two deterministic kernels (7 products), then the fused one (5 products, dQ by
    // atomics), checked against the first (largest difference over dQ, dK, dV, relative to the largest value).
    auto* dq_acc = static_cast<float*>(dev_alloc(B * T * C * 4));
    std::vector<uint16_t> ref_g(B * T * 3 * C), gr(B * T * 3 * C);
    for (int run = 0; run <= tc_backward_configs(D); ++run) {  // run 0: two kernels; then each one-kernel variant
      const bool fused = run > 0;
      float* acc = fused ? dq_acc : nullptr;
      const double bwd = event_ms([&] {
        tc_backward(true, qkv, nullptr, out, lse, dout, nullptr, dqkv, false, delta, acc, dm,
                    fused ? run - 1 : 0);
      });
      if (cudaDeviceSynchronize() != cudaSuccess) throw zerorun::Error("a kernel failed");
      cudaMemcpy(gr.data(), dqkv, gr.size() * 2, cudaMemcpyDeviceToHost);
      if (!fused) ref_g = gr;
      double d = 0, m = 0;
      for (size_t i = 0; i < gr.size(); ++i) {
        d = std::max(d, (double)std::fabs(bf(gr[i]) - bf(ref_g[i])));
        m = std::max(m, (double)std::fabs(bf(ref_g[i])));
      }
      std::printf(
          "{\"probe\": \"zerorun tc attention bwd\", \"kernels\": \"%s\", \"variant\": %d, \"B\": %lld, \"H\": %lld, "
          "\"T\": %lld, \"D\": %lld, \"ms\": %.4f, \"tflops\": %.1f, \"max_rel_diff_vs_two_kernel\": %.3g}\n",
          fused ? "one, dQ atomics" : "two, deterministic", fused ? run - 1 : 0, (long long)B, (long long)H,
          (long long)T, (long long)D, bwd, 2.5 * fl / bwd / 1e9, m > 0 ? d / m : d);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerorun_attn_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
