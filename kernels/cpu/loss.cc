// Losses on CPU: softmax cross-entropy (softmax recomputed in backward, so
// only the logits are kept) and mean squared error.
#include <cmath>
#include <vector>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

double cross_entropy_fwd(const float* logits, const int32_t* targets, float* lse, int64_t N, int64_t V, int64_t denom) {
  std::vector<double> row_loss(N);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * V;
    float mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) mx = l[v] > mx ? l[v] : mx;
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(l[v] - mx));
    lse[n] = static_cast<float>(std::log(s) + mx);
    row_loss[n] = targets[n] == -100 ? 0.0 : std::log(s) + mx - l[targets[n]];  // -100: ignore_index
  }
  double tot = 0.0;
  for (int64_t n = 0; n < N; ++n) tot += row_loss[n];
  return tot / static_cast<double>(denom > 0 ? denom : N);
}

void cross_entropy_bwd(const float* logits, const int32_t* targets, const float* lse, float dloss, float* dlogits,
                       int64_t N, int64_t V, int64_t denom) {
  const float scale = dloss / static_cast<float>(denom > 0 ? denom : N);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == -100) continue;  // ignore_index: no gradient
    const float* l = logits + n * V;
    float* d = dlogits + n * V;
    const float z = lse[n];
    for (int64_t v = 0; v < V; ++v) d[v] += scale * (std::exp(l[v] - z) - (v == targets[n] ? 1.f : 0.f));
  }
}

double mse_fwd(const float* pred, const float* target, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(pred[i]) - target[i];
    s += d * d;
  }
  return s / static_cast<double>(n);
}

void mse_bwd(const float* pred, const float* target, float dloss, float* dpred, int64_t n) {
  const float scale = 2.f * dloss / static_cast<float>(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dpred[i] += scale * (pred[i] - target[i]);
}

}  // namespace zerorun::kernels::cpu
