// What the Hopper forward's consumer warpgroups know of a work item, shared
// by the mainloop and the epilogue: a thread's place, the item's rows, its
// ring steps and their releases, and the late release of the stage that an
// O store still reads, which spans work items.
#pragma once
#include <cstdint>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/fwd_smem.cuh"
#include "kernels/attention/sm90/hopper.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

// A consumer thread's place: consumer warpgroup c (its query rows:
// FwdItem::wg_row0), thread ct of it, warp w, and its C-fragment
// rows g (+ 8) and column pair t.
struct FwdConsumerThread {
  int c, ct, lane, w, g, t;
  __device__ __forceinline__ FwdConsumerThread(int tid, int wg)
      : c(wg - 1),
        ct(tid % kWarpgroupThreads),
        lane(tid % kWarpSize),
        w(ct / kWarpSize),
        g(lane / 4),
        t(lane % 4) {}
};

// With O in the stage (plain instance), thread 0 of the warpgroup does not
// wait for its O store to read the stage: it releases the stage for all
// its warps in the next item, once that item's first S = Q K^T is issued,
// so the store's read overlaps the next item instead of stalling the
// warpgroup. (The feature instances release by every thread.)
template <class Cfg, int kFeat>
struct FwdLateRelease {
  static constexpr bool kEnabled = kFeat == kPlain && Cfg::kOInStage;
  int stored_stage = -1;  // thread 0: the stage its O store is still reading
  __device__ void release(const FwdSmem<Cfg>& sm) {
    if (kEnabled && stored_stage >= 0) {
      tma_store_wait_read();
      mbar_arrive(sm.ring.empty(stored_stage), 4);  // one per warp, as release_*() count
      if (Cfg::kSplitKV) mbar_arrive(sm.vring.empty(stored_stage), 4);
      stored_stage = -1;
    }
  }
};

// A work item as one consumer thread sees it (the kernel fills it in).
struct FwdItem {
  const int &n, &it0;  // the CTA's n-th item; ring uses before it
  int m0, head, b, rows_valid, row_first, t_begin, t_end;
  SeqLens lens;
  int wg_row0;      // this warpgroup's first tile row
  int thread_row0;  // this thread's rows: + 0 and + 8
};

// The item's ring steps 0 .. n_tiles - 1 once its Q has landed, and their
// releases.
template <class Cfg, int kFeat>
struct FwdItemSteps {
  const int &n, &it0;
  int lane, n_tiles;
  // O in the last stage: once this warp's last S = Q K^T is in, it is
  // done with Q, and that stage is released after the O store has read it.
  bool o_in_stage;

  // The stage of ring step it: its K half (kSplitKV only; the feature
  // instances' segment ids and bias tile ride with K) once the scores are
  // masked, its V half (the whole stage otherwise) once P V has landed.
  __device__ void release_k(const FwdSmem<Cfg>& sm, int it) const {
    if (Cfg::kSplitKV && (kFeat != kPlain || lane == 0)) mbar_arrive(sm.ring.empty(sm.ring.stage(it0 + it)));
  }
  __device__ void release_v(const FwdSmem<Cfg>& sm, int it) const {
    if (kFeat != kPlain || lane == 0) mbar_arrive(sm.vring.empty(sm.ring.stage(it0 + it)));
  }
  __device__ void q_read(const FwdSmem<Cfg>& sm, int it) const {
    if (o_in_stage && it == n_tiles - 1 && lane == 0) mbar_arrive(sm.q_empty(n));
  }
  __device__ bool keep_stage(int it) const { return o_in_stage && it == n_tiles - 1; }
  __device__ void keys_read(const FwdSmem<Cfg>& sm, int it) const {
    if (!keep_stage(it)) release_k(sm, it);
  }
  __device__ void values_read(const FwdSmem<Cfg>& sm, int it) const {
    if (!keep_stage(it)) release_v(sm, it);
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
