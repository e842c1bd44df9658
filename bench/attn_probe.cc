// Attention probe: the tensor-core flash-attention kernels on their own (16-bit qkv, output and gradients, as a
// 16-bit training step runs them), timed with CUDA events, so kernel changes can be compared in seconds against
// PyTorch's SDPA (bench/torch_sdpa.py, the same shapes) without a training run. Prints a JSON line per shape:
// forward ms and TFLOP/s (causal FLOPs: 4·B·H·T²·D/2 forward, 2.5× that backward, as bench/torch_sdpa.py counts
// them; with a window, the FLOPs of the keys each query sees), the one-kernel backward (dQ by atomics, what
// training runs) and the two atomic-free kernels (ZERORUN_DETERMINISTIC=1), and the largest difference between the
// two backward paths relative to the largest gradient.
// Usage (device machine):
//   zerorun_attn_probe                       every head size (64, 80, 96, 128, 256) at B 4, H 16, T 2048 (with every
//                                            tiling and variant of 80..256), multi-head and grouped-query (K 4), a
//                                            window, a cap, and GPT-2 124M's shape (8, 12, 1024, 64)
//   zerorun_attn_probe B H K T D [W [CAP [DOC]]]  one shape (W: sliding window, CAP: soft-cap, DOC: documents of DOC
//                                            tokens packed into each row, AttnDims::pos); K < H also times the
//                                            backward with the grouped-query split (flash::tc_backward's gqa_split)
//   zerorun_attn_probe sweep [B H T]         head size 64: every forward tiling and backward variant (GPT-2 shape)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/probe_util.h"
#include "kernels/cuda/flash_attention.h"
#include "zerorun/error.h"

