// BwdProducer: the Hopper backward's producer warpgroup. Warp 0 issues the
// TMA copies of K and V (once) and of each step's Q, dO (and kBias: bias)
// tiles into the ring, and writes the step's lse, delta (and in the feature
// instances the query segment ids) into the stage; with dq_warp, warp 1
// issues the consumers' dQ reductions.
#pragma once
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/sm90/bwd_args.h"
#include "kernels/attention/sm90/bwd_config.cuh"
#include "kernels/attention/sm90/bwd_scheduler.cuh"
#include "kernels/attention/sm90/bwd_smem.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/softmax.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <class Cfg, int kFeat>
struct BwdProducer {
  static constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kCB = Cfg::kColBlocks;
  using Smem = BwdSmem<Cfg, kFeat>;

  // Warp 1, with dq_warp: per step, each consumer's dQ columns in turn:
  // wait until they are written (dQ full), add them into dq_accum, and once
  // the reductions have read them hand the tile back (dQ empty; not after
  // the last step, where no consumer waits for it); with kDqInStage also
  // arrive for the consumer's thread 0 on the stage's empty barrier.
  static __device__ __forceinline__ void reduce_dq(const BwdSm90Args& p, const Smem& sm,
                                                   const BwdWork& wk, int lane) {
    const int kv_head = wk.kv_head, b = wk.b, group = wk.group;
    const int mt_begin = wk.mt_begin, mt_end = wk.mt_end;
    const int last_h = (kv_head + 1) * group - 1;
    int it = 0;
    for (int h = kv_head * group; h <= last_h; ++h)
      for (int mt = mt_begin; mt < mt_end; ++mt, ++it)
        for (int c = 0; c < Cfg::kConsumers; ++c) {
          named_barrier_sync(Cfg::kDqFullBarrier + c, Cfg::kDqBarrierThreads);
          if (lane == 0) {
            const uint32_t tile = Cfg::kDqInStage ? sm.q_tile(sm.ring.stage(it)) + c * Cfg::kQBytes
                                                  : sm.dq_sa + c * Cfg::kDqBytes;
#pragma unroll
            for (int blk = 0; blk < Cfg::kDqCols / kSwizzleCols; ++blk)
#pragma unroll
              for (int box = 0; box < kSwizzleCols / Cfg::kDqBoxCols; ++box)
                tma_reduce_add_4d(&p.dq_map,
                                  tile + blk * Cfg::kDqBlockBytes +
                                      box * col_block_bytes<Cfg::kDqRows>(),
                                  c * Cfg::kDqCols + blk * kSwizzleCols + box * Cfg::kDqBoxCols,
                                  h, mt * kBM, b);
            tma_store_commit_and_wait();
            if constexpr (Cfg::kDqInStage) mbar_arrive(sm.ring.empty(sm.ring.stage(it)));
          }
          __syncwarp();
          if (h < last_h || mt < mt_end - 1)
            named_barrier_arrive(Cfg::kDqEmptyBarrier + c, Cfg::kDqBarrierThreads);
        }
  }

