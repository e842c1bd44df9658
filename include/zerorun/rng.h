// Deterministic, portable random numbers (splitmix64 counter hashing and
// Box-Muller normals), so init and synthetic data are reproducible anywhere
// and simple to re-implement in a reference script.
#pragma once
#include <cmath>
#include <cstdint>

namespace zerorun {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in [0, 1) from the top 24 bits of the hash of `counter`.
inline float hash_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<float>(splitmix64(seed * 0x100000001b3ull ^ counter) >> 40) * (1.0f / 16777216.0f);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_++); }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

}  // namespace zerorun
