// FwdConfig: the sizes, register split, shared-memory byte layout and L2
// policy that the Hopper forward derives from a tile configuration
// (tiles.h).
#pragma once
#include <cstdint>

#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/sm90/tiles.h"

namespace jaxcraft {
namespace attn {
namespace sm90 {

// Sizes, register split and shared-memory layout of a forward tile
// configuration (tiles.h).
template <class Tiles>
struct FwdConfig {
  static constexpr bool kBalancedPairs = Tiles::kBalancedPairs;
  static constexpr bool kSumByMma = Tiles::kSumByMma;
  static constexpr bool kHalfTiles = Tiles::kHalfTiles;
  static constexpr bool kStagger = Tiles::kStagger;
  static constexpr bool kSplitKV = Tiles::kSplitKV;
  static constexpr bool kOInStage = Tiles::kOInStage;
  static constexpr bool kOverlap = Tiles::kOverlap;
  static constexpr bool kPersistent = Tiles::kPersistent;
  static constexpr int kQBufs = Tiles::kQBufs;
  static constexpr int kCausalPersistRows = Tiles::kCausalPersistRows;
  static constexpr int kHeadDim = Tiles::kHeadDim;
  // A causal pair's item with fewer keys runs first (see short_first in the
  // kernel). Head dim 128 read only the minimum either way, and short first
  // was 3% slower there at S512 causal; head dim 64 ran 2% slower on every
  // row with it (H200, docs/design.md).
  static constexpr bool kShortFirst = kHeadDim >= 256;
  // A persistent grid takes its units from the tile counter (FwdArgs) at
  // head dim 64, under a causal mask single items longest first: 1.5-3%
  // faster than the fixed stride on full rows up to S4096, 6-7% on causal
  // S2048-S4096. At 128 and 256 (one Q buffer) it was up to 2% (128) and
  // 3% (256) slower at S <= 2048, so they keep the fixed stride and the
  // causal pairs (H100, docs/design.md).
  static constexpr bool kTileCounter = kHeadDim == 64;
  static constexpr int kConsumers = Tiles::kConsumers;
  static constexpr int kBlockM = kConsumers * kWgmmaM;
  static constexpr int kBlockN = Tiles::kBlockN;
  static constexpr int kStages = Tiles::kStages;
  static_assert(!kStagger || (kOverlap && kConsumers == 2 && kOInStage), "stagger: two overlapped warpgroups, O in the stage");
  static constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
  static constexpr int kColBlocks = kHeadDim / kSwizzleCols;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;  // one buffer
  static constexpr int kQAllBytes = kQBufs * kQBytes;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one of K or V
  static constexpr int kStageBytes = 2 * kKVBytes;
  static_assert(!kOInStage || kQBytes <= kStageBytes, "O fits a stage");
  // The ring's barriers (its `once` is buffer 0's Q arrival; with kSplitKV
  // they serve K, and a second ring's serve V), the other Q buffers'
  // arrivals and every Q buffer's release, then each Q buffer's work slot
  // and its two barriers.
  static constexpr int kBarrierBytes =
      (kSplitKV ? 2 : 1) * ring_barrier_bytes(kStages) + 8 * (2 * kQBufs - 1) + 24 * kQBufs;
  // kSumByMma's ones: one wgmma's K depth of rows (16 x 128 bytes, every
  // element 1), after the barriers, 1024-byte aligned like the swizzled
  // tiles (the swizzle permutes within aligned 128-byte rows); each k step's
  // descriptor reaches it.
  static constexpr int kOnesAlign = kSumByMma ? kSwizzleAtomBytes : 16;
  static constexpr int kOnesRel =
      (kQAllBytes + kStages * kStageBytes + kBarrierBytes + kOnesAlign - 1) / kOnesAlign * kOnesAlign;
  static constexpr int kOnesBytes = kSumByMma ? kWgmmaK * kSwizzleRowBytes : 0;
  // + alignment slack: the swizzled tiles need 1024-byte-aligned addresses.
  static constexpr int kSmemBytes = kSwizzleAtomBytes + kOnesRel + kOnesBytes;
  // Feature instances: per ring stage, the key tile's segment ids and their
  // min and max (written by the producer warp), after the ones.
  static constexpr int kIdBytes = kBlockN * 4 + 16;
  static constexpr int kIdsRel = kOnesRel + kOnesBytes;  // from the aligned base
  static constexpr int kFeatSmemBytes = kSwizzleAtomBytes + kIdsRel + kStages * kIdBytes;
  // setmaxnreg: the producer only issues copies (with two consumers 40: its
  // work-item loop spilled at 24 in the feature instances; with three the
  // consumers keep their 160, and the producer's 32 leave the mask instance
  // a 44-byte spill; with four, 640 threads launch at 96 each, and the
  // producer's 24 leave the consumers 112); the consumers hold S, O and P
  // fragments. Totals stay within the SM's 64K registers.
  static constexpr int kProducerRegs = kConsumers == 2 ? 40 : kConsumers == 3 ? 32 : 24;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 232 : kConsumers == 3 ? 160 : 112;
  static_assert(kHeadDim % kSwizzleCols == 0, "head dim is whole 64-column blocks");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared-memory opt-in");
  static_assert(kFeatSmemBytes <= 227 * 1024, "fits the sm_90 shared-memory opt-in");
  // kBias instances: per ring stage, the bias tile (kBlockM x kBlockN, 16-bit
  // or float32), swizzled, after the ids.
  static constexpr int kBiasRel =
      (kIdsRel + kStages * kIdBytes + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr int bias_smem_bytes(bool f32) {
    return kSwizzleAtomBytes + kBiasRel + kStages * kBlockM * kBlockN * (f32 ? 4 : 2);
  }
  static_assert(kProducerRegs * kWarpgroupThreads + kConsumerRegs * kConsumers *
                        kWarpgroupThreads <= 64 * 1024, "register file");
  // kSumByMma in instance kFeat: not with dropout, which zeroes P after its
  // sum is taken. O's columns kHeadDim.. then hold the row sums.
  static constexpr bool sum_by_mma(int feat) { return kSumByMma && feat != kDropout; }
};

#ifdef JAXCRAFT_SM90A_ENABLED
// The L2 priority of the Q loads and O stores. Each is touched once per
// work item, while the item's K/V tiles are read again by its other query
// tiles and by the CTAs on the same head's other items. Evict-first Q and
// O leave L2 to K/V: 1-2% on the H100 at head dims 128 and 256 up to S1024;
// head dim 64 runs 0.5-0.8% slower with them, so it keeps evict-normal.
template <class Cfg>
__device__ uint64_t fwd_q_o_policy() {
  return Cfg::kHeadDim > 64 ? l2_evict_first() : l2_evict_normal();
}
#endif  // JAXCRAFT_SM90A_ENABLED

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
