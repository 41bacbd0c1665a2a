// Host-side conversions between float32 and the 16-bit storage types, for
// the CPU kernels. Round-to-nearest-even, NaN preserved, as XLA does.
#pragma once
#include <cstdint>
#include <cstring>

namespace jaxcraft {

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float to_float(float x) { return x; }

inline float to_float(bf16_t x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float to_float(f16_t x) {
  const uint32_t sign = (x.bits & 0x8000u) << 16;
  uint32_t exp = (x.bits >> 10) & 0x1fu;
  uint32_t man = x.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {  // inf / nan
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {  // normal
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {  // zero
    u = sign;
  } else {  // subnormal: renormalize
    exp = 113;
    while ((man & 0x400u) == 0) { man <<= 1; --exp; }
    u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <typename T> T from_float(float f);

template <> inline float from_float<float>(float f) { return f; }

template <> inline bf16_t from_float<bf16_t>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

template <> inline f16_t from_float<f16_t>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u)};  // nan
  if (abs >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero: add a magic number so
    // the FPU does the round-to-nearest-even shift for us.
    float magic;
    const uint32_t magic_bits = 0x3f000000u;  // 0.5f: aligns bit 0 of the f16 mantissa
    std::memcpy(&magic, &magic_bits, sizeof magic);
    float a;
    std::memcpy(&a, &abs, sizeof a);
    a += magic;
    uint32_t r;
    std::memcpy(&r, &a, sizeof r);
    return f16_t{static_cast<uint16_t>(sign | (r - magic_bits))};
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to even.
  const uint32_t rebiased = abs - 0x38000000u;
  const uint32_t rounded = rebiased + 0xfffu + ((rebiased >> 13) & 1u);
  return f16_t{static_cast<uint16_t>(sign | (rounded >> 13))};
}

}  // namespace jaxcraft
