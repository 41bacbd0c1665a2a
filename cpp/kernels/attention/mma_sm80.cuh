// Warp-level tensor-core primitives for sm_80+ as inline PTX: ldmatrix and
// mma.sync m16n8k16 (16-bit inputs, fp32 accumulators), plus fragment loaders
// for the four operand layouts the attention kernels use (cp.async:
// common/cuda/cp_async.cuh).
//
// Fragment conventions (PTX ISA, mma.m16n8k16): lane = 4 * g + t with
// g in [0, 8), t in [0, 4).
//   A (16x16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8):  c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/cp_async.cuh"
#include "contract/dtype.h"

namespace jaxcraft {
namespace attn {

constexpr int kWarpSize = 32;
constexpr int kMmaM = 16;
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kElemsPerCopy = kCpAsyncBytes / 2;  // 16-bit elements per copy / ldmatrix row

template <DType kDt> struct ElemOf;
template <> struct ElemOf<DType::kBF16> { using type = __nv_bfloat16; };
template <> struct ElemOf<DType::kF16> { using type = __half; };

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <DType kDt>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kDt == DType::kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp32 values as one register of two 16-bit elements (lo in the low half).
template <DType kDt>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (kDt == DType::kBF16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  }
  return r;
}

// Inverse of pack2.
template <DType kDt>
__device__ __forceinline__ float2 unpack2(uint32_t r) {
  if constexpr (kDt == DType::kBF16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&r));
  }
}

// A C-layout accumulator pair (two adjacent 16x8 tiles along k) re-read as an
// A fragment: this is how P and dS feed the next mma without shared memory.
template <DType kDt>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
  a[0] = pack2<kDt>(lo[0], lo[1]);
  a[1] = pack2<kDt>(lo[2], lo[3]);
  a[2] = pack2<kDt>(hi[0], hi[1]);
  a[3] = pack2<kDt>(hi[2], hi[3]);
}

// Shared-memory operand loaders. `base` is the shared address of element
// (0, 0) of a row-major 16-bit tile with `stride` elements per row.

// A[m][k] stored as [m][k].
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t base, int stride, int m0, int k0,
                                       int lane) {
  const int row = m0 + (lane % 16);
  const int col = k0 + (lane / 16) * 8;
  ldmatrix_x4(a, base + (row * stride + col) * 2);
}

// A[m][k] stored transposed, as [k][m].
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], uint32_t base, int stride, int m0,
                                             int k0, int lane) {
  const int row = k0 + (lane % 8) + (lane / 16) * 8;
  const int col = m0 + ((lane / 8) % 2) * 8;
  ldmatrix_x4_trans(a, base + (row * stride + col) * 2);
}

// B[k][n] for two adjacent n tiles (n0, n0 + 8), stored as [n][k] (K in Q.K^T).
// b[0], b[1] feed tile n0; b[2], b[3] feed tile n0 + 8.
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], uint32_t base, int stride, int n0,
                                          int k0, int lane) {
  const int row = n0 + (lane % 8) + (lane / 16) * 8;
  const int col = k0 + ((lane / 8) % 2) * 8;
  ldmatrix_x4(b, base + (row * stride + col) * 2);
}

// B[k][n] for two adjacent n tiles, stored as [k][n] (V in P.V).
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], uint32_t base, int stride, int n0,
                                          int k0, int lane) {
  const int row = k0 + (lane % 8) + ((lane / 8) % 2) * 8;
  const int col = n0 + (lane / 16) * 8;
  ldmatrix_x4_trans(b, base + (row * stride + col) * 2);
}

// Reductions over the 4 lanes that share a C-fragment row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace attn
}  // namespace jaxcraft
