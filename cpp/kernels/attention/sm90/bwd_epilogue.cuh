// The Hopper backward's dK/dV epilogue: dK = scale * sum dS^T Q and dV
// (16-bit, swizzled) staged over the warpgroup's own rows of K and V, then
// one thread stores them by TMA; kBias with dbias_tma: zeros into the dbias
// tiles of the query tiles the CTA never visited.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/sm90/bwd_args.h"
#include "kernels/attention/sm90/bwd_config.cuh"
#include "kernels/attention/sm90/bwd_consumer_thread.cuh"
#include "kernels/attention/sm90/bwd_scheduler.cuh"
#include "kernels/attention/sm90/bwd_score_features.cuh"
#include "kernels/attention/sm90/bwd_smem.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

// Every warpgroup's last dQ product (which reads all of K) is done once
// both pass the first barrier; then each stages its 64 rows of dK and dV
// over its own rows of K and V and stores. (kDqTma: the last reductions
// read their tiles before the CTA exits; dq_warp: warp 1 waits for its own.)
template <DType kDt, class Cfg, int kFeat>
__device__ __forceinline__ void bwd_epilogue(const BwdSm90Args& p, const BwdSmem<Cfg, kFeat>& sm,
                                             const BwdConsumerThread<Cfg, kFeat>& th,
                                             const BwdWork& wk,
                                             const BwdScoreFeatures<kDt, Cfg, kFeat>& features,
                                             float (&dk)[Cfg::kAccCols / 8][4],
                                             float (&dv)[Cfg::kAccCols / 8][4]) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kAcc = Cfg::kAccCols;
  const BwdArgs& a = p.a;
  const ShapeArgs& sh = a.shape;
  const int n0 = wk.n0, kv_head = wk.kv_head, b = wk.b, group = wk.group;
  const int c = th.c, ct = th.ct, t = th.t, wg_key0 = th.wg_key0, acc_cb0 = th.acc_cb0;
  const int thread_key0 = th.thread_key0;
  if (Cfg::kDqTma && !Cfg::dq_warp(kFeat) && ct == 0) tma_store_wait_read();
  named_barrier_sync(Cfg::kConsumersBarrier, Cfg::kConsumerThreads);
  // kBias with dbias_tma: query tiles this CTA never visits (outside
  // [mt_begin, mt_end): hidden by causal, window, lengths or segment
  // ranges) get zeros, from a zeroed block of this warpgroup's dS^T buffer.
  [[maybe_unused]] const uint32_t zero_tile = sm.ds_sa + c * Cfg::kDsBytes;
  if constexpr (kFeat == kBias) {
    if (p.dbias_tma)
      for (int i = ct; i < kBM * kSwizzleRowBytes / 16; i += kWarpgroupThreads)
        asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(zero_tile + 16 * i), "r"(0)
                     : "memory");
  }
#pragma unroll
  for (int j = 0; j < kAcc / 8; ++j) {
    const int cb = acc_cb0 + j / 8, chunk = j % 8;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = thread_key0 + 8 * h2;
      const uint32_t off = cb * col_block_bytes<kBN>() + swizzled_offset(r, chunk) + 4 * t;
      const uint32_t kv = pack2<kDt>(dk[j][2 * h2] * a.scale, dk[j][2 * h2 + 1] * a.scale);
      const uint32_t vv = pack2<kDt>(dv[j][2 * h2], dv[j][2 * h2 + 1]);
      st_shared_b32(sm.k_sa + off, kv);
      st_shared_b32(sm.v_sa + off, vv);
    }
  }
  fence_proxy_async();
  named_barrier_sync(Cfg::kWarpgroupBarrier + c, kWarpgroupThreads);
  // Tested before the branch, so that both tests form one predicate: as
  // the right operand of &&, its parameter load (through a reference here,
  // not speculated) stays behind the test of ct.
  const bool keys_in_range = n0 + wg_key0 < sh.seqlen_k;
  if (ct == 0 && keys_in_range) {
    if constexpr (kFeat == kBias) {
      if (features.dbias_storer) {
        const int q_tiles = (sh.seqlen_q + kBM - 1) / kBM;
        for (int h = kv_head * group; h < (kv_head + 1) * group; ++h)
          for (int mt = 0; mt < q_tiles; ++mt)
            if (mt < wk.mt_begin || mt >= wk.mt_end) features.store_dbias(zero_tile, mt, h, true);
      }
    }
#pragma unroll
    for (int cb = acc_cb0; cb < acc_cb0 + kAcc / kSwizzleCols; ++cb) {
      const uint32_t off = cb * col_block_bytes<kBN>() + wg_key0 * kSwizzleRowBytes;
      tma_store_4d(&p.dk_map, sm.k_sa + off, cb * kSwizzleCols, kv_head, n0 + wg_key0, b);
      tma_store_4d(&p.dv_map, sm.v_sa + off, cb * kSwizzleCols, kv_head, n0 + wg_key0, b);
    }
    tma_store_commit_and_wait();
  }
}

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
