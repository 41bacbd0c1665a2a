// accumulate_dkdv: phase B of the portable dK/dV kernel for one query tile,
// a warp's 16 keys x kHCols head columns of dV += P^T.dO and dK += dS^T.Q
// (mma.sync; P^T and dS^T from phase A's 16-bit tiles, Q and dO from the
// stage). dK's scale is applied once, in the epilogue.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/bwd_dkdv_shape.cuh"
#include "kernels/attention/mma_sm80.cuh"

namespace jaxcraft {
namespace attn {

// The arguments refer to the kernel's variables, as a lambda's captures
// would. key_r0: the warp's first key; part: its head-column part. pa, dsa
// (A: P^T, dS^T) and ob, qb (B: dO, Q) take the ldmatrix operands; they are
// the step loop's (bwd_dkdv_kernel.cuh says why).
template <DType kDt, class Sh>
__device__ __forceinline__ void accumulate_dkdv(float (&dk)[Sh::kHCols / kMmaN][4],
                                                float (&dv)[Sh::kHCols / kMmaN][4],
                                                const uint32_t& p_sa, const uint32_t& ds_sa,
                                                const uint32_t& q_sa, const uint32_t& do_sa,
                                                const int& key_r0, const int& part,
                                                const int& lane, uint32_t (&pa)[4],
                                                uint32_t (&dsa)[4], uint32_t (&ob)[4],
                                                uint32_t (&qb)[4]) {
  constexpr int kBM = Sh::kBlockM, kStride = Sh::kStride, kPStride = Sh::kPStride;
  constexpr int kBTiles = Sh::kHCols / kMmaN;
  const int hc0 = part * Sh::kHCols;
#pragma unroll
  for (int qk = 0; qk < kBM / kMmaK; ++qk) {
    load_a(pa, p_sa, kPStride, key_r0, qk * kMmaK, lane);
    load_a(dsa, ds_sa, kPStride, key_r0, qk * kMmaK, lane);
#pragma unroll
    for (int np = 0; np < kBTiles / 2; ++np) {
      load_b_kn(ob, do_sa, kStride, hc0 + np * 2 * kMmaN, qk * kMmaK, lane);
      load_b_kn(qb, q_sa, kStride, hc0 + np * 2 * kMmaN, qk * kMmaK, lane);
      mma_16816<kDt>(dv[2 * np], pa, ob[0], ob[1]);
      mma_16816<kDt>(dv[2 * np + 1], pa, ob[2], ob[3]);
      mma_16816<kDt>(dk[2 * np], dsa, qb[0], qb[1]);
      mma_16816<kDt>(dk[2 * np + 1], dsa, qb[2], qb[3]);
    }
  }
}

}  // namespace attn
}  // namespace jaxcraft
