// The activations and their exact derivatives in float32, shared by the CPU
// loops and the CUDA kernels so that both compute the same formulas.
//
// Both GELU forms are written through functions that lose no precision in
// the tails, where the textbook forms cancel:
//   tanh form: 0.5 (1 + tanh(u)) = sigmoid(2u), and 1 - sigmoid(z) = e * s
//              with e = exp(-z), s = 1 / (1 + e) (no 1 - s cancellation);
//   erf form:  0.5 (1 + erf(h / sqrt 2)) = 0.5 erfc(-h / sqrt 2) (as jax.nn).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "contract/activations.h"
#include "math/activation_device_math.h"
#include "math/normal_cdf_poly.h"

#ifdef __CUDACC__
#define JAXCRAFT_ACT_FN __host__ __device__ __forceinline__
#else
#define JAXCRAFT_ACT_FN inline
#endif

namespace jaxcraft {
namespace activation {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // tanh form: u = sqrt(2/pi) (h + k h^3)
constexpr float kGeluCubic = 0.044715f;              // k above
constexpr float kInvSqrt2Pi = 0.3989422804014327f;   // phi(h) = exp(-h^2 / 2) / sqrt(2 pi)
// Beyond this, h^2 is clamped in the GELU polynomials: it keeps them finite
// (h^2 overflows from |h| ~ 1.8e19, and 0 * inf would be NaN), and at such
// |h| sigmoid is exactly 0 or 1, so the polynomial's value does not matter.
constexpr float kMaxSquare = 1e30f;

// min(h^2, kMaxSquare) as a select, which the CPU loops vectorize (fminf's
// NaN rules keep it a libm call there).
JAXCRAFT_ACT_FN float clamp_square(float h) {
  const float h2 = h * h;
  return h2 < kMaxSquare ? h2 : kMaxSquare;
}

// exp(x) for the CPU loops, written so that compilers vectorize it (libm's
// expf is an opaque scalar call): x = n ln2 + r, |r| <= ln2 / 2, with ln2 in
// two parts so that n ln2 is exact (Cody-Waite); exp(r) by its Taylor series
// to r^7 (truncation < 6e-9 relative); 2^n built in the exponent bits.
// Within 2 ulp of expf; overflows to inf and underflows to 0 (no subnormal
// results) like it. NaN inputs give a finite value: every caller multiplies
// by its own input, which carries the NaN.
inline float host_expf(float x) {
  constexpr float kLn2Hi = 0.693359375f;         // 8 significant bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;      // ln2 - kLn2Hi
  constexpr float kRound = 12582912.f;           // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kMaxArg = 88.3762626647949f;   // 127.5 ln2: 2^n stays a normal float
  constexpr float kMinArg = -87.3365447505531f;  // -126 ln2
  constexpr int32_t kExpBias = 127;
  constexpr int kMantissaBits = 23;
  float xc = x > kMinArg ? x : kMinArg;  // also maps NaN to kMinArg
  xc = xc < kMaxArg ? xc : kMaxArg;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + kExpBias) << kMantissaBits;
  float two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  const float result = p * two_n;
  return x > kMaxArg ? HUGE_VALF : (x < kMinArg ? 0.f : result);
}

// exp, the sigmoid's reciprocal and erfc: the hardware approximations
// (math/fast_math.h, activation_device_math.h) in CUDA code (the GELU kernels are
// issue-bound on the H200: with __expf and __frcp_rn, whose range checks and
// slow-path call cost more than the math, the tanh form takes about 29
// instructions per element instead of 13), the vectorizable exp, the exact
// division and the same erfc polynomial on the host.
// - exp: ex2.approx's 2^-22 relative, plus |x| x 6e-8 from rounding
//   x log2(e), the size of what rounding x itself already carries. Results
//   below 2^-126 flush to zero; every caller adds them to 1 or multiplies
//   them by a value they cannot make normal again within the tests'
//   absolute floor.
// - reciprocal: at most 1 ulp; its argument here is 1 + e >= 1, and
//   1 / inf = 0 as needed when e overflows.
JAXCRAFT_ACT_FN float act_exp(float x) {
#ifdef __CUDA_ARCH__
  return fast_exp2(x * kLog2e);
#else
  return host_expf(x);
#endif
}

JAXCRAFT_ACT_FN float act_reciprocal(float x) {
#ifdef __CUDA_ARCH__
  return fast_rcp(x);
#else
  return 1.f / x;
#endif
}

// Phi(h) = erfc(-h / sqrt 2) / 2, and exp(-h^2 / 2) into gauss (the erf
// form's derivative needs both); kExpCorrected: activation_device_math.h.
template <bool kExpCorrected = true>
JAXCRAFT_ACT_FN float act_normal_cdf(float h, float& gauss) {
#ifdef __CUDA_ARCH__
  return device_normal_cdf<kExpCorrected>(h, gauss);
#else
  // The device's float32 polynomial (normal_cdf_poly.h) with host_expf,
  // which the loops vectorize (libm's erfcf is a scalar call: with it the
  // erf forms' CPU forward runs 7-20x slower than XLA's). Without the device's
  // rounding corrections exp(-h^2 / 2) is off by up to h^2 x 6e-8 / 2
  // relative (5e-6 at |h| = 13, where Phi is 1e-38). The clamp is a select
  // (fminf stays a libm call) and maps NaN to kNormalCdfMaxArg.
  const float abs_h = fabsf(h);
  const float a = abs_h < kNormalCdfMaxArg ? abs_h : kNormalCdfMaxArg;
  gauss = host_expf(-0.5f * a * a);
  const float u = 1.f / (1.f + kNormalCdfUScale * a);
  const float y = u * normal_cdf_poly8(u) * gauss;  // Phi(-|h|)
  return h > 0.f ? 1.f - y : y;
#endif
}

// s = sigmoid(z) and its complement 1 - s, each to full relative precision.
// exp(-z) overflows for z < -88.7: then s = 0 and 1 - s = 1 (e * s would be
// inf * 0).
JAXCRAFT_ACT_FN void sigmoid_pair(float z, float& s, float& one_minus_s) {
  const float e = act_exp(-z);
  s = act_reciprocal(1.f + e);
  one_minus_s = s > 0.f ? e * s : 1.f;
}

// f(h), and with the derivative, f'(h).
template <Activation kAct>
struct Act;

template <>
struct Act<Activation::kGeluTanh> {
  // f = h sigmoid(z), z = 2u = 2 sqrt(2/pi) h (1 + k h^2);
  // f' = s + h s (1 - s) dz/dh, dz/dh = 2 sqrt(2/pi) (1 + 3 k h^2).
  static JAXCRAFT_ACT_FN float value(float h) {
    float s, sc;
    sigmoid_pair(2.f * kSqrt2OverPi * h * (1.f + kGeluCubic * clamp_square(h)), s, sc);
    return h * s;
  }
  static JAXCRAFT_ACT_FN float value_and_grad(float h, float& grad) {
    const float h2 = clamp_square(h);
    float s, sc;
    sigmoid_pair(2.f * kSqrt2OverPi * h * (1.f + kGeluCubic * h2), s, sc);
    grad = s + h * s * sc * (2.f * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * h2));
    return h * s;
  }
};

