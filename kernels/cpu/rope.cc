// Rotary position embeddings (RoPE) on packed q/k/v, as transformers' Llama
// computes them (rotate_half: feature i pairs with i + D/2), optionally with
// grouped-query attention's key/value heads repeated for attention kernels
// that read them so. Forward and backward side by side; the angles are
// rope_angle()'s over the op's frequency table, shared with CUDA.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "zerorun/error.h"

namespace zerorun::kernels::cpu {

namespace {
// cos and sin of t * inv[i] for the n positions t = t0 .. t0 + n - 1, i < D/2 (times f.scale): [n, D/2] each.
void rope_tables(int64_t t0, int64_t n, int64_t D, const RopeFreqs& f, std::vector<float>& cs, std::vector<float>& sn) {
  const int64_t half = D / 2;
  cs.resize(static_cast<size_t>(n * half));
  sn.resize(cs.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = rope_angle(t0 + t, i, f);
      cs[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(a)) * f.scale;
      sn[static_cast<size_t>(t * half + i)] = static_cast<float>(std::sin(a)) * f.scale;
    }
}
// f(row, cos, sin) for every row r < B*T in parallel, with its position's [D/2] tables: position r % T, or pos[r]
// (each in [0, n_pos)). A table of every position when there are fewer positions than rows, else one a row (a
// decoding step at position 5000 computes its own row, not 5000).
template <class F>
void each_row(int64_t B, int64_t T, int64_t D, const RopeFreqs& freqs, const int32_t* pos, int64_t n_pos, F f) {
  std::vector<float> cs, sn;
  const int64_t half = D / 2, rows = B * T;
  if (pos)
    for (int64_t r = 0; r < rows; ++r)
      ZR_CHECK(pos[r] >= 0 && pos[r] < n_pos, "rope: position ", pos[r], " of row ", r, " is outside [0, ", n_pos, ")");
  if (!pos || n_pos <= rows) {
    rope_tables(0, pos ? n_pos : T, D, freqs, cs, sn);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = pos ? pos[r] : r % T;
      f(r, cs.data() + t * half, sn.data() + t * half);
    }
    return;
  }
  std::vector<float> rc(static_cast<size_t>(rows * half)), rs(rc.size());
  for (int64_t r = 0; r < rows; ++r) {
    rope_tables(pos[r], 1, D, freqs, cs, sn);
    std::copy(cs.begin(), cs.end(), rc.begin() + r * half);
    std::copy(sn.begin(), sn.end(), rs.begin() + r * half);
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) f(r, rc.data() + r * half, rs.data() + r * half);
}
}  // namespace

void rope_fwd(const float* qkv, float* out, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const RopeFreqs& f,
              bool repeat, const int32_t* pos, int64_t n_pos) {
  // Output heads: H q, then Ko k, then Ko v (Ko = H repeated, else K); output k/v head j reads input head j / rep.
  const int64_t half = D / 2, rep = repeat ? H / K : 1, Ko = repeat ? H : K, in_w = (H + 2 * K) * D,
                out_w = (H + 2 * Ko) * D;
  each_row(B, T, D, f, pos, n_pos, [&](int64_t r, const float* c, const float* s) {
    const float* x = qkv + r * in_w;
    float* y = out + r * out_w;
    for (int64_t j = 0; j < H + Ko; ++j) {  // q heads, then the (repeated) k heads: rotated
      const float* src = j < H ? x + j * D : x + (H + (j - H) / rep) * D;
      float* dst = y + j * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = src[i], b = src[i + half];
        dst[i] = a * c[i] - b * s[i];
        dst[i + half] = b * c[i] + a * s[i];
      }
    }
    for (int64_t j = 0; j < Ko; ++j) {  // v heads: copied
      const float* src = x + (H + K + j / rep) * D;
      for (int64_t i = 0; i < D; ++i) y[(H + Ko + j) * D + i] = src[i];
    }
  });
}

void rope_bwd(const float* dout, float* dqkv, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const RopeFreqs& f,
              bool repeat, const int32_t* pos, int64_t n_pos) {
  const int64_t half = D / 2, rep = repeat ? H / K : 1, Ko = repeat ? H : K, in_w = (H + 2 * K) * D,
                out_w = (H + 2 * Ko) * D;
  each_row(B, T, D, f, pos, n_pos, [&](int64_t r, const float* c, const float* s) {
    const float* g = dout + r * out_w;
    float* dx = dqkv + r * in_w;
    // The transpose of the rotation, summed over the output heads each input head feeds (in head order).
    for (int64_t j = 0; j < H + K; ++j) {
      float* dst = dx + j * D;
      const int64_t first = j < H ? j : H + (j - H) * rep, n = j < H ? 1 : rep;
      for (int64_t i = 0; i < half; ++i) {
        float da = 0.f, db = 0.f;
        for (int64_t k = first; k < first + n; ++k) {
          const float ga = g[k * D + i], gb = g[k * D + i + half];
          da += ga * c[i] + gb * s[i];
          db += gb * c[i] - ga * s[i];
        }
        dst[i] += da;
        dst[i + half] += db;
      }
    }
    for (int64_t j = 0; j < K; ++j) {
      float* dst = dx + (H + K + j) * D;
      for (int64_t i = 0; i < D; ++i) {
        float d = 0.f;
        for (int64_t k = j * rep; k < (j + 1) * rep; ++k) d += g[(H + Ko + k) * D + i];
        dst[i] += d;
      }
    }
  });
}

}  // namespace zerorun::kernels::cpu
