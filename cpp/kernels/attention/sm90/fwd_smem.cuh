// FwdSmem: the shared-memory addresses of the Hopper forward (the byte
// layout is FwdConfig's): the Q buffers, the K/V ring with its barriers, the
// Q buffers' barriers and work slots, and the feature instances' segment ids
// and bias tiles.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/fwd_config.cuh"
#include "kernels/attention/sm90/hopper.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <class Cfg>
struct FwdSmem {
  static constexpr int kStages = Cfg::kStages, kQBufs = Cfg::kQBufs;
  using Ring = RingBarriers<kStages>;

  uint32_t q_sa;   // the Q buffers, then the K/V ring's stages
  uint32_t kv_sa;
  Ring ring;
  // V's barriers: a ring of their own with kSplitKV, else the same as K's.
  Ring vring;
  // This CTA's n-th work item uses Q buffer n % kQBufs for the (n /
  // kQBufs)-th time. q_full: the TMA bytes' arrival; q_empty: the release
  // for a later item, one arrive per consumer warpgroup once its O store
  // has read its rows of the buffer (with O in the stage: one per consumer
  // warp once its last S = Q K^T is in).
  uint32_t q_bars;
  uint32_t ones_sa;  // kSumByMma's block of ones
  // Feature instances: stage s's key segment ids at ids_vec(s), their min
  // and max at ids_vec(s) + 4 kBN.
  uint32_t ids_sa;
  int bias_tile_bytes;  // kBias: one stage's bias tile

  __device__ __forceinline__ FwdSmem(const void* smem_raw, bool bias_f32)
      : q_sa(swizzle_aligned(smem_raw)),
        kv_sa(q_sa + Cfg::kQAllBytes),
        ring{kv_sa + kStages * Cfg::kStageBytes},
        vring{ring.base + (Cfg::kSplitKV ? Ring::kBytes : 0)},
        q_bars(vring.base + Ring::kBytes),
        ones_sa(q_sa + Cfg::kOnesRel),
        ids_sa(q_sa + Cfg::kIdsRel),
        bias_tile_bytes(Cfg::kBlockM * Cfg::kBlockN * (bias_f32 ? 4 : 2)) {}

  __device__ uint32_t q_tile(int n) const { return q_sa + (n % kQBufs) * Cfg::kQBytes; }
  __device__ uint32_t q_full(int n) const {
    return n % kQBufs == 0 ? ring.once() : q_bars + 8 * (kQBufs + n % kQBufs - 1);
  }
  __device__ uint32_t q_empty(int n) const { return q_bars + 8 * (n % kQBufs); }
  static __device__ uint32_t q_parity(int n) { return uint32_t(n / kQBufs) & 1; }
  // With a tile counter the producer writes the n-th item's cursor into
  // q_slot(n) as it starts the item's Q load and arrives on slot_full(n);
  // the consumers decode the item while Q is on its way, each consumer
  // warp arriving on slot_empty(n) once it has read the slot.
  __device__ uint32_t q_slot(int n) const {
    return q_bars + 8 * (2 * kQBufs - 1) + 8 * (n % kQBufs);
  }
  __device__ uint32_t slot_full(int n) const {
    return q_bars + 8 * (3 * kQBufs - 1) + 8 * (n % kQBufs);
  }
  __device__ uint32_t slot_empty(int n) const {
    return q_bars + 8 * (4 * kQBufs - 1) + 8 * (n % kQBufs);
  }
  __device__ uint32_t k_tile(int s) const { return kv_sa + s * Cfg::kStageBytes; }
  __device__ uint32_t v_tile(int s) const {
    return kv_sa + s * Cfg::kStageBytes + Cfg::kKVBytes;
  }
  __device__ uint32_t ids_vec(int s) const { return ids_sa + s * Cfg::kIdBytes; }
  __device__ uint32_t bias_tile(int s) const {
    return q_sa + Cfg::kBiasRel + s * bias_tile_bytes;
  }

  // Thread tid's part in setting up the barriers and (kSumByMma) the ones,
  // before the CTA-wide barrier that publishes them.
  // full: the TMA bytes' arrival (plus, with features, one per producer
  // lane, each after writing its ids); empty: one arrival per consumer warp.
  // Empty arrivals: one per consumer warp; in the feature instances one per
  // consumer thread, as each reads the stage's segment ids with ordinary
  // loads and only its own arrive orders them before the producer's rewrite
  // (compute-sanitizer racecheck flagged the lane-0 arrive there).
  template <DType kDt, int kFeat>
  __device__ __forceinline__ void init(int tid, int o_in_stage) const {
    if (tid == 0) {
      for (int qb = 0; qb < kQBufs; ++qb) {
        mbar_init(q_empty(qb), Cfg::kConsumers * (o_in_stage ? 4 : 1));
        mbar_init(slot_full(qb), 1);
        mbar_init(slot_empty(qb), Cfg::kConsumers * 4);
        if (qb > 0) mbar_init(q_full(qb), 1);
      }
      const int empty_arrivals = Cfg::kConsumers * (kFeat == kPlain ? 4 : kWarpgroupThreads);
      ring.init(kFeat == kPlain ? 1 : 1 + kWarpSize, empty_arrivals);
      if (Cfg::kSplitKV) vring.init(1, empty_arrivals);
    }
    if constexpr (Cfg::sum_by_mma(kFeat)) {
      const uint32_t one2 = kDt == DType::kBF16 ? 0x3F803F80u : 0x3C003C00u;  // two 16-bit 1.0
      for (int i = tid; i < Cfg::kOnesBytes / 4; i += Cfg::kThreads) st_shared_b32(ones_sa + 4 * i, one2);
      fence_proxy_async();  // the wgmma reads them through the async proxy
    }
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
