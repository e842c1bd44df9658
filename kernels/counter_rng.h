// Counter-based random bits for dropout, shared by the CPU and CUDA kernels and written out in the test oracles:
// whether element `counter` of a dropout site is kept in one training step is a pure function of (seed, step, site,
// counter) — splitmix64's output function at position counter of a stream keyed by the other three — so a mask is
// the same on any number of ranks (counters count from the global sample index, not the local row), in any
// micro-batch split, on CPU and GPU, and when activation checkpointing recomputes a block.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define ZR_HD __host__ __device__
#else
#define ZR_HD
#endif

namespace zerorun::kernels::rng {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

ZR_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// The stream of one dropout site (a node's "site" attribute) in one optimizer step (1-based) of a run's seed.
ZR_HD inline uint64_t dropout_key(uint64_t seed, uint64_t step, uint64_t site) {
  return mix64(mix64(seed ^ mix64(site + 1)) + step * kGolden);
}
// p as a threshold on 24 random bits: an element is dropped iff its bits < threshold (p = threshold / 2^24).
inline uint32_t dropout_threshold(float p) { return static_cast<uint32_t>(static_cast<double>(p) * 16777216.0 + 0.5); }
ZR_HD inline bool dropout_keep(uint64_t key, uint64_t counter, uint32_t threshold) {
  return static_cast<uint32_t>(mix64(key + (counter + 1) * kGolden) >> 40) >= threshold;
}

// A dropout of one tensor: key and threshold as above; element i of the tensor is counter0 + i; kept elements
// are multiplied by scale = 1 / (1 - p).
struct Dropout {
  uint64_t key = 0;
  uint32_t threshold = 0;
  float scale = 1.f;
  uint64_t counter0 = 0;
};

}  // namespace zerorun::kernels::rng
