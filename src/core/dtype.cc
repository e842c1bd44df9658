// Element type names, sizes and IEEE half conversion.
#include "zerorun/dtype.h"

#include "zerorun/error.h"

namespace zerorun {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
    case DType::F16:
    case DType::U16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::U16:
      return "u16";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::U16:
      return "U16";
  }
  return "?";
}

DType dtype_from_string(const std::string& s) {
  if (s == "f32" || s == "F32" || s == "fp32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "BF16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "F16" || s == "fp16" || s == "float16") return DType::F16;
  if (s == "i32" || s == "I32" || s == "int32") return DType::I32;
  if (s == "u16" || s == "U16" || s == "uint16") return DType::U16;
  ZR_FAIL("unknown dtype '", s, "' (expected one of F32, BF16, F16, I32, U16)");
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign << 31;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = (sign << 31) | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = (sign << 31) | 0x7f800000u | (mant << 13);
  } else {
    u = (sign << 31) | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {                                               // subnormal or zero in f16
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);           // rounds to zero
    uint32_t exp = absu >> 23;
    uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1 ... yields bits for 10-bit mantissa
    uint32_t val = mant >> (shift - 0);
    // round to nearest even on the dropped bits
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (val & 1u))) val++;
    return static_cast<uint16_t>(sign | val);
  }
  uint32_t val = ((absu >> 13) - (112u << 10));
  uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (val & 1u))) val++;
  return static_cast<uint16_t>(sign | val);
}

}  // namespace zerorun
