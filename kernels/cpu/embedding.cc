// Token and positional embedding lookups on CPU.
#include <cstring>

#include "cpu_kernels.h"

namespace zerorun::kernels::cpu {

void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * C, table + static_cast<int64_t>(ids[n]) * C, C * sizeof(float));
}

void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C, int64_t /*V*/) {
  // Parallel over columns: rows with the same id never race, order is fixed.
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < N; ++n) dtable[static_cast<int64_t>(ids[n]) * C + c] += dout[n * C + c];
}

void pos_embedding_fwd(const float* table, float* out, int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) std::memcpy(out + bt * C, table + (bt % T) * C, C * sizeof(float));
}

void pos_embedding_bwd(const float* dout, float* dtable, int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) dtable[t * C + c] += dout[(b * T + t) * C + c];
}

}  // namespace zerorun::kernels::cpu
