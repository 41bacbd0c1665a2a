// BwdConfig: the sizes, register split, shared-memory byte layout and named
// barriers that the Hopper backward derives from a tile configuration
// (tiles.h), and the choices that depend on the kernel instance (kFeat).
#pragma once
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/sm90/tiles.h"

namespace jaxcraft {
namespace attn {
namespace sm90 {

// Sizes, register split and shared-memory layout of a backward tile
// configuration (tiles.h).
template <class Tiles>
struct BwdConfig {
  static constexpr bool kDqByKeys = Tiles::kDqByKeys || Tiles::kSplitD;
  static constexpr bool kSplitD = Tiles::kSplitD;
  static constexpr bool kDqTma = Tiles::kDqTma;
  static constexpr int kHeadDim = Tiles::kHeadDim;
  static constexpr int kConsumers = 2;
  static constexpr int kBlockN = kSplitD ? kWgmmaM : kConsumers * kWgmmaM;  // keys per CTA
  static constexpr int kAccCols = kSplitD ? kHeadDim / kConsumers : kHeadDim;  // of dK, dV
  static constexpr int kBlockM = Tiles::kBlockM;  // queries per step
  static constexpr bool kDqByRows = kBlockM == kConsumers * kWgmmaM;
  static constexpr int kDqRows = kDqByRows ? kWgmmaM : kBlockM;  // of a warpgroup's dQ
  static_assert(kBlockM == 64 || (kDqByRows && kHeadDim == kSwizzleCols && !kDqByKeys &&
                                  kDqTma && !Tiles::kDqInStage),
                "128-query steps: head dim 64, dQ by rows through TMA tiles of their own");
  static constexpr int kSN = kSplitD ? kBlockM / kConsumers : kBlockM;  // of S^T per warpgroup
  static constexpr int kStages = Tiles::kStages;
  static constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
  static constexpr int kColBlocks = kHeadDim / kSwizzleCols;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // K or V
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;   // Q or dO
  static constexpr int kVecBytes = kBlockM * 4;            // lse, delta or query segment ids
  static constexpr int kStageBytes = 2 * kQBytes;          // Q and dO
  // Per stage, apart from the swizzled tiles (whose alignment would pad
  // them): lse, delta, and for the feature instances the query segment ids
  // and their range.
  static constexpr int kVecStageBytes = 3 * kVecBytes + 16;
  // dS^T [keys][queries], double-buffered by step; kSplitD: P^T too.
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kDsBuffers = kSplitD ? 4 : 2;
  // kDqTma: per warpgroup, dQ rows x 64 columns in float32, as 32-column
  // (128-byte) swizzled boxes.
  static constexpr int kDqBoxCols = kSwizzleRowBytes / 4;
  static constexpr int kDqBlockBytes = kDqRows * kSwizzleCols * 4;  // one 64-column block
  static constexpr bool kDqInStage = Tiles::kDqInStage;
  static_assert(!kDqInStage || kDqTma, "dQ staged for TMA reductions");
  static_assert(!(kSplitD && kDqTma) || kDqInStage, "kSplitD has no room for dQ tiles");
  // dQ columns per warpgroup and step: kSplitD's half, else one block.
  static constexpr int kDqCols = kSplitD ? kAccCols : kSwizzleCols;
  static_assert(!kDqInStage || kDqCols / kSwizzleCols * kDqBlockBytes <=
                                   (kColBlocks == 1 ? 2 : 1) * kQBytes,
                "a warpgroup's dQ columns fit its Q or dO tile (one block: both)");
  static constexpr int kDqBytes = kDqTma && !kDqInStage ? kDqBlockBytes : 0;
  // One dQ column block per warpgroup and step in tiles of its own (head
  // dim 128): warp 1 of the producer warpgroup issues their reductions (dQ
  // full / empty barriers, in the kernel), so that no consumer waits on the
  // TMA unit. H100, plain instance alone: 1-7% faster (S8192 causal 2348 ->
  // 2187 us). Not at head dim 64 (its 128-query steps' tiles by rows): the
  // plain instance's spills grew from 28 to 52 bytes and it ran 2-4% slower.
  // Head dim 256 (kSplitD: dQ staged in the ring stage) likewise, warp 1
  // then releasing the stage: 1-8% faster (H100; S16384 causal 6738 ->
  // 6210 us).
  static constexpr bool kDqWarp =
      kDqTma && (kDqInStage ? kSplitD
                            : kDqBytes > 0 && !kDqByKeys && !kDqByRows && kColBlocks == kConsumers);
  // kDqByRows: each dS^T buffer's full and empty mbarriers (the kernel's ds_full).
  static constexpr int kDsBarrierBytes = kDqByRows ? 8 * 2 * kDsBuffers : 0;
  static constexpr int kSmemBytes = kSwizzleAtomBytes + 2 * kKVBytes + kStages * kStageBytes +
                                    kDsBuffers * kDsBytes + kConsumers * kDqBytes +
                                    kStages * kVecStageBytes + ring_barrier_bytes(kStages) +
                                    kDsBarrierBytes;
  // The consumers hold S^T and dP^T plus dK, dV (split-D: half of them).
  // With 232 the plain head-dim-128 instance spilled 40 bytes, reloaded
  // every step (11 LDL in the step loop's SASS); with 240 (the producer at
  // 24, as in the kScores instances) it spills none. Head dim 64 keeps
  // 40 / 232: at 240 its 128-query steps spill more, not less (48 bytes
  // reloaded against 32).
  static constexpr bool kWideConsumers = kSplitD || kHeadDim != 64;
  static constexpr int kProducerRegs = kWideConsumers ? 24 : 40;
  static constexpr int kConsumerRegs = kWideConsumers ? 240 : 232;
  // kScores and up: their consumers need every register they can get (the
  // fused P^T / dS^T pass); the producer warp copes with 24.
  static constexpr int kScoreProducerRegs = 24;
  static constexpr int kScoreConsumerRegs = 240;
  // Lanes of the producer warp that write lse/delta and arrive, plus the
  // arrive that carries the TMA byte count.
  static constexpr int kFullArrivals = kWarpSize + 1;
  static_assert(kDqByKeys || kColBlocks == kConsumers || kColBlocks == 1,
                "dQ split by columns: one block each, or one block taken in turns");
  static_assert(!kDqTma || !kDqByKeys || kSplitD,
                "TMA dQ: one 64-column block per warpgroup and step, or kSplitD's halves");
  static_assert(kAccCols % kSwizzleCols == 0, "dK/dV halves are whole column blocks");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared-memory opt-in");
  // kBias instances: per ring stage, the bias tile (kBlockM queries x
  // kBlockN keys, 16-bit or float32, swizzled) before the barriers.
  static constexpr int bias_smem_bytes(bool f32) {
    return kSmemBytes + kStages * kBlockM * kBlockN * (f32 ? 4 : 2);
  }
  static_assert(kScoreProducerRegs * kWarpgroupThreads + kScoreConsumerRegs * kConsumers *
                        kWarpgroupThreads <= 64 * 1024, "register file");
  static_assert(kProducerRegs * kWarpgroupThreads + kConsumerRegs * kConsumers *
                        kWarpgroupThreads <= 64 * 1024, "register file");

