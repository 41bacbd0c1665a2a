// The portable forward's epilogue: O divided by its row sums (and by 1 -
// dropout rate), the logsumexp written, and O staged through Q's shared
// tile (dead by then) to global memory.
#pragma once
#include <cmath>
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_tile.cuh"
#include "kernels/attention/smem_tile.cuh"
#include "math/fast_math.h"

namespace jaxcraft {
namespace attn {

// A thread's view of its CTA's query tile. It refers to the kernel's own
// values: nvcc optimizes a part before inlining it, and copies held in
// members can compile to different code.
struct FwdTileRows {
  const FwdArgs& a;
  const int& head;
  const int& b;
  const int& m0;          // the tile's first query row
  const int& rows_out;    // rows of the tile inside the output
  const int& rows_valid;  // rows below the batch element's query length
  const int& tid;
  const int& lane;
  const int& g;           // lane / 4: the fragment rows g and g + 8
  const int& t;           // lane % 4: the fragment columns 2 t, 2 t + 1
  const int& warp_row0;   // the warp's first row in the tile
};

template <DType kDt, class Sh, int kLevel, class Elem>
__device__ __forceinline__ void fwd_epilogue(const FwdTileRows& rows, Elem* q_tile,
                                             int64_t q_off, int64_t q_row_stride,
                                             float (&acc)[Sh::kMTiles][Sh::kHeadTiles][4],
                                             const float (&row_max)[Sh::kMTiles][2],
                                             const float (&row_sum)[Sh::kMTiles][2]) {
  constexpr int kMT = Sh::kMTiles;
  const FwdArgs& a = rows.a;
  const ShapeArgs& sh = a.shape;
  float* lse = a.lse + (int64_t(rows.b) * sh.num_heads + rows.head) * sh.seqlen_q + rows.m0;
  float out_scale = 1.f;  // 1 / (1 - dropout rate)
  if constexpr (kLevel == kFeatScores)
    if (a.scores.dropout_key != nullptr) out_scale = a.scores.dropout_keep_scale;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(row_sum[mt][h]);
      const bool seen = sum > 0.f || sum != sum;  // NaN: a NaN score, the row NaN as in jax.nn
      const float inv = seen ? out_scale / sum : 0.f;
#pragma unroll
      for (int j = 0; j < Sh::kHeadTiles; ++j) {
        acc[mt][j][2 * h] *= inv;
        acc[mt][j][2 * h + 1] *= inv;
      }
      const int r = rows.warp_row0 + mt * kMmaM + rows.g + 8 * h;
      if (rows.t == 0 && r < rows.rows_out)
        lse[r] = (seen && r < rows.rows_valid) ? (row_max[mt][h] + __log2f(sum)) * kLn2
                                               : -INFINITY;
    }
  }
  __syncthreads();  // Q is dead in every warp: reuse its tile to stage O
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
    store_acc_slab<kDt>(q_tile, Sh::kStride, rows.warp_row0 + mt * kMmaM, 0, acc[mt], 1.f,
                        rows.lane);
  __syncthreads();
  store_tile<Sh::kBlockM, Sh::kHeadDim, Sh::kThreads>(static_cast<Elem*>(a.o) + q_off,
                                                      q_row_stride, q_tile, rows.rows_out,
                                                      rows.rows_valid, sh.head_dim, rows.tid);
}

}  // namespace attn
}  // namespace jaxcraft
