// BwdSmem: the shared-memory addresses of the Hopper backward (the byte
// layout is BwdConfig's): K and V, the ring's stages (Q, dO) with their
// barriers, the dS^T (kSplitD: and P^T) buffers, the dQ tiles, the kBias
// instances' bias tiles, and per stage lse, delta and the query segment ids.
#pragma once
#include <cstdint>

#include "kernels/attention/sm90/bwd_config.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <class Cfg, int kFeat>
struct BwdSmem {
  static constexpr int kStages = Cfg::kStages;
  using Ring = RingBarriers<kStages>;

  uint32_t k_sa;
  uint32_t v_sa;
  uint32_t stage_sa;  // the ring's stages: Q, then dO
  uint32_t ds_sa;     // the dS^T buffers, one per step parity
  // kSplitD: step i's P^T at p_sa + (i % 2) kDsBytes.
  uint32_t p_sa;
  // kDqTma: warpgroup c's dQ tile at dq_sa + c kDqBytes.
  uint32_t dq_sa;
  // kBias: stage s's bias tile, between the dS^T buffers and the vectors.
  int bias_tile_bytes;
  uint32_t vec_sa;  // per stage: lse, delta, the query segment ids and their range
  Ring ring;

  __device__ __forceinline__ BwdSmem(const void* smem_raw, bool bias_f32)
      : k_sa(swizzle_aligned(smem_raw)),
        v_sa(k_sa + Cfg::kKVBytes),
        stage_sa(v_sa + Cfg::kKVBytes),
        ds_sa(stage_sa + kStages * Cfg::kStageBytes),
        p_sa(ds_sa + 2 * Cfg::kDsBytes),
        dq_sa(ds_sa + Cfg::kDsBuffers * Cfg::kDsBytes),
        bias_tile_bytes(Cfg::kBlockM * Cfg::kBlockN * (bias_f32 ? 4 : 2)),
        vec_sa(dq_sa + Cfg::kConsumers * Cfg::kDqBytes +
               (kFeat == kBias ? kStages * bias_tile_bytes : 0)),
        ring{vec_sa + kStages * Cfg::kVecStageBytes} {}

  // Step i's dS^T buffer (kSplitD: and its P^T buffer).
  __device__ uint32_t ds_buf(int i) const { return ds_sa + (i % 2) * Cfg::kDsBytes; }
  __device__ uint32_t p_buf(int i) const { return p_sa + (i % 2) * Cfg::kDsBytes; }
  __device__ uint32_t bias_tile(int s) const { return dq_sa + s * bias_tile_bytes; }
  // kDqByRows: warpgroup c's dQ of step i reads both warpgroups' dS^T of
  // step i, and runs in step i + 1 (once that step's dK and dV are done),
  // so that neither warpgroup waits for the other's dS^T at a barrier
  // (5-9% faster than the barrier per step; docs/design.md): dS^T buffer
  // i % 2 is full once every consumer thread has written it, and empty
  // once every consumer thread's dQ product has read it (one arrival per
  // thread, after its own stores or wait).
  __device__ uint32_t ds_full(int buf) const { return ring.base + Ring::kBytes + 8 * buf; }
  __device__ uint32_t ds_empty(int buf) const { return ds_full(Cfg::kDsBuffers + buf); }
  __device__ uint32_t q_tile(int s) const { return stage_sa + s * Cfg::kStageBytes; }
  __device__ uint32_t do_tile(int s) const { return q_tile(s) + Cfg::kQBytes; }
  __device__ uint32_t lse_vec(int s) const { return vec_sa + s * Cfg::kVecStageBytes; }
  __device__ uint32_t delta_vec(int s) const { return lse_vec(s) + Cfg::kVecBytes; }
  __device__ uint32_t qid_vec(int s) const { return delta_vec(s) + Cfg::kVecBytes; }

  // Thread tid's part in setting up the barriers, before the CTA-wide
  // barrier that publishes them.
  __device__ __forceinline__ void init(int tid) const {
    if (tid == 0) {
      if constexpr (Cfg::kDqByRows)
        for (int i = 0; i < 2 * Cfg::kDsBuffers; ++i) mbar_init(ds_full(i), Cfg::kConsumerThreads);
      ring.init(Cfg::kFullArrivals, Cfg::kConsumerThreads);  // fences the inits
    }
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
