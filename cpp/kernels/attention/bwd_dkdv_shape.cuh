// DkdvShape: the portable dK/dV kernel's tiles, warp grid and shared-memory
// layout; which instances take which shape, and their shared memory.
#pragma once
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_tile.cuh"
#include "kernels/attention/smem_tile.cuh"
#include "kernels/attention/tile_config.h"

namespace jaxcraft {
namespace attn {

// Tile sizes default to tile_config.h; the explicit form exists for tuning.
template <int kHeadDim_, int kWarps_ = attn_tiles(kHeadDim_).dkdv_warps,
          int kBlockM_ = attn_tiles(kHeadDim_).dkdv_block_m,
          int kBlockN_ = attn_tiles(kHeadDim_).dkdv_block_n,
          int kStages_ = attn_tiles(kHeadDim_).dkdv_q_stages>
struct DkdvShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kStride = padded_stride<kHeadDim>();
  static constexpr int kPStride = padded_stride<kBlockM>();
  // Phase A/B: warps = key slabs x parts (query columns in A, head columns in B).
  static constexpr int kKeySlabs = kBlockN / kMmaM;
  static constexpr int kParts = kWarps / kKeySlabs;
  static constexpr int kQCols = kBlockM / kParts;
  static constexpr int kHCols = kHeadDim / kParts;
  // Phase C: warps = query slabs x head-column parts.
  static constexpr int kQSlabs = kBlockM / kMmaM;
  static constexpr int kCParts = kWarps / kQSlabs;
  static constexpr int kCCols = kHeadDim / kCParts;

  // Phase A computes S^T and dP^T in one pass over the head dim (two
  // independent MMA chains per operand load step) unless the dK/dV
  // accumulators are so large that both fp32 score tiles would not fit next
  // to them; then S^T is finished and packed to 16-bit P^T first.
  static constexpr int kAccRegs = 2 * (kHCols / kMmaN) * 4;
  static constexpr int kSplitAccRegs = 128;
  static constexpr bool kSplitScores = kAccRegs >= kSplitAccRegs;

  static constexpr int kKVBytes = tile_bytes<kBlockN, kHeadDim>();
  static constexpr int kQBytes = tile_bytes<kBlockM, kHeadDim>();
  static constexpr int kPBytes = tile_bytes<kBlockN, kBlockM>();
  static constexpr int kRowStatBytes = kBlockM * 4;
  // Per stage: Q, dO, lse * log2(e), delta.
  static constexpr int kStageBytes = 2 * kQBytes + 2 * kRowStatBytes;
  static constexpr int kSmemBytes = 2 * kKVBytes + kStages * kStageBytes + 2 * kPBytes;
  // Two CTAs per SM when the per-thread state (dK/dV, the two fp32 score
  // tiles of phase A, operands and addressing) fits each CTA's half of the
  // register file: left free, the compiler takes ~160 registers for the
  // small tiles and halves the warps that hide the ldmatrix/MMA latency.
  static constexpr int kScoreRegs = 2 * (kQCols / kMmaN) * 4;
  static constexpr int kOverheadRegs = 48;
  static constexpr bool kTwoCtasFit =
      kAccRegs + kScoreRegs + kOverheadRegs <= kRegsPerSm / (2 * kThreads) &&
      2 * (kSmemBytes + kSmemReservedPerCta) <= kSmemPerSmSm80;
  static constexpr int kMinBlocksPerSm = kTwoCtasFit ? 2 : 1;

  static_assert(kWarps % kKeySlabs == 0 && kWarps % kQSlabs == 0, "warp grid");
  static_assert(kQCols % (2 * kMmaN) == 0 && kHCols % (2 * kMmaN) == 0 &&
                    kCCols % (2 * kMmaN) == 0,
                "every warp's column range is a whole number of n-tile pairs");
  static_assert(kStages == 1 || kStages == 2, "Q/dO single or double buffered");
};

// kFeatScores stages each tile's fp32 dS^T in shared memory, transposed to
// [query][key] (dbias rows run along keys), behind the kernel's other tiles.
template <class Sh>
constexpr int dbias_stride() {
  return Sh::kBlockN + 4;  // 16-byte rows; conflict-free fragment stores
}
template <class Sh, int kLevel>
constexpr int dkdv_smem_bytes() {
  return Sh::kSmemBytes + (kLevel == kFeatScores ? Sh::kBlockM * dbias_stride<Sh>() * 4 : 0);
}

// The feature instances' tile shapes. H128's default 128-key tile leaves no
// registers for the score features (they spilled) and no shared memory for
// the dS^T staging tile and staged bias; 64 keys with single-buffered Q/dO
// fit both.
template <int kHeadDim, int kLevel>
struct DkdvLevelShape {
  using type = DkdvShape<kHeadDim>;
};
template <>
struct DkdvLevelShape<128, kFeatScores> {
  using type = DkdvShape<128, 8, 64, 64, 1>;
};

// Shared memory of an instance at most (its tiles, the dS^T staging tile,
// one staged bias + mask block per Q/dO stage): within sm_80's 163 KB.
template <class Sh, int kLevel>
constexpr int dkdv_smem_max_bytes() {
  return dkdv_smem_bytes<Sh, kLevel>() +
         Sh::kStages * elem_stage_max_bytes<Sh::kBlockM, Sh::kBlockN>(kLevel);
}

}  // namespace attn
}  // namespace jaxcraft
