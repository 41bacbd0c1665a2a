// The CUDA side of activation_math.h's erfc. The GELU kernels are
// issue-bound on the H200, so each instruction saved is time saved.
//
// device_erfc: erfc(x) and exp(-x^2) in about 20 instructions where CUDA's
// erfcf takes about 45 (the geglu-erf forward ran at 67% of copy with it).
// For a = |x| <= kMaxArg: erfc(a) = u P(u) exp(-a^2), u = 1 / (1 + a / 2),
// P fitted by fit_erfc.py: degree 8 (4.3e-8 relative) for float32 outputs,
// 6 (1.4e-6) for 16-bit ones. One reciprocal: the earlier form, P(t) /
// (1 + 2a) with t = (a - 4) / (a + 4), took two and three more instructions,
// and the erf-form GELU is bound by issue and by the MUFU unit together
// (about 3 MUFU operations per element there). exp(-a^2) keeps the rounding
// of a^2 and of a^2 log2(e) as corrections (a^2 = s + err exactly; the
// exponent -s log2(e) = hi + lo): without them it is off by a^2 x 6e-8
// relative (6e-6 at a = 10). Emulated in float32 against mpmath over a in
// [0, 10.1]: erfc within 3.1e-7 relative with the corrections (the old form
// 3.9e-7), 6.7e-6 without (7.3e-6). The GELU then stays within the float32
// argument's own error (its rounding of -h / sqrt 2 moves erfc by 2 a^2 x
// 6e-8, 1.1e-5 at h = -12.7; 2.7e-6 for |h| < 6). x < 0: erfc(x) = 2 -
// erfc(|x|).
// Past kMaxArg erfc(a) and exp(-a^2) are below float32's range (the ftz
// exp2 gives 0); the clamp also keeps a^2 finite and maps NaN to it (the
// callers multiply by x, which carries the NaN).
#pragma once

#include "common/fast_math.cuh"

#ifdef __CUDACC__
namespace jaxcraft {
namespace activation {

// kExpCorrected = false (16-bit outputs, which round to 2^-9 relative or
// coarser): exp(-a^2) without the corrections, one exp2 of the rounded
// exponent, and P of degree 6; the GELU is then within 1.7e-5 relative for
// h < -9 (float32 emulation against float64), against 1.0e-5 with them.
template <bool kExpCorrected = true>
__device__ __forceinline__ float device_erfc(float x, float& gauss) {
  constexpr float kMaxArg = 10.1f;
  constexpr float kLog2eLo = 1.925963e-08f;  // log2(e) - kLog2e
  const float a = fminf(fabsf(x), kMaxArg);
  const float u = fast_rcp(fmaf(0.5f, a, 1.f));
  float p;
  if constexpr (kExpCorrected) {
    p = -5.909763277e-02f;
    p = fmaf(p, u, 2.847152352e-01f);
    p = fmaf(p, u, -4.874912202e-01f);
    p = fmaf(p, u, 2.784014940e-01f);
    p = fmaf(p, u, -2.685680427e-02f);
    p = fmaf(p, u, 2.027850449e-01f);
    p = fmaf(p, u, 2.430788428e-01f);
    p = fmaf(p, u, 2.823787630e-01f);
    p = fmaf(p, u, 2.820862234e-01f);
  } else {
    p = 8.802474290e-02f;
    p = fmaf(p, u, -3.561068475e-01f);
    p = fmaf(p, u, 3.883423507e-01f);
    p = fmaf(p, u, 3.851372376e-02f);
    p = fmaf(p, u, 2.812708020e-01f);
    p = fmaf(p, u, 2.776255906e-01f);
    p = fmaf(p, u, 2.823282778e-01f);
  }
  const float s = a * a;
  const float hi = -s * kLog2e;
  const float e = fast_exp2(hi);
  if constexpr (kExpCorrected) {
    const float s_err = fmaf(a, a, -s);
    float lo = fmaf(-s, kLog2e, -hi);
    lo = fmaf(-s, kLog2eLo, lo);
    lo = fmaf(-s_err, kLog2e, lo);
    gauss = fmaf(e * lo, kLn2, e);  // 2^(hi + lo) = 2^hi (1 + lo ln 2)
  } else {
    gauss = e;
  }
  const float y = u * p * gauss;
  return x < 0.f ? 2.f - y : y;
}

}  // namespace activation
}  // namespace jaxcraft
#endif  // __CUDACC__
