// What a Hopper backward consumer thread knows of its place in the CTA's
// key tile and of the ring step it is on, shared by the step's parts and
// the epilogue.
#pragma once
#include "kernels/attention/sm90/bwd_config.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

// Consumer warpgroup c (keys [n0 + 64 c, n0 + 64 c + 64); kSplitD: all
// keys, half of the columns), thread ct of it, warp w, and its C-fragment
// rows g (+ 8) and column pair t.
template <class Cfg, int kFeat>
struct BwdConsumerThread {
  int c, ct, lane, w, g, t;
  int wg_key0;
  int acc_cb0;      // first column block of dK/dV
  int thread_key0;  // tile rows of this thread: + 0 and + 8
  // S^T columns: queries [wg_q0, wg_q0 + kSN) of the step's tile; fragment
  // column j holds queries q_frag0 + 8 j (+ 1).
  int wg_q0;
  int q_frag0;
  // A warpgroup's dQ column blocks per step: [cb_lo, cb_hi) (BwdDq::cb_hi).
  int cb_lo;

  // At head dim 64 (wg not broadcast: the kernel says why) the feature
  // instances broadcast c (SASS: R2UR 92-197 -> 17-73, no spill); the plain
  // one would serialize its wgmmas, as with wg.
  __device__ __forceinline__ BwdConsumerThread(int tid, int wg, int lane)
      : c(Cfg::kHeadDim == 64 && kFeat != kPlain ? __shfl_sync(0xffffffffu, wg - 1, 0)
                                                  : wg - 1),
        ct(tid % kWarpgroupThreads),
        lane(lane),
        w(ct / kWarpSize),
        g(lane / 4),
        t(lane % 4),
        wg_key0(Cfg::kSplitD ? 0 : c * kWgmmaM),
        acc_cb0(Cfg::kSplitD ? c * (Cfg::kAccCols / kSwizzleCols) : 0),
        thread_key0(wg_key0 + w * 16 + g),
        wg_q0(Cfg::kSplitD ? c * Cfg::kSN : 0),
        q_frag0(wg_q0 + 2 * t),
        cb_lo(Cfg::kSplitD ? acc_cb0
              : Cfg::kDqByRows || Cfg::kDqByKeys || Cfg::kColBlocks == 1 ? 0
                                                                         : c) {}
};

// Ring step it (stage s): query head h of the group, query tile mt (first
// query m0).
struct BwdStep {
  int it, s, h, mt, m0;
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
