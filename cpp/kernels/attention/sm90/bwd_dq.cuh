// BwdDq: a Hopper backward consumer warpgroup's dQ += dS K for a step
// (wgmma, dS^T from its shared buffer) and its reduction into dq_accum:
// staged for TMA bulk reduce-adds (kDqTma; with dq_warp issued by warp 1 of
// the producer warpgroup), else red.add from registers.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/sm90/bwd_args.h"
#include "kernels/attention/sm90/bwd_config.cuh"
#include "kernels/attention/sm90/bwd_consumer_thread.cuh"
#include "kernels/attention/sm90/bwd_scheduler.cuh"
#include "kernels/attention/sm90/bwd_smem.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <DType kDt, class Cfg, int kFeat>
struct BwdDq {
  static constexpr int kBN = Cfg::kBlockN, kCB = Cfg::kColBlocks;
  static constexpr bool kDqWarp = Cfg::dq_warp(kFeat);
  // dQ rows dq_m0 + 16 w + g (+ 8), in 64-column blocks: keys [key_lo,
  // key_lo + dq_keys) of the tile times columns of K block cb; kDqByRows:
  // this warpgroup's 64 queries, the dS^T buffer's column block c.
  static constexpr int kDqKeys = Cfg::kDqByKeys ? kWgmmaM : kBN;
  using Frag = float[kSwizzleCols / 8][4];
  // Every member refers to a variable of the kernel's consumer part, as a
  // lambda's captures would (bwd_kernel.cuh says why).
  const BwdSm90Args& p;
  const BwdSmem<Cfg, kFeat>& sm;
  const BwdConsumerThread<Cfg, kFeat>& th;
  const BwdWork& wk;

  // The end of step it's dQ column blocks: split by columns, or (one block)
  // this warpgroup's turn?
  __device__ __forceinline__ int cb_hi(int it) const {
    return Cfg::kSplitD                          ? th.acc_cb0 + Cfg::kAccCols / kSwizzleCols
           : Cfg::kDqByRows || Cfg::kDqByKeys ? kCB
           : kCB == 1                          ? int(it % Cfg::kConsumers == th.c)
                                               : th.c + 1;
  }

