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

#include "kernels/activations/params.h"

#ifdef __CUDACC__
#define JAXCRAFT_ACT_FN __host__ __device__ __forceinline__
#else
#define JAXCRAFT_ACT_FN inline
#endif

namespace jaxcraft {
namespace activation {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // tanh form: u = sqrt(2/pi) (h + k h^3)
constexpr float kGeluCubic = 0.044715f;              // k above
constexpr float kInvSqrt2 = 0.7071067811865476f;     // erf form: Phi(h) = erfc(-h / sqrt 2) / 2
constexpr float kInvSqrt2Pi = 0.3989422804014327f;   // phi(h) = exp(-h^2 / 2) / sqrt(2 pi)
// Beyond this, h^2 is clamped in the GELU polynomials: it keeps them finite
// (h^2 overflows from |h| ~ 1.8e19, and 0 * inf would be NaN), and at such
// |h| sigmoid is exactly 0 or 1, so the polynomial's value does not matter.
constexpr float kMaxSquare = 1e30f;

// s = sigmoid(z) and its complement 1 - s, each to full relative precision.
// exp(-z) overflows for z < -88.7: then s = 0 and 1 - s = 1 (e * s would be
// inf * 0).
JAXCRAFT_ACT_FN void sigmoid_pair(float z, float& s, float& one_minus_s) {
  const float e = expf(-z);
  s = 1.f / (1.f + e);
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
    sigmoid_pair(2.f * kSqrt2OverPi * h * (1.f + kGeluCubic * fminf(h * h, kMaxSquare)), s, sc);
    return h * s;
  }
  static JAXCRAFT_ACT_FN float value_and_grad(float h, float& grad) {
    const float h2 = fminf(h * h, kMaxSquare);
    float s, sc;
    sigmoid_pair(2.f * kSqrt2OverPi * h * (1.f + kGeluCubic * h2), s, sc);
    grad = s + h * s * sc * (2.f * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * h2));
    return h * s;
  }
};

template <>
struct Act<Activation::kGeluErf> {
  // f = h Phi(h); f' = Phi(h) + h phi(h).
  static JAXCRAFT_ACT_FN float value(float h) { return h * (0.5f * erfcf(-h * kInvSqrt2)); }
  static JAXCRAFT_ACT_FN float value_and_grad(float h, float& grad) {
    const float cdf = 0.5f * erfcf(-h * kInvSqrt2);
    grad = cdf + h * (kInvSqrt2Pi * expf(-0.5f * h * h));
    return h * cdf;
  }
};

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
