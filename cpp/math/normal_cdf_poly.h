// The normal CDF's tail polynomial, shared by the CUDA kernels
// (activation_device_math.h) and the CPU loops (activation_math.h): for h of either
// sign, Phi(-|h|) = u P(u) exp(-h^2 / 2) with u = 1 / (1 + |h| / (2 sqrt 2)),
// P fitted by fit_erfc.py (printed halved: erfc(a) / 2 = Phi(-a sqrt 2)).
#pragma once

#ifdef __CUDACC__
#define JAXCRAFT_POLY_FN __host__ __device__ __forceinline__
#else
#define JAXCRAFT_POLY_FN inline
#endif

namespace jaxcraft {
namespace activation {

constexpr float kNormalCdfMaxArg = 14.28f;  // 10.1 sqrt 2: Phi(-14.28) is below float32's range
constexpr float kNormalCdfUScale = 0.35355339f;  // 1 / (2 sqrt 2)

// a * b + c: fused on the GPU; on the host the CPU loops' FMA clones
// contract it (fmaf would be a libm call in the baseline clone).
JAXCRAFT_POLY_FN float mul_add(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// P of degree 8 (4.3e-8 relative: float32 outputs).
JAXCRAFT_POLY_FN float normal_cdf_poly8(float u) {
  float p = -2.954881638e-02f;
  p = mul_add(p, u, 1.423576176e-01f);
  p = mul_add(p, u, -2.437456101e-01f);
  p = mul_add(p, u, 1.392007470e-01f);
  p = mul_add(p, u, -1.342840213e-02f);
  p = mul_add(p, u, 1.013925225e-01f);
  p = mul_add(p, u, 1.215394214e-01f);
  p = mul_add(p, u, 1.411893815e-01f);
  return mul_add(p, u, 1.410431117e-01f);
}

}  // namespace activation
}  // namespace jaxcraft

#undef JAXCRAFT_POLY_FN
