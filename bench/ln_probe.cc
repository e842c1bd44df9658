// Layernorm-backward probe: the 16-bit-dy layernorm backward (dx added to an f32 residual gradient, dw and db
// summed, the partials' final sum included) on its own at the GPT-2 step shapes, timed with CUDA events, so kernel
// changes can be compared in seconds without a training run. Prints a JSON line per shape: µs a call and the
// bandwidth of the 14 bytes an element it must move (x and dx f32 read, dy bf16 read, dx written).
// Usage (device machine): zerorun_ln_probe
#include <cuda_runtime.h>

#include <cstdio>

#include "bench/probe_util.h"
#include "kernels/backend.h"

int main() {
  using namespace zerorun;
  try {
    auto& be = kernels::backend(Device::cuda(0));
    be.set_matmul_dtype(DType::BF16);
    for (auto [N, C] : {std::pair<int64_t, int64_t>{8192, 768}, {4096, 1024}, {2048, 1600}, {8192, 1024}}) {
      auto* x = static_cast<float*>(probe::dev_alloc(N * C * 4));
      auto* dx = static_cast<float*>(probe::dev_alloc(N * C * 4));
      auto* dy = static_cast<uint16_t*>(probe::dev_alloc(N * C * 2));
      auto* w = static_cast<float*>(probe::dev_alloc(C * 4));
      auto* dw = static_cast<float*>(probe::dev_alloc(C * 4));
      auto* db = static_cast<float*>(probe::dev_alloc(C * 4));
      auto* mean = static_cast<float*>(probe::dev_alloc(N * 4));
      auto* rstd = static_cast<float*>(probe::dev_alloc(N * 4));
      probe::fill_bf16(dy, static_cast<size_t>(N * C), 3);
      const double ms =
          probe::event_ms([&] { be.layernorm_bwd16(x, w, mean, rstd, dy, kernels::Grad(dx, true), dw, db, N, C); }, 50);
      std::printf("{\"probe\": \"layernorm_bwd16\", \"N\": %lld, \"C\": %lld, \"us\": %.2f, \"TB_s\": %.2f}\n",
                  static_cast<long long>(N), static_cast<long long>(C), 1e3 * ms, 14.0 * N * C / (ms * 1e9));
      for (void* p :
           {static_cast<void*>(x), static_cast<void*>(dx), static_cast<void*>(dy), static_cast<void*>(w),
            static_cast<void*>(dw), static_cast<void*>(db), static_cast<void*>(mean), static_cast<void*>(rstd)})
        cudaFree(p);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerorun_ln_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
