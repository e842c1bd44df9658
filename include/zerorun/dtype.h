// Element types the runtime stores (f32, bf16, f16, i32, u16) and the exact
// conversions between 16-bit floats and f32 (round to nearest even).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace zerorun {

enum class DType : uint8_t { F32, BF16, F16, I32, U16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);              // "f32", "bf16", ...
const char* dtype_safetensors_name(DType t);  // "F32", "BF16", ...
// Parses either spelling; throws Error naming the bad string.
DType dtype_from_string(const std::string& s);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Rounds an f32 to the nearest value representable in `t` (identity for f32).
inline float round_to(DType t, float v) {
  if (t == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if (t == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

}  // namespace zerorun
