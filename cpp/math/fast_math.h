// The hardware approximations the kernels build their exponentials and
// reciprocals from (one MUFU instruction each), log2(e) for turning exp(x)
// into exp2(x log2 e) and ln(2) for the way back. Error bounds per the PTX
// ISA.
#pragma once

namespace jaxcraft {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

#ifdef __CUDACC__
// ex2.approx.ftz: 2^-22 relative (2 ulp); results below 2^-126 flush to
// zero; exp2(-inf) = +0, which is what masking needs.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// rcp.approx.ftz: at most 1 ulp; 1 / inf = +0.
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif  // __CUDACC__

}  // namespace jaxcraft