  // Warp 0: K and V once, then per step (query head h of the group, query
  // tile mt) Q, dO (kBias: the bias tile) by lane 0, and lse, delta and the
  // query segment ids by the whole warp.
  static __device__ __forceinline__ void load(const BwdSm90Args& p, const Smem& sm,
                                              const BwdWork& wk, int lane) {
    const BwdArgs& a = p.a;
    const ShapeArgs& sh = a.shape;
    const int n0 = wk.n0, kv_head = wk.kv_head, b = wk.b, group = wk.group;
    const int mt_begin = wk.mt_begin, mt_end = wk.mt_end;
    const SeqLens lens = wk.lens;
    const auto& ring = sm.ring;
    if (lane == 0) {
      mbar_arrive_expect_tx(ring.once(), 2 * Cfg::kKVBytes);
#pragma unroll
      for (int cb = 0; cb < kCB; ++cb) {
        tma_load_4d(sm.k_sa + cb * col_block_bytes<kBN>(), &p.k_map, ring.once(), cb * kSwizzleCols,
                    kv_head, n0, b);
        tma_load_4d(sm.v_sa + cb * col_block_bytes<kBN>(), &p.v_map, ring.once(), cb * kSwizzleCols,
                    kv_head, n0, b);
      }
    }
    int it = 0;
    for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      const int64_t row_base = (int64_t(b) * sh.num_heads + h) * sh.seqlen_q;
      for (int mt = mt_begin; mt < mt_end; ++mt, ++it) {
        const int s = ring.stage(it);
        ring.wait_free(it);
        if (lane == 0) {
          mbar_arrive_expect_tx(ring.full(s),
                                2 * Cfg::kQBytes + (kFeat == kBias ? sm.bias_tile_bytes : 0));
#pragma unroll
          for (int cb = 0; cb < kCB; ++cb) {
            tma_load_4d(sm.q_tile(s) + cb * col_block_bytes<kBM>(), &p.q_map, ring.full(s),
                        cb * kSwizzleCols, h, mt * kBM, b);
            tma_load_4d(sm.do_tile(s) + cb * col_block_bytes<kBM>(), &p.do_map, ring.full(s),
                        cb * kSwizzleCols, h, mt * kBM, b);
          }
          if constexpr (kFeat == kBias)  // queries mt kBM.., keys n0..
            load_bias_tile<kBM, kBN>(sm.bias_tile(s), &p.bias_map, ring.full(s), a.scores, n0,
                                     mt * kBM, h, b);
        }
        // Queries past q_len (or with no visible key: lse = -inf) get an
        // exponent offset of +inf, so their P, and with it their dS, is 0.
        [[maybe_unused]] int id_lo = INT_MAX, id_hi = INT_MIN;
#pragma unroll
        for (int i = lane; i < kBM; i += kWarpSize) {
          const int q = mt * kBM + i;
          const float l = q < lens.q_len ? a.lse[row_base + q] : -INFINITY;
          const float dl = q < sh.seqlen_q ? a.delta[row_base + q] : 0.f;
          const float l2 = l == -INFINITY ? INFINITY : l * kLog2e;
          asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.lse_vec(s) + 4 * i), "f"(l2)
                       : "memory");
          asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sm.delta_vec(s) + 4 * i), "f"(dl)
                       : "memory");
          if constexpr (kFeat != kPlain) {
            // Query segment ids (queries past T read query T - 1: their P is 0).
            if (a.mask.q_segment_ids != nullptr) {
              const int id =
                  a.mask.q_segment_ids[int64_t(b) * sh.seqlen_q + min(q, sh.seqlen_q - 1)];
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sm.qid_vec(s) + 4 * i), "r"(id)
                           : "memory");
              id_lo = min(id_lo, id);
              id_hi = max(id_hi, id);
            }
          }
        }
        if constexpr (kFeat != kPlain) {
          // ... and their range, after the ids.
          if (a.mask.q_segment_ids != nullptr) {
            id_lo = warp_min(id_lo);
            id_hi = warp_max(id_hi);
            if (lane == 0) {
              asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n"
                           ::"r"(sm.qid_vec(s) + Cfg::kVecBytes), "r"(id_lo), "r"(id_hi)
                           : "memory");
            }
          }
        }
        mbar_arrive(ring.full(s));
      }
    }
  }

  // The producer warpgroup's part (wg == 0; setmaxnreg: BwdConfig; its
  // other warps leave at once); returns whether this thread belongs to it.
  // The test of wg is here, so that the call uses wg before the roles
  // branch: with the branch in the kernel around the call, nvcc moved the
  // head-dim-64 kernels' wg (not broadcast) into the consumer branch, which
  // changed the plain instance's SASS (spills 24/28 -> 20/20 bytes
  // stored/loaded).
  static __device__ __forceinline__ bool run(const BwdSm90Args& p, const Smem& sm,
                                             const BwdWork& wk, int wg, int tid, int lane) {
    if (wg != 0) return false;
    setmaxnreg_dec<Cfg::producer_regs(kFeat)>();
    if constexpr (Cfg::dq_warp(kFeat)) {
      if (tid / kWarpSize == 1) {
        reduce_dq(p, sm, wk, lane);
        return true;
      }
    }
    if (tid >= kWarpSize) return true;
    load(p, sm, wk, lane);
    return true;
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
