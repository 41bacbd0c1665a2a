// FwdProducer: the Hopper forward's producer warpgroup. Its thread 0 issues
// the TMA copies of each work item's Q and of its K/V tiles into the ring;
// in the feature instances its first warp also copies each key tile's
// segment ids into the stage.
#pragma once
#include <cstdint>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/fwd_args.h"
#include "kernels/attention/sm90/fwd_scheduler.cuh"
#include "kernels/attention/sm90/fwd_smem.cuh"
#include "kernels/attention/sm90/hopper.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <class Cfg, int kFeat>
struct FwdProducer {
  static constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kCB = Cfg::kColBlocks;
  static constexpr int kQBufs = Cfg::kQBufs;
  using Smem = FwdSmem<Cfg>;
  using Scheduler = FwdScheduler<Cfg, kFeat>;

  // Producer thread: Q of the CTA's n-th item into its buffer, once the O
  // stores of the buffer's previous item have read it.
  static __device__ void load_q(const FwdSm90Args& p, const Smem& sm, const Scheduler& sched, int n,
                                const FwdWork& wk, FwdCursor cur) {
    if (n >= kQBufs) mbar_wait(sm.q_empty(n), sm.q_parity(n) ^ 1);
    sched.write_slot(sm, n, cur);
    mbar_arrive_expect_tx(sm.q_full(n), Cfg::kQBytes);
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_load_4d(sm.q_tile(n) + cb * col_block_bytes<kBM>(), &p.q_map, sm.q_full(n), cb * kSwizzleCols,
                  wk.head, wk.m0, wk.b, fwd_q_o_policy<Cfg>());
  }
  // Producer thread, with a tile counter: the cursor past the last unit in
  // the n-th item's slot, so that the consumers leave their loop too.
  static __device__ void send_end(const Smem& sm, const Scheduler& sched, int n, FwdCursor cur) {
    if (!sched.dynamic) return;
    if (n >= kQBufs) mbar_wait(sm.q_empty(n), sm.q_parity(n) ^ 1);
    sched.write_slot(sm, n, cur);
  }

  // Producer thread: key tile nt's K (its barrier also expecting `extra`
  // bytes) and V into the stage of ring use `it`, after the caller's
  // ring.wait_free (the K half with kSplitKV; V then waits for its own).
  static __device__ void load_k(const FwdSm90Args& p, const Smem& sm, int it, int nt, const FwdWork& wk,
                                uint32_t extra) {
    const int s = sm.ring.stage(it);
    mbar_arrive_expect_tx(sm.ring.full(s), (Cfg::kSplitKV ? Cfg::kKVBytes : Cfg::kStageBytes) + extra);
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_load_4d(sm.k_tile(s) + cb * col_block_bytes<kBN>(), &p.k_map, sm.ring.full(s),
                  cb * kSwizzleCols, wk.kv_head, nt * kBN, wk.b);
  }
  static __device__ void load_v(const FwdSm90Args& p, const Smem& sm, int it, int nt, const FwdWork& wk) {
    const int s = sm.ring.stage(it);
    if constexpr (Cfg::kSplitKV) {
      sm.vring.wait_free(it);
      mbar_arrive_expect_tx(sm.vring.full(s), Cfg::kKVBytes);
    }
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_load_4d(sm.v_tile(s) + cb * col_block_bytes<kBN>(), &p.v_map, sm.vring.full(s),
                  cb * kSwizzleCols, wk.kv_head, nt * kBN, wk.b);
  }

  // The plain instance: thread 0 alone.
  static __device__ __forceinline__ void run_plain(const FwdSm90Args& p, const Smem& sm, const Scheduler& sched) {
    prefetch_tensor_map(&p.q_map);
    prefetch_tensor_map(&p.k_map);
    prefetch_tensor_map(&p.v_map);
    int it = 0, n = 0;
    FwdCursor cur{int(blockIdx.x), 0};
    for (; cur.unit < p.units; ++n) {
      const FwdWork wk = sched.work_at(p, cur);
      // Q after this item's first K/V tile, whose stage frees up earlier.
      if (wk.t_begin == wk.t_end) load_q(p, sm, sched, n, wk, cur);
      for (int nt = wk.t_begin; nt < wk.t_end; ++nt, ++it) {
        sm.ring.wait_free(it);
        load_k(p, sm, it, nt, wk, 0);
        load_v(p, sm, it, nt, wk);
        if (nt == wk.t_begin) load_q(p, sm, sched, n, wk, cur);
      }
      cur = sched.next_item(p, cur, wk);
    }
    send_end(sm, sched, n, cur);
  }

