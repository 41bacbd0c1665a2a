// The CUDA side of activation_math.h's normal CDF. The GELU kernels are
// issue-bound on the H200, so each instruction saved is time saved.
//
// device_normal_cdf: Phi(h) = erfc(-h / sqrt 2) / 2 and exp(-h^2 / 2) in
// about 18 instructions where CUDA's erfcf takes about 45 (the geglu-erf
// forward runs at 67% of copy with erfcf). With a = |h| / sqrt 2 <= 10.1:
// erfc(a) = u P(u) exp(-a^2), u = 1 / (1 + a / 2), P fitted by
// fit_erfc.py: degree 8 (4.3e-8 relative) for float32 outputs, 6 (1.4e-6)
// for 16-bit ones, its coefficients halved to give Phi. a itself is never
// formed: u takes |h| times 1 / (2 sqrt 2), and a^2 = h^2 / 2 is exact, so
// the rounding of -h / sqrt 2 (which would move erfc by 2 a^2 x 6e-8,
// 1.1e-5 at h = -12.7) never happens. One reciprocal: the alternative form
// P(t) / (1 + 2a) with t = (a - 4) / (a + 4) takes two and five more
// instructions, and the erf-form GELU is bound by issue and by the MUFU unit
// together (two MUFU operations per element here, three in that form).
// exp(-h^2 / 2) keeps the rounding of h^2 and of h^2 log2(e) / 2 as
// corrections (h^2 = s + err exactly; the exponent -s log2(e) / 2 = hi +
// lo): without them it is off by h^2 x 3e-8 relative (6e-6 at h = 14).
// Emulated in float32 against mpmath for a in [0, 10.1] (fit_erfc.py's
// polynomials, exact division for the reciprocal): erfc within 3.1e-7
// relative with the corrections (the P(t) form 3.9e-7), 6.7e-6 without
// (7.3e-6). h > 0: Phi(h) = 1 - Phi(-h).
// Past kNormalCdfMaxArg Phi(-|h|) and exp(-h^2 / 2) are below float32's range (the
// ftz exp2 gives 0); for float32 outputs the clamp also keeps h^2 finite
// (its corrections) and maps NaN to it (the callers multiply by h, which
// carries the NaN).
#pragma once

#include "math/fast_math.h"
#include "math/normal_cdf_poly.h"

#ifdef __CUDACC__
namespace jaxcraft {
namespace activation {

// exp(-a^2 / 2) with the rounding of a^2 and of its product with log2(e) / 2
// carried as corrections.
__device__ __forceinline__ float corrected_gauss(float a) {
  constexpr float kHalfLog2e = 0.5f * kLog2e;
  constexpr float kHalfLog2eLo = 0.5f * 1.925963e-08f;  // (log2(e) - kLog2e) / 2
  const float s = a * a;
  const float hi = -s * kHalfLog2e;
  const float e = fast_exp2(hi);
  const float s_err = fmaf(a, a, -s);
  float lo = fmaf(-s, kHalfLog2e, -hi);
  lo = fmaf(-s, kHalfLog2eLo, lo);
  lo = fmaf(-s_err, kHalfLog2e, lo);
  return fmaf(e * lo, kLn2, e);  // 2^(hi + lo) = 2^hi (1 + lo ln 2)
}

// kExpCorrected = false (16-bit outputs, which round to 2^-9 relative or
// coarser): exp(-h^2 / 2) without the corrections and P of degree 6. |h| is
// scaled by sqrt(log2(e) / 2) first (b), so that exp(-h^2 / 2) = 2^(-b^2)
// (two multiplies and two roundings, as h^2 times log2(e) / 2), and there
// is no clamp: past kNormalCdfMaxArg 2^(-b^2) flushes to 0 (b^2 = inf
// included) and u is 0 at |h| = inf, so Phi is exactly 0 or 1, as the clamped argument's
// Phi rounded in 16 bits, and a NaN stays NaN. A clamp's FMNMX would be one
// instruction of ~25 per element (SASS of the bf16 erf forward: 840 with it,
// 808 without, per 32 elements), and the H200's 16-bit erf forward is
// issue-bound.
template <bool kExpCorrected = true>
__device__ __forceinline__ float device_normal_cdf(float h, float& gauss) {
  float u, p;
  if constexpr (kExpCorrected) {
    const float a = fminf(fabsf(h), kNormalCdfMaxArg);
    u = fast_rcp(fmaf(kNormalCdfUScale, a, 1.f));
    p = normal_cdf_poly8(u);
    gauss = corrected_gauss(a);
  } else {
    constexpr float kScale = 0.84932180f;  // sqrt(log2(e) / 2)
    const float b = fabsf(h) * kScale;
    u = fast_rcp(fmaf(kNormalCdfUScale / kScale, b, 1.f));
    p = 4.401237145e-02f;
    p = fmaf(p, u, -1.780534238e-01f);
    p = fmaf(p, u, 1.941711754e-01f);
    p = fmaf(p, u, 1.925686188e-02f);
    p = fmaf(p, u, 1.406354010e-01f);
    p = fmaf(p, u, 1.388127953e-01f);
    p = fmaf(p, u, 1.411641389e-01f);
    gauss = fast_exp2(-b * b);
  }
  const float y = u * p * gauss;  // Phi(-|h|)
  return h > 0.f ? 1.f - y : y;
}

}  // namespace activation
}  // namespace jaxcraft
#endif  // __CUDACC__
