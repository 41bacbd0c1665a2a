// The Hopper forward's O epilogue: normalize, write the logsumexp, stage O
// (16-bit, swizzled) over this warpgroup's rows of the Q tile (kOInStage:
// of the last stage), then one thread stores it and, once the store has
// read them, the Q tile (the stage) is released.
#pragma once
#include <cmath>
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/fwd_consumer_item.cuh"
#include "kernels/attention/sm90/fwd_args.h"
#include "kernels/attention/sm90/fwd_key_tile.cuh"
#include "kernels/attention/sm90/fwd_smem.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/softmax.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <DType kDt, class Cfg, int kFeat>
__device__ __forceinline__ void fwd_epilogue(const FwdSm90Args& p, const FwdSmem<Cfg>& sm,
                                             const FwdConsumerThread& th, const FwdItem& item,
                                             const FwdItemSteps<Cfg, kFeat>& steps,
                                             typename FwdKeyTile<kDt, Cfg, kFeat>::OAcc& o,
                                             float (&row_max)[1][2], float (&row_sum)[1][2],
                                             FwdLateRelease<Cfg, kFeat>& late) {
  constexpr int kD = Cfg::kHeadDim, kBM = Cfg::kBlockM, kCB = Cfg::kColBlocks;
  constexpr bool kSumByMma = FwdKeyTile<kDt, Cfg, kFeat>::kSumByMma;
  const FwdArgs& a = p.a;
  const ShapeArgs& sh = a.shape;
  const int m0 = item.m0, head = item.head, b = item.b, n = item.n, it0 = item.it0;
  const int row_first = item.row_first, rows_valid = item.rows_valid;
  const int thread_row0 = item.thread_row0, wg_row0 = item.wg_row0;
  const int n_tiles = steps.n_tiles;
  const bool o_in_stage = steps.o_in_stage;
  const int c = th.c, ct = th.ct, lane = th.lane, t = th.t;

  const int rows_out = min(kBM, sh.seqlen_q - m0);
  float* lse = a.lse + (int64_t(b) * sh.num_heads + head) * sh.seqlen_q + m0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = thread_row0 + 8 * h;
    const float sum = kSumByMma ? o[0][kD / 8][2 * h] : quad_sum(row_sum[0][h]);
    // sum = 0: the row saw no key (zeros, lse -inf); NaN: a NaN score,
    // which makes the row and its lse NaN, as jax.nn.
    const bool seen = (sum > 0.f || sum != sum) && r >= row_first && r < rows_valid;
    float inv = seen ? 1.f / sum : 0.f;
    if constexpr (kFeat == kDropout) inv *= a.scores.dropout_keep_scale;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      o[0][j][2 * h] *= inv;
      o[0][j][2 * h + 1] *= inv;
    }
    if (t == 0 && r >= row_first && r < rows_out)
      lse[r] = seen ? (row_max[0][h] + __log2f(sum)) * kLn2 : -INFINITY;
  }
  const int o_stage = sm.ring.stage(it0 + n_tiles - 1);
  const uint32_t o_tile = o_in_stage ? sm.k_tile(o_stage) : sm.q_tile(n);
  late.release(sm);  // an item without keys issued no S = Q K^T
  // Every warpgroup's last products have read the stage. Where O fits the
  // stage's K tile, the Q release says so (each warp arrives once its last
  // S = Q K^T is in), and no warpgroup waits for another's epilogue.
  if (o_in_stage) {
    if constexpr (Cfg::kQBytes <= Cfg::kKVBytes)
      mbar_wait(sm.q_empty(n), sm.q_parity(n));
    else
      named_barrier_sync(1 + Cfg::kConsumers, Cfg::kConsumers * kWarpgroupThreads);
  }
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
    const int cb = j / 8, chunk = j % 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = thread_row0 + 8 * h;
      const uint32_t v = pack2<kDt>(o[0][j][2 * h], o[0][j][2 * h + 1]);
      st_shared_b32(o_tile + cb * col_block_bytes<kBM>() + swizzled_offset(r, chunk) + 4 * t, v);
    }
  }
  fence_proxy_async();
  named_barrier_sync(1 + c, kWarpgroupThreads);
  const bool late_release = FwdLateRelease<Cfg, kFeat>::kEnabled && o_in_stage;
  if (ct == 0) {
    // A warpgroup whose rows lie before row 0 (a shifted first tile) stores nothing.
    if (wg_row0 < rows_out && wg_row0 >= row_first) {
#pragma unroll
      for (int cb = 0; cb < kCB; ++cb)
        tma_store_4d(&p.o_map, o_tile + cb * col_block_bytes<kBM>() + wg_row0 * kSwizzleRowBytes,
                     cb * kSwizzleCols, head, m0 + wg_row0, b, fwd_q_o_policy<Cfg>());
      tma_store_commit();
      if (!late_release) tma_store_wait_read();
    }
    if (!p.o_in_stage) mbar_arrive(sm.q_empty(n));
    if (late_release) late.stored_stage = o_stage;
  }
  if (p.o_in_stage && !late_release) {
    named_barrier_sync(1 + c, kWarpgroupThreads);  // the store has read the staged O
    if (o_in_stage) {
      steps.release_k(sm, n_tiles - 1);
      steps.release_v(sm, n_tiles - 1);
    } else if (lane == 0) {
      mbar_arrive(sm.q_empty(n));
    }
  }
}

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