  // The feature instances: as run_plain, and the whole first warp copies
  // each key tile's segment ids (keys past S read key S - 1; they are
  // hidden by the length mask) and their range into the stage, so the
  // consumers never wait on a global load.
  static __device__ __forceinline__ void run_features(const FwdSm90Args& p, const Smem& sm, const Scheduler& sched,
                                                      int tid) {
    const FwdArgs& a = p.a;
    const ShapeArgs& sh = a.shape;
    if (tid == 0) {
      prefetch_tensor_map(&p.q_map);
      prefetch_tensor_map(&p.k_map);
      prefetch_tensor_map(&p.v_map);
      if constexpr (kFeat == kBias) prefetch_tensor_map(&p.bias_map);
    }
    int it = 0, n = 0;
    FwdCursor cur{int(blockIdx.x), 0};
    for (; cur.unit < p.units; ++n) {
      const FwdWork wk = sched.work_at(p, cur);
      const int m0 = wk.m0, head = wk.head, b = wk.b;
      const int t_begin = wk.t_begin, t_end = wk.t_end;
      if (tid == 0) load_q(p, sm, sched, n, wk, cur);
      const int32_t* kv_ids = a.mask.q_segment_ids != nullptr
                                  ? a.mask.kv_segment_ids + int64_t(b) * sh.seqlen_k
                                  : nullptr;
      // The ids are loaded one tile ahead, so their latency hides behind
      // the wait for a free stage.
      int v[kBN / kWarpSize];
      auto load_tile_ids = [&](int nt) {
#pragma unroll
        for (int k = 0; k < kBN / kWarpSize; ++k)
          v[k] = __ldg(kv_ids + min(nt * kBN + tid + kWarpSize * k, sh.seqlen_k - 1));
      };
      if (kv_ids != nullptr) load_tile_ids(t_begin);
      for (int nt = t_begin; nt < t_end; ++nt, ++it) {
        const int s = sm.ring.stage(it);
        sm.ring.wait_free(it);
        if (tid == 0) {
          load_k(p, sm, it, nt, wk, kFeat == kBias ? sm.bias_tile_bytes : 0);
          if constexpr (kFeat == kBias)  // rows m0.., keys nt kBN..
            load_bias_tile<kBM, kBN>(sm.bias_tile(s), &p.bias_map, sm.ring.full(s), a.scores, nt * kBN,
                                     m0, head, b);
          load_v(p, sm, it, nt, wk);
        }
        if (kv_ids != nullptr) {
          int lo = v[0], hi = v[0];
#pragma unroll
          for (int k = 0; k < kBN / kWarpSize; ++k) {
            st_shared_b32(sm.ids_vec(s) + 4 * (tid + kWarpSize * k), v[k]);
            lo = min(lo, v[k]);
            hi = max(hi, v[k]);
          }
          lo = warp_min(lo);
          hi = warp_max(hi);
          if (tid == 0) {
            st_shared_b32(sm.ids_vec(s) + 4 * kBN, lo);
            st_shared_b32(sm.ids_vec(s) + 4 * kBN + 4, hi);
          }
          if (nt + 1 < t_end) load_tile_ids(nt + 1);
        }
        mbar_arrive(sm.ring.full(s));
      }
      // The warp's lane 0 takes the next unit, for all of it.
      FwdCursor next{};
      if (tid == 0) next = sched.next_item(p, cur, wk);
      cur = FwdCursor{__shfl_sync(0xffffffffu, next.unit, 0), __shfl_sync(0xffffffffu, next.second, 0)};
    }
    if (tid == 0) send_end(sm, sched, n, cur);
  }

  // The producer warpgroup (setmaxnreg: FwdConfig).
  static __device__ __forceinline__ void run(const FwdSm90Args& p, const Smem& sm, const Scheduler& sched, int tid) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if constexpr (kFeat == kPlain) {
      if (tid == 0) run_plain(p, sm, sched);
    } else if (tid < kWarpSize) {
      run_features(p, sm, sched, tid);
    }
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
