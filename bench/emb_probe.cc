// Embedding-backward probe: the token-embedding gradient by atomics and by the deterministic sort (chunked runs),
// alone, at the GPT-2 step shapes and for four id distributions: uniform, Zipf (text-like), half the batch one id
// (padding), and every position one id. The sort's cost must not depend on how often an id repeats; the atomics'
// does. Prints a JSON line per shape, distribution and mode: µs a call.
// Usage (device machine): zerorun_emb_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/probe_util.h"
#include "kernels/backend.h"

namespace {
std::vector<int32_t> make_ids(const std::string& dist, int64_t N, int64_t V, unsigned seed) {
  std::vector<int32_t> ids(static_cast<size_t>(N));
  std::vector<double> cdf;
  if (dist == "zipf") {  // p(rank k) ~ 1/k^1.1, ranks scattered over the table
    double s = 0;
    for (int64_t k = 1; k <= V; ++k) cdf.push_back(s += std::pow(static_cast<double>(k), -1.1));
    for (double& c : cdf) c /= s;
  }
  for (int64_t i = 0; i < N; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const double u = (seed >> 8) / 16777216.0;
    int64_t id = static_cast<int64_t>(u * static_cast<double>(V));
    if (dist == "zipf") id = (std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin()) * 7919 % V;
    if (dist == "one" || (dist == "half" && i % 2 == 0)) id = 50256 % V;
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(std::min<int64_t>(id, V - 1));
  }
  return ids;
}
}  // namespace

int main() {
  using namespace zerorun;
  try {
    auto& be = kernels::backend(Device::cuda(0));
    const int64_t V = 50257;
    for (auto [N, C] : {std::pair<int64_t, int64_t>{8192, 768}, {4096, 1024}, {2048, 1600}}) {
      auto* dout = static_cast<float*>(probe::dev_alloc(N * C * 4));
      auto* dtable = static_cast<float*>(probe::dev_alloc(V * C * 4));
      auto* ids = static_cast<int32_t*>(probe::dev_alloc(N * 4));
      for (const char* dist : {"uniform", "zipf", "half", "one"}) {
        const auto h = make_ids(dist, N, V, 7);
        cudaMemcpy(ids, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
        for (bool det : {false, true}) {
          be.set_deterministic(det);
          const double ms = probe::event_ms([&] { be.embedding_bwd(ids, dout, dtable, N, C, V); }, 50);
          std::printf(
              "{\"probe\": \"embedding_bwd\", \"N\": %lld, \"C\": %lld, \"ids\": \"%s\", \"mode\": \"%s\", "
              "\"us\": %.2f}\n",
              static_cast<long long>(N), static_cast<long long>(C), dist, det ? "sort" : "atomics", 1e3 * ms);
        }
      }
      cudaFree(dout), cudaFree(dtable), cudaFree(ids);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerorun_emb_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
