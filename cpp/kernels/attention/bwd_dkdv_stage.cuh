// DkdvStageLoader: fills one Q/dO stage of the portable dK/dV kernel for a
// (query head, query tile): Q and dO by cp.async, lse * log2(e) and delta
// per row, and for the feature instances the tile's bias and mask blocks.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/bwd_dkdv_shape.cuh"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_tile.cuh"
#include "kernels/attention/smem_tile.cuh"
#include "kernels/attention/softmax.cuh"

namespace jaxcraft {
namespace attn {

// Stage layout: Q, dO (kQBytes each), lse * log2(e), delta (kBM floats each).
template <DType kDt, class Sh, int kLevel>
struct DkdvStageLoader {
  using Elem = typename ElemOf<kDt>::type;
  static constexpr int kBM = Sh::kBlockM, kBN = Sh::kBlockN, kThreads = Sh::kThreads;
  // Every member but smem (the dynamic shared memory's base) refers to a
  // variable of the kernel, as a lambda's captures would.
  unsigned char* smem;
  unsigned char* const& stage_base;
  const BwdArgs& a;
  const SeqLens& lens;
  const ElemStage& est;
  const int& b;
  const int& n0;
  const int& tid;
  const int64_t& q_row_stride;

  __device__ __forceinline__ void load(int head, int m0, int stage) const {
    const ShapeArgs& sh = a.shape;
    if constexpr (kLevel != kFeatPlain)
      if (est.bytes)
        stage_bias_mask<kBM, kBN, kThreads>(smem + stage * est.bytes, est, a.mask, a.scores, sh,
                                            b, head, m0, n0, lens.q_len - m0, lens.kv_len - n0,
                                            tid);
    const int64_t q_off = ((int64_t(b) * sh.seqlen_q + m0) * sh.num_heads + head) * sh.head_dim;
    const int rows = lens.q_len - m0;
    unsigned char* st = stage_base + stage * Sh::kStageBytes;
    load_tile_async<kBM, Sh::kHeadDim, kThreads>(smem_u32(st),
                                                 static_cast<const Elem*>(a.q) + q_off,
                                                 q_row_stride, rows, sh.head_dim, a.q, tid);
    load_tile_async<kBM, Sh::kHeadDim, kThreads>(smem_u32(st + Sh::kQBytes),
                                                 static_cast<const Elem*>(a.d_o) + q_off,
                                                 q_row_stride, rows, sh.head_dim, a.d_o, tid);
    float* lse2 = reinterpret_cast<float*>(st + 2 * Sh::kQBytes);
    float* dlt = lse2 + kBM;
    const int64_t row_off = (int64_t(b) * sh.num_heads + head) * sh.seqlen_q + m0;
    for (int i = tid; i < kBM; i += kThreads) {
      const bool ok = i < rows;
      const float l = ok ? a.lse[row_off + i] : -INFINITY;
      // Rows that saw no key (lse = -inf) must get P = 0: exp2(x - inf) = 0.
      lse2[i] = l == -INFINITY ? INFINITY : l * kLog2e;
      dlt[i] = ok ? a.delta[row_off + i] : 0.f;
    }
  }
};

}  // namespace attn
}  // namespace jaxcraft