  static constexpr int kConsumerThreads = kConsumers * kWarpgroupThreads;
  // Named barriers (0 is __syncthreads): kConsumersBarrier for both
  // consumer warpgroups, kWarpgroupBarrier + c for consumer warpgroup c
  // alone, and with dq_warp kDqFullBarrier + c (warpgroup c's dQ tile
  // written) and kDqEmptyBarrier + c (its reductions have read it), between
  // that warpgroup and warp 1 of the producer warpgroup.
  static constexpr int kConsumersBarrier = 1, kWarpgroupBarrier = 2;
  static constexpr int kDqFullBarrier = 4, kDqEmptyBarrier = 6;
  static constexpr int kDqBarrierThreads = kWarpgroupThreads + kWarpSize;
  // 128-query steps: dV waits for dS (dS goes into dpt), since P^T, its
  // 16-bit copy, dP^T and dK/dV held together would need 224 registers.
  static constexpr bool kDvAfterDs = kDqByRows;

  // Soft cap and dropout form P^T and dS^T in one pass after both products
  // (BwdScoreFeatures::score_step); the others, kBias included, form P^T
  // while dP^T runs.
  static constexpr bool fused(int feat) { return feat == kScores || feat == kDropout; }
  // kDqWarp, in the plain instance only: in the feature instances warp 1's
  // loop spilled 24-56 bytes at the producer's 24 registers, and 32 cannot
  // be had (128 x 32 + 256 x 240 exceeds the 168 x 384 the launch holds:
  // the consumers' setmaxnreg.inc never returned).
  static constexpr bool dq_warp(int feat) { return kDqWarp && feat == kPlain; }
  // The producer's and the consumers' setmaxnreg in instance feat.
  static constexpr int producer_regs(int feat) {
    return feat >= kScores ? kScoreProducerRegs : kProducerRegs;
  }
  static constexpr int consumer_regs(int feat) {
    return feat >= kScores ? kScoreConsumerRegs : kConsumerRegs;
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
