// Host-side conversions between float32 and the 16-bit storage types, for
// the CPU kernels. Round-to-nearest-even, NaN preserved, as XLA does.
#pragma once
#include <cstdint>
#include <cstring>

#include "contract/dtype.h"

namespace jaxcraft {

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float to_float(float x) { return x; }

inline float to_float(bf16_t x) { return bits_to_float(static_cast<uint32_t>(x.bits) << 16); }

// The f16 conversions choose between cases by selects, not branches, so that
// loops over rows vectorize (a loop that renormalized subnormals ran the
// norm kernels 3x slower than XLA on f16).
inline float to_float(f16_t x) {
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(x.bits & 0x7fffu) << 13;  // exponent, mantissa
  const uint32_t exp = em & 0x0f800000u;
  // Normal: the exponent rebiased by 127 - 15; inf and NaN: by 255 - 31.
  const uint32_t normal = em + (112u << 23), special = em + (224u << 23);
  // Subnormal or zero, m 2^-24: (2^-14 + m 2^-24) - 2^-14, exact in float.
  const uint32_t small =
      float_to_bits(bits_to_float(em + (113u << 23)) - bits_to_float(113u << 23));
  return bits_to_float(sign | (exp == 0x0f800000u ? special : exp == 0 ? small : normal));
}

template <typename T> T from_float(float f);

template <> inline float from_float<float>(float f) { return f; }

template <> inline bf16_t from_float<bf16_t>(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

template <> inline f16_t from_float<f16_t>(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  // A subnormal or zero result: adding 0.5f aligns the half's last mantissa
  // bit with the float's, and the FPU rounds to nearest even.
  const uint32_t small = float_to_bits(bits_to_float(abs) + 0.5f) - 0x3f000000u;
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to even.
  const uint32_t rebiased = abs - 0x38000000u;
  const uint32_t normal = (rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13;
  const uint32_t mag = abs > 0x7f800000u    ? 0x7e00u  // NaN
                       : abs >= 0x477ff000u ? 0x7c00u  // rounds to inf
                       : abs < 0x38800000u  ? small
                                            : normal;
  return f16_t{static_cast<uint16_t>(sign | mag)};
}

// dispatch_dtype over the CPU's storage types.
template <typename Fn>
void dispatch_cpu_dtype(DType dtype, Fn&& fn) {
  dispatch_dtype<bf16_t, f16_t>(dtype, fn);
}

}  // namespace jaxcraft