// The erf form; kExpCorrected = false for 16-bit outputs (activation_device_math.h).
template <bool kExpCorrected>
struct GeluErf {
  // f = h Phi(h); f' = Phi(h) + h phi(h), phi(h) = exp(-h^2 / 2) / sqrt(2 pi).
  static JAXCRAFT_ACT_FN float value(float h) {
    float gauss;
    return h * act_normal_cdf<kExpCorrected>(h, gauss);
  }
  static JAXCRAFT_ACT_FN float value_and_grad(float h, float& grad) {
    float gauss;
    const float cdf = act_normal_cdf<kExpCorrected>(h, gauss);
    grad = cdf + h * (kInvSqrt2Pi * gauss);
    return h * cdf;
  }
};

template <>
struct Act<Activation::kGeluErf> : GeluErf<true> {};

template <>
struct Act<Activation::kSilu> {
  // f = h s, s = sigmoid(h); f' = s + h s (1 - s).
  static JAXCRAFT_ACT_FN float value(float h) {
    float s, sc;
    sigmoid_pair(h, s, sc);
    return h * s;
  }
  static JAXCRAFT_ACT_FN float value_and_grad(float h, float& grad) {
    float s, sc;
    sigmoid_pair(h, s, sc);
    grad = s + h * s * sc;
    return h * s;
  }
};

}  // namespace activation
}  // namespace jaxcraft
