// The option types and pointwise formulas both kernel backends share (kernels/cpu and kernels/cuda, and the Backend
// interface above them): pointwise maps, activations, rotary frequencies, attention's sizes and options. Here rather
// than in cpu_kernels.h so that kernels/backend.h does not include one backend's header.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/counter_rng.h"

namespace zerorun::kernels {

// One-parameter pointwise maps, shared with CUDA: y = a x (an embedding scale), a tanh(x / a) (Gemma 2's logit
// soft-capping), x + a (Gemma's (1 + w) norm weights).
enum class Unary { Scale, Softcap, Shift };
#ifdef __CUDACC__
__host__ __device__
#endif
    inline float
    unary_value(Unary op, float a, float x) {
  return op == Unary::Scale ? a * x : op == Unary::Softcap ? a * tanhf(x / a) : x + a;
}
#ifdef __CUDACC__
__host__ __device__
#endif
    inline float
    unary_grad(Unary op, float a, float x) {
  if (op != Unary::Softcap) return op == Unary::Scale ? a : 1.f;
  const float t = tanhf(x / a);
  return 1.f - t * t;
}

enum class Act { Gelu, Relu, Silu };

// Rotary frequencies (cpu_kernels.h's rope_fwd says how they are applied).
struct RopeFreqs {
  static constexpr int kMaxPairs = 128;  // head size 256
  float inv[kMaxPairs] = {};
  float scale = 1.f;
};
#ifdef __CUDACC__
__host__ __device__
#endif
    inline double
    rope_angle(int64_t t, int64_t i, const RopeFreqs& f) {
  return static_cast<double>(static_cast<float>(t) * f.inv[i]);
}

// Attention's sizes and options (the attention op's attributes). qkv [B, T, (H + 2K) D]: H query heads, then K
// key heads, then K value heads, D features each, heads contiguous; out [B, T, H D]. Query head h reads key/value
// head h / (H / K) in place (grouped-query attention; K = H: multi-head). scale multiplies q.k; window > 0: query t
// sees key s iff s <= t and t - s < window (sliding window; 0: every s <= t); softcap > 0: the score is
// softcap * tanh(scale q.k / softcap) (Gemma 2), before the mask and the softmax.
struct AttnDims {
  int64_t B = 0, T = 0, H = 0, K = 0, D = 0;
  float scale = 0.f;
  int64_t window = 0;
  float softcap = 0.f;
  // Per-document attention for packed sequences: pos [B, T] (null: one document a row) holds each token's position
  // in its document, so query t of row b sees no key before t - pos[b, t] (its document's first token). On CUDA pos
  // is device memory. Combined with the causal mask and the window.
  const int32_t* pos = nullptr;
  // Dropout of the attention probabilities in training (threshold 0: none): probability (b, h, t, s) is kept, times
  // drop.scale, where kernels/counter_rng.h keeps counter drop.counter0 + ((b H + h) T + t) T + s.
  rng::Dropout drop;
  int64_t width() const { return (H + 2 * K) * D; }  // a qkv row
  int64_t out_width() const { return H * D; }        // an output row
  int64_t rep() const { return H / K; }              // query heads per key/value head
  // The first key query t sees.
  int64_t first_key(int64_t t) const { return window > 0 && t >= window ? t - window + 1 : 0; }
  // The dropout factor of probability (b, h, t, s): 0 or drop.scale (1 without dropout).
  float drop_factor(int64_t b, int64_t h, int64_t t, int64_t s) const {
    if (drop.threshold == 0) return 1.f;
    const uint64_t c = drop.counter0 + static_cast<uint64_t>(((b * H + h) * T + t) * T + s);
    return rng::dropout_keep(drop.key, c, drop.threshold) ? drop.scale : 0.f;
  }
  // The first key query t of row b sees (window and document; host pointers only).
  int64_t first_key(int64_t b, int64_t t) const {
    const int64_t w = first_key(t);
    if (!pos) return w;
    const int64_t doc = t - pos[b * T + t];
    return doc > w ? doc : w;
  }
};

}  // namespace zerorun::kernels