  // ds_buf: the step's dS^T buffer.
  __device__ void issue(uint32_t ds_buf, int cb, Frag& dq) const {
    const int c = th.c;
    const int key_lo = Cfg::kDqByKeys ? th.wg_key0 : 0;
    const uint32_t ds_rows = ds_buf + (Cfg::kDqByRows ? c * col_block_bytes<kBN>() : 0);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDqKeys / kWgmmaK; ++k) {
      const int row = key_lo + k * kWgmmaK;
      wgmma_ss_tt<kDt, kSwizzleCols>(
          dq, smem_desc(ds_rows + row * kSwizzleRowBytes, 0),
          smem_desc(sm.k_sa + cb * col_block_bytes<kBN>() + row * kSwizzleRowBytes, 0), k > 0);
    }
    wgmma_commit();
  }

  // Step it (ring stage s) of query head h, query tile m0.
  __device__ void put(int it, int s, int h, int m0, int cb, Frag& dq) const {
    const BwdArgs& a = p.a;
    const ShapeArgs& sh = a.shape;
    const int b = wk.b;
    const int c = th.c, ct = th.ct, w = th.w, g = th.g, t = th.t, cb_lo = th.cb_lo;
    const int dq_m0 = m0 + (Cfg::kDqByRows ? c * kWgmmaM : 0);
    fence_operands(dq);
    if constexpr (Cfg::kDqTma) {
      // Element (j, 2 h2 + e): row 16 w + g + 8 h2, column 8 j + 2 t + e,
      // in box j / 4 (32 columns), 16-byte chunk 2 (j % 4) + t / 2.
      // A warp's 8-byte stores are served by half-warps (4 rows x 2
      // chunks each): in store j the lanes with t / 2 = 1 write their
      // block j ^ 2, so that the half-warp's 8 chunks land on 8
      // different swizzled bank groups (with block j, chunks c and c + 1
      // of rows g and g ^ 1 shared banks: 2-way conflicts). +5-7% at
      // head dim 128, +1.5-3.5% at 64. Not in the dropout instance: its
      // selects pushed it from 4 to 32 spilled bytes, and it ran 3% slower.
      const bool odd_chunk = kFeat != kDropout && t / 2 == 1;
      // kDqWarp: warp 1 has read the last step's tile. With kDqInStage
      // too, where the ring guards the stage: without this wait a
      // warpgroup a step ahead of warp 1 would arrive on dQ full twice,
      // and the hardware barrier would count its warps into the earlier
      // step (measured: the head-dim-256 kernel hung).
      if (kDqWarp && it > 0 && cb == cb_lo)
        named_barrier_sync(Cfg::kDqEmptyBarrier + c, Cfg::kDqBarrierThreads);
      // kDqByRows: no barrier between the warpgroups orders this
      // warpgroup's last reductions before these stores; its own does.
      if constexpr (Cfg::kDqByRows) {
        if (ct == 0) tma_store_wait_read();
        named_barrier_sync(Cfg::kWarpgroupBarrier + c, kWarpgroupThreads);
      }
      const uint32_t tile =
          Cfg::kDqInStage
              ? sm.q_tile(s) + (kCB == 1 ? 0 : c * Cfg::kQBytes) + (cb - cb_lo) * Cfg::kDqBlockBytes
              : sm.dq_sa + c * Cfg::kDqBytes;
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
        for (int j = 0; j < kSwizzleCols / 8; ++j) {
          const int jj = odd_chunk ? j ^ 2 : j;  // same box: j / 4 == jj / 4
          const uint32_t at = tile + (j / 4) * col_block_bytes<Cfg::kDqRows>() +
                              swizzled_offset(w * 16 + g + 8 * h2, 2 * (jj % 4) + t / 2) +
                              8 * (t % 2);
          const float v0 = odd_chunk ? dq[j ^ 2][2 * h2] : dq[j][2 * h2];
          const float v1 = odd_chunk ? dq[j ^ 2][2 * h2 + 1] : dq[j][2 * h2 + 1];
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(v0), "f"(v1) : "memory");
        }
      fence_proxy_async();
      if constexpr (kDqWarp) return;  // warp 1 takes it from here (dQ full, in the kernel)
      named_barrier_sync(Cfg::kWarpgroupBarrier + c, kWarpgroupThreads);
      if (ct == 0) {  // rows past seqlen_q and columns past head_dim are clipped
#pragma unroll
        for (int box = 0; box < kSwizzleCols / Cfg::kDqBoxCols; ++box)
          tma_reduce_add_4d(&p.dq_map, tile + box * col_block_bytes<Cfg::kDqRows>(),
                            cb * kSwizzleCols + box * Cfg::kDqBoxCols, h, dq_m0, b);
        tma_store_commit();
      }
    } else {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int q = dq_m0 + w * 16 + g + 8 * h2;
        if (q < sh.seqlen_q) {
          float* row = a.dq_accum + ((int64_t(b) * sh.seqlen_q + q) * sh.num_heads + h) * sh.head_dim;
#pragma unroll
          for (int j = 0; j < kSwizzleCols / 8; ++j) {
            const int col = cb * kSwizzleCols + 8 * j + 2 * t;
            if (col < sh.head_dim) red_add_v2(row + col, dq[j][2 * h2], dq[j][2 * h2 + 1]);
          }
        }
      }
    }
  }

  // kDqByRows: step it's dQ (query head h, tile m0), taken one step late
  // from its dS^T buffer ds_prev once both warpgroups have stored it. (The
  // last step's empty arrive has no waiter: a CTA runs one key tile.)
  __device__ void late(int it, uint32_t ds_prev, int h, int m0) const {
    Frag dq;
    mbar_wait(sm.ds_full(it % 2), (it / 2) & 1);
    issue(ds_prev, 0, dq);
    wgmma_wait<0>();
    mbar_arrive(sm.ds_empty(it % 2));
    put(it, sm.ring.stage(it), h, m0, 0, dq);
  }

  // kDqInStage: the last step's stage, once its dQ reductions have read it
  // (called after step it's products are issued, which the wait overlaps).
  __device__ __forceinline__ void release_last_stage(int it) const {
    if constexpr (Cfg::kDqInStage && !kDqWarp) {
      if (th.ct == 0 && it > 0) {
        tma_store_wait_read();
        mbar_arrive(sm.ring.empty(sm.ring.stage(it - 1)));
      }
    }
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
