// FwdKeyTile: a Hopper forward consumer warpgroup's work on one key tile of
// a work item: S = Q K^T (wgmma, both operands in shared memory), its scale,
// masks and feature transforms, and O += P V (wgmma, P from registers).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/fwd_args.h"
#include "kernels/attention/sm90/fwd_consumer_item.cuh"
#include "kernels/attention/sm90/fwd_score_features.cuh"
#include "kernels/attention/sm90/fwd_smem.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/softmax.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

// The keys a score slab (float[1][keys / 8][4], a C-layout fragment
// reference) holds: kBN, or kBN / 2 for a half tile (kHalfTiles).
template <class Slab>
constexpr int kSlabKeys = 8 * std::extent_v<std::remove_reference_t<Slab>, 1>;

// How a work item's scores are scaled (the same for every item).
struct FwdScale {
  float scale_log2;
  // As in the portable kernel: the exponent folds the scale in and needs it
  // > 0; a zero or negative scale is applied to the raw scores instead.
  bool prescale;
  // kScores and up: a soft cap or bias needs the logits themselves, so the scores
  // become x log2(e) (x the final logit) and the exponent's scale is 1, as
  // when prescaling.
  bool transform;
  float softmax_scale;
};

template <DType kDt, class Cfg, int kFeat>
struct FwdKeyTile {
  static constexpr int kD = Cfg::kHeadDim, kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  static constexpr bool kSumByMma = Cfg::sum_by_mma(kFeat);
  static constexpr int kOTiles = kD / 8 + (kSumByMma ? 1 : 0);
  // Every member refers to a variable of the kernel's consumer loop, as a
  // lambda's captures would (fwd_kernel.cuh says why).
  using Scores = float[1][kBN / 8][4];
  using Probs = uint32_t[kBN / 16][4];
  using OAcc = float[1][kOTiles][4];  // kSumByMma: the row sums in the last columns

  const FwdSm90Args& p;
  const FwdSmem<Cfg>& sm;
  const FwdConsumerThread& th;
  const FwdItem& item;
  OAcc& o;
  const FwdScale& scale;
  const FwdScoreFeatures<kDt, Cfg, kFeat>& features;
  // S = Q K^T for key tile nt (ring step it) into sc, scaled and masked;
  // or, for a half tile, its first kBN / 2 keys into a narrower slab.
  Scores& sc;
  // P (16-bit), the A operand of O += P V.
  Probs& pa;

  template <class Slab>
  __device__ void issue_scores_into(int it, Slab& slab) {
    constexpr int kN = kSlabKeys<Slab>;
    const int s = sm.ring.stage(item.it0 + it);
    const uint64_t q_desc = smem_desc(sm.q_tile(item.n) + item.wg_row0 * kSwizzleRowBytes, 0);
    const uint64_t k_desc = smem_desc(sm.k_tile(s), 0);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kD / kWgmmaK; ++k) {
      const int cb = k / 4, kb = (k % 4) * kWgmmaK * 2;
      wgmma_ss<kDt, kN>(slab[0], desc_plus(q_desc, cb * col_block_bytes<kBM>() + kb),
                        desc_plus(k_desc, cb * col_block_bytes<kBN>() + kb), k > 0);
    }
    wgmma_commit();
  }
  __device__ void issue_scores(int it) { issue_scores_into(it, sc); }

  template <class Slab>
  __device__ void mask_slab_scores(int nt, Slab& slab) {  // after the product's wgmma_wait
    constexpr int kN = kSlabKeys<Slab>;
    static_assert(kN == kBN || kFeat == kPlain, "half tiles: plain instance only");
    const FwdArgs& a = p.a;
    const int m0 = item.m0, wg_row0 = item.wg_row0;
    fence_operands(slab[0]);
    const int n0 = nt * kBN;
    if constexpr (kFeat != kPlain) {
      features.apply(sc, nt, scale.transform);
    } else if (scale.prescale) {
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) slab[0][j][e] *= scale.scale_log2;
    }
    if (tile_is_partial(a.mask, m0 + wg_row0, m0 + wg_row0 + kWgmmaM - 1, n0, n0 + kN - 1,
                        item.lens.kv_len))
      mask_slab(slab[0], a.mask, m0 + item.thread_row0, n0, th.t, item.lens.kv_len);
  }
  __device__ void mask_scores(int nt) { mask_slab_scores(nt, sc); }

  // O += P V for ring step it, P (16-bit) from registers.
  // (keys: the first keys.value of the tile, a std::integral_constant.)
  template <class Keys>
  __device__ void issue_pv_keys(int it, Keys) {
    const int s = sm.ring.stage(item.it0 + it);
    if constexpr (Cfg::kSplitKV) sm.vring.wait_full(item.it0 + it);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Keys::value / kWgmmaK; ++kk) {
      const uint32_t va = sm.v_tile(s) + kk * kWgmmaK * kSwizzleRowBytes;
      // kSumByMma: B's next 64-column block (the leading offset away) is the ones.
      const uint64_t vd = smem_desc(va, kSumByMma ? sm.ones_sa - va : col_block_bytes<kBN>());
      wgmma_rs<kDt, kOTiles * 8>(o[0], pa[kk], vd);
    }
    wgmma_commit();
  }
  __device__ void issue_pv(int it) { issue_pv_keys(it, std::integral_constant<int, kBN>{}); }

  template <class Slab>
  __device__ void pack_slab(Slab& slab) {
    constexpr int kN = kSlabKeys<Slab>;
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) acc_to_a<kDt>(pa[kk], slab[0][2 * kk], slab[0][2 * kk + 1]);
  }
  __device__ void pack_probs() { pack_slab(sc); }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