namespace {
using zerorun::probe::bf16_value;
using zerorun::probe::dev_alloc;
using zerorun::probe::event_ms;
using zerorun::probe::fill_bf16;
using namespace zerorun::kernels::flash;

// Query-key pairs the causal (windowed, per-document) mask keeps, per (batch, head).
double pairs(int64_t T, int64_t W, int64_t doc) {
  double n = 0;
  for (int64_t t = 0; t < T; ++t) {
    int64_t seen = t + 1;
    if (W > 0) seen = std::min(seen, W);
    if (doc > 0) seen = std::min(seen, t % doc + 1);
    n += seen;
  }
  return n;
}

struct Shape {
  int64_t B, H, K, T, D, W = 0;
  float cap = 0.f;
  int64_t doc = 0;  // > 0: documents of this many tokens packed into each row
};

// Times one shape: forward (tiling fcfg), the one-kernel backward (variant bcfg) and the two-kernel backward.
void probe(const Shape& s, bool sweep) {
  AttnDims d;
  d.B = s.B, d.T = s.T, d.H = s.H, d.K = s.K, d.D = s.D, d.window = s.W, d.softcap = s.cap;
  d.scale = 1.f / std::sqrt(static_cast<float>(s.D));
  int32_t* pos = nullptr;
  if (s.doc > 0) {
    std::vector<int32_t> hp(s.B * s.T);
    for (size_t i = 0; i < hp.size(); ++i) hp[i] = static_cast<int32_t>(i % s.T % s.doc);
    pos = static_cast<int32_t*>(dev_alloc(hp.size() * 4));
    cudaMemcpy(pos, hp.data(), hp.size() * 4, cudaMemcpyHostToDevice);
    d.pos = pos;
  }
  const int64_t n3 = s.B * s.T * d.width(), n = s.B * s.T * d.out_width(), nl = s.B * s.H * s.T;
  auto* qkv = static_cast<uint16_t*>(dev_alloc(n3 * 2));
  auto* out = static_cast<uint16_t*>(dev_alloc(n * 2));
  auto* dout = static_cast<uint16_t*>(dev_alloc(n * 2));
  auto* dqkv = static_cast<uint16_t*>(dev_alloc(n3 * 2));
  auto* lse = static_cast<float*>(dev_alloc(nl * 4));
  auto* delta = static_cast<float*>(dev_alloc(nl * 4));
  auto* dq_acc = static_cast<float*>(dev_alloc(n3 * 4));
  fill_bf16(qkv, n3, 1);
  fill_bf16(dout, n, 2);
  const double fl = 4.0 * s.B * s.H * pairs(s.T, s.W, s.doc) * s.D;
  char head[256];
  std::snprintf(head, sizeof head,
                "\"B\": %lld, \"H\": %lld, \"K\": %lld, \"T\": %lld, \"D\": %lld, \"window\": %lld, "
                "\"softcap\": %g, \"doc\": %lld",
                (long long)s.B, (long long)s.H, (long long)s.K, (long long)s.T, (long long)s.D, (long long)s.W, s.cap,
                (long long)s.doc);
  // Forward tilings (sweep: all, checked against tiling 0's output and log-sum-exp; else tiling 0).
  std::vector<uint16_t> ref_o(n), o(n);
  std::vector<float> ref_l(nl), l(nl);
  double fwd0 = 0;
  for (int cfg = 0; cfg < (sweep ? tc_forward_configs(s.D) : 1); ++cfg) {
    const double ms = event_ms([&] { tc_forward(true, qkv, nullptr, out, lse, d, cfg); });
    if (cudaDeviceSynchronize() != cudaSuccess) ZR_FAIL("forward tiling ", cfg, " failed");
    cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(l.data(), lse, l.size() * 4, cudaMemcpyDeviceToHost);
    if (cfg == 0) ref_o = o, ref_l = l, fwd0 = ms;
    double df = 0;
    for (size_t i = 0; i < o.size(); ++i) df = std::max(df, (double)std::fabs(bf16_value(o[i]) - bf16_value(ref_o[i])));
    for (size_t i = 0; i < l.size(); ++i) df = std::max(df, (double)std::fabs(l[i] - ref_l[i]));
    if (sweep)
      std::printf(
          "{\"probe\": \"zerorun tc attention fwd\", %s, \"tiling\": %d, \"what\": \"%s\", \"ms\": %.4f, "
          "\"tflops\": %.1f, \"max_diff_vs_0\": %.3g}\n",
          head, cfg, tc_forward_config_name(s.D, cfg), ms, fl / ms / 1e9, df);
  }
  tc_forward(true, qkv, nullptr, out, lse, d, 0);
  // Backward: the two atomic-free kernels, then each one-kernel variant (sweep) or variant 0, checked against the
  // first (largest difference over dQ, dK, dV relative to the largest value).
  std::vector<uint16_t> ref_g(n3), gr(n3);
  double bwd_two = 0, bwd_one = 0, diff_one = 0;
  for (int run = 0; run <= (sweep ? tc_backward_configs(s.D) : 1); ++run) {
    const bool fused = run > 0;
    const double ms = event_ms([&] {
      tc_backward(true, qkv, nullptr, out, lse, dout, nullptr, dqkv, false, delta, fused ? dq_acc : nullptr, d,
                  fused ? run - 1 : 0);
    });
    if (cudaDeviceSynchronize() != cudaSuccess) ZR_FAIL("backward run ", run, " failed");
    cudaMemcpy(gr.data(), dqkv, gr.size() * 2, cudaMemcpyDeviceToHost);
    if (!fused) ref_g = gr;
    double df = 0, m = 0;
    for (size_t i = 0; i < gr.size(); ++i) {
      df = std::max(df, (double)std::fabs(bf16_value(gr[i]) - bf16_value(ref_g[i])));
      m = std::max(m, (double)std::fabs(bf16_value(ref_g[i])));
    }
    if (!fused) bwd_two = ms;
    if (run == 1) bwd_one = ms, diff_one = m > 0 ? df / m : df;
    if (sweep)
      std::printf(
          "{\"probe\": \"zerorun tc attention bwd\", %s, \"kernels\": \"%s\", \"variant\": %d, \"ms\": %.4f, "
          "\"tflops\": %.1f, \"max_rel_diff_vs_two_kernel\": %.3g}\n",
          head, fused ? "one, dQ atomics" : "two, deterministic", fused ? run - 1 : 0, ms, 2.5 * fl / ms / 1e9,
          m > 0 ? df / m : df);
  }
  // Grouped-query heads: the one-kernel backward with the key-block work split over the query heads (gqa_split),
  // variant 0, or each variant ATTN_PROBE_SPLIT lists (comma-separated) where the head size has it.
  std::vector<int> split_cfgs;
  for (const char* e = std::getenv("ATTN_PROBE_SPLIT"); e && *e;) {
    split_cfgs.push_back(std::atoi(e));
    e = std::strchr(e, ',');
    if (e) ++e;
  }
  if (split_cfgs.empty()) split_cfgs.push_back(0);
  for (int cfg : split_cfgs) {
    if (s.K >= s.H || cfg >= tc_backward_configs(s.D)) continue;
    try {  // (a variant without the split or the options fails before any launch: skipped)
      tc_backward(true, qkv, nullptr, out, lse, dout, nullptr, dqkv, false, delta, dq_acc, d, cfg, true);
    } catch (const std::exception&) {
      continue;
    }
    const double ms = event_ms(
        [&] { tc_backward(true, qkv, nullptr, out, lse, dout, nullptr, dqkv, false, delta, dq_acc, d, cfg, true); });
    if (cudaDeviceSynchronize() != cudaSuccess) ZR_FAIL("backward with the grouped-query split failed");
    cudaMemcpy(gr.data(), dqkv, gr.size() * 2, cudaMemcpyDeviceToHost);
    double df = 0, m = 0;
    for (size_t i = 0; i < gr.size(); ++i) {
      df = std::max(df, (double)std::fabs(bf16_value(gr[i]) - bf16_value(ref_g[i])));
      m = std::max(m, (double)std::fabs(bf16_value(ref_g[i])));
    }
    std::printf(
        "{\"probe\": \"zerorun tc attention bwd\", %s, \"kernels\": \"one, dQ atomics, grouped-query "
        "split\", \"variant\": %d, \"ms\": %.4f, \"tflops\": %.1f, \"max_rel_diff_vs_two_kernel\": %.3g}\n",
        head, cfg, ms, 2.5 * fl / ms / 1e9, m > 0 ? df / m : df);
  }
  std::printf(
      "{\"probe\": \"zerorun tc attention\", %s, \"fwd_ms\": %.4f, \"fwd_tflops\": %.1f, \"bwd_ms\": %.4f, "
      "\"bwd_tflops\": %.1f, \"bwd_det_ms\": %.4f, \"bwd_det_tflops\": %.1f, \"fwd_bwd_ms\": %.4f, "
      "\"bwd_paths_rel_diff\": %.3g}\n",
      head, fwd0, fl / fwd0 / 1e9, bwd_one, 2.5 * fl / bwd_one / 1e9, bwd_two, 2.5 * fl / bwd_two / 1e9, fwd0 + bwd_one,
      diff_one);
  std::fflush(stdout);
  for (void* p : {(void*)qkv, (void*)out, (void*)dout, (void*)dqkv, (void*)lse, (void*)delta, (void*)dq_acc})
    cudaFree(p);
  if (pos) cudaFree(pos);
}
}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "sweep") {
      const int64_t B = argc > 4 ? std::atoll(argv[2]) : 8, H = argc > 4 ? std::atoll(argv[3]) : 12,
                    T = argc > 4 ? std::atoll(argv[4]) : 1024;
      probe({B, H, H, T, 64}, true);
    } else if (argc > 5) {
      Shape s{std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5])};
      if (argc > 6) s.W = std::atoll(argv[6]);
      if (argc > 7) s.cap = static_cast<float>(std::atof(argv[7]));
      if (argc > 8) s.doc = std::atoll(argv[8]);
      probe(s, false);
    } else {
      probe({8, 12, 12, 1024, 64}, false);
      for (int64_t D : {64, 80, 96, 128, 256}) probe({4, 16, 16, 2048, D}, D != 64);  // (64: sweep mode has 21)
      for (int64_t D : {64, 128}) probe({4, 16, 4, 2048, D}, false);
      probe({16, 14, 2, 1024, 64}, false);                // Qwen2.5-0.5B's attention (14 query heads over 2)
      probe({4, 16, 4, 2048, 128, 512}, false);           // Mistral-style window
      probe({4, 16, 16, 2048, 256, 1024, 50.f}, false);   // Gemma 2-style window and cap
      probe({4, 12, 2, 4096, 128, 0, 0.f}, false);        // Qwen2.5-1.5B's heads at T 4096
      probe({2, 32, 8, 2048, 128}, false);                // Llama-3-8B's heads
      probe({4, 12, 2, 4096, 128, 0, 0.f, 512}, false);   // the same, documents of 512 packed (pos)
      probe({4, 12, 2, 4096, 128, 0, 0.f, 4096}, false);  // pos of one document a row: the cost of the pos path
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerorun_attn_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
