// accumulate_dq: phase C of the portable dK/dV kernel for one query tile
// (the fast dQ path), a warp's 16 query rows x kCCols head columns of
// dQ = dS.K (mma.sync; dS^T from phase A's 16-bit tile, transposed by
// ldmatrix), unscaled, added to the fp32 dq_accum with atomics.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/bwd_dkdv_shape.cuh"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"

namespace jaxcraft {
namespace attn {

// Adds two adjacent fp32 values (8-byte aligned: c is even, rows have an
// even number of columns). sm_90 has a 64-bit vector reduction, which halves
// the atomic traffic that bounds the fast dQ path.
__device__ __forceinline__ void add_pair(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

// Query tile m0 of head. The arguments refer to the kernel's variables, as
// a lambda's captures would. dq (the accumulator), dsa and kb (the ldmatrix
// operands dS and K) are the step loop's (bwd_dkdv_kernel.cuh says why).
template <DType kDt, class Sh>
__device__ __forceinline__ void accumulate_dq(const BwdArgs& a, const SeqLens& lens,
                                              float (&dq)[Sh::kCCols / kMmaN][4],
                                              const uint32_t& ds_sa, const uint32_t& k_sa,
                                              const int& warp, const int& lane, const int& g,
                                              const int& t, const int& b, const int& head,
                                              const int& m0, const int64_t& q_row_stride,
                                              uint32_t (&dsa)[4], uint32_t (&kb)[4]) {
  constexpr int kBN = Sh::kBlockN, kStride = Sh::kStride, kPStride = Sh::kPStride;
  constexpr int kCTiles = Sh::kCCols / kMmaN;
  const ShapeArgs& sh = a.shape;
  const int qr0 = (warp % Sh::kQSlabs) * kMmaM;
  const int hc0 = (warp / Sh::kQSlabs) * Sh::kCCols;
#pragma unroll
  for (int j = 0; j < kCTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[j][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kBN / kMmaK; ++kk) {
    load_a_trans(dsa, ds_sa, kPStride, qr0, kk * kMmaK, lane);
#pragma unroll
    for (int np = 0; np < kCTiles / 2; ++np) {
      load_b_kn(kb, k_sa, kStride, hc0 + np * 2 * kMmaN, kk * kMmaK, lane);
      mma_16816<kDt>(dq[2 * np], dsa, kb[0], kb[1]);
      mma_16816<kDt>(dq[2 * np + 1], dsa, kb[2], kb[3]);
    }
  }
  float* dqa = a.dq_accum + ((int64_t(b) * sh.seqlen_q + m0) * sh.num_heads + head) * sh.head_dim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = qr0 + g + 8 * h;
    if (m0 + r < lens.q_len) {
#pragma unroll
      for (int j = 0; j < kCTiles; ++j) {
        const int c = hc0 + j * kMmaN + 2 * t;
        if (c < sh.head_dim) add_pair(dqa + r * q_row_stride + c, dq[j][2 * h], dq[j][2 * h + 1]);
      }
    }
  }
}

}  // namespace attn
}  // namespace jaxcraft
