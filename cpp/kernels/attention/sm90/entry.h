// Entry points of the Hopper kernels (defined in fwd_kernel.cuh and
// bwd_kernel.cuh, instantiated per head-dim bucket in fwd_hdim*.cu and
// bwd_hdim*.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/cuda/device_cache.h"
#include "kernels/attention/kernel_args.h"

namespace jaxcraft {
namespace attn {

// SMs of the current device (1 if the query fails): the size of grids that
// loop over their work (the Hopper forward's persistent grid, the dQ
// conversion's cap).
inline int multiprocessor_count() {
  int sms = 1;
  return ::jaxcraft::multiprocessor_count(&sms) == cudaSuccess ? sms : 1;
}

namespace sm90 {

// JAXCRAFT_ATTENTION_KERNEL=portable keeps Hopper GPUs on the sm_80 kernels
// (to test and benchmark that path where the Hopper one would run).
inline bool disabled_by_env() {
  static const bool off = [] {
    const char* v = std::getenv("JAXCRAFT_ATTENTION_KERNEL");
    return v != nullptr && std::strcmp(v, "portable") == 0;
  }();
  return off;
}

// JAXCRAFT_ATTENTION_PERSISTENT_CTAS=n caps the Hopper forward's persistent
// grid at n CTAs, so that the small shapes of the tests and of
// compute-sanitizer walk several work items per CTA (the paths between
// items: Q buffers, causal pairs, the stage released in the next item).
inline int persistent_grid_size() {
  static const int cap = [] {
    const char* v = std::getenv("JAXCRAFT_ATTENTION_PERSISTENT_CTAS");
    return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 0;
  }();
  return cap > 0 ? cap : multiprocessor_count();
}

// Calls run(std::integral_constant<int, bucket>) for the head-dim buckets
// the Hopper kernels cover; false (the portable kernels take the call) for
// other buckets or when the environment forces the portable path.
template <class Run>
bool for_hopper_bucket(int bucket, Run&& run) {
  if (disabled_by_env()) return false;
  switch (bucket) {
    case 64: return run(std::integral_constant<int, 64>{});
    case 128: return run(std::integral_constant<int, 128>{});
    case 256: return run(std::integral_constant<int, 256>{});
    default: return false;
  }
}

// Which instance of the kernels a launch runs (features.cuh: FeatureLevel):
// 0 plain, 1 with segment ids or the boolean mask, 2 with soft cap or bias
// (the launcher takes 3, the TMA bias, where it can), 4 with dropout.
inline int feature_level(const MaskArgs& m, const ScoreArgs& s) {
  if (s.dropout_key != nullptr) return 4;
  if (s.softcap > 0.f || s.bias != nullptr) return 2;
  return m.q_segment_ids != nullptr || m.mask != nullptr ? 1 : 0;
}
// Segment ids come with their tile ranges (contract/attention.h); the kernels rely on them.
inline bool segment_ids_usable(const MaskArgs& m) {
  return m.q_segment_ids == nullptr ||
         (m.kv_segment_ids != nullptr && m.segment_key_range != nullptr &&
          m.segment_query_range != nullptr);
}
// The attention features the Hopper kernels implement; launches with others
// (contract/attention.h: AttentionMask, AttentionScores) take the portable kernels.
// Implemented: lengths, causal and window masks, segment ids (with their
// tile ranges), the boolean mask, soft cap, bias (with dbias) and dropout.
inline bool fwd_supports(const FwdArgs& a) { return segment_ids_usable(a.mask); }
inline bool bwd_supports(const BwdArgs& a) { return segment_ids_usable(a.mask); }

template <DType kDt, int kHeadDim>
bool fwd_sm90_available();

template <DType kDt, int kHeadDim>
cudaError_t run_fwd_sm90(const FwdArgs& a, cudaStream_t stream);

// dK, dV and the fp32 dQ accumulation (a.dq_accum, zeroed by the caller);
// a.delta must already hold rowsum(dO * O). Head-dim buckets 64, 128 and 256.
template <DType kDt, int kHeadDim>
bool bwd_sm90_available();
template <DType kDt, int kHeadDim>
cudaError_t run_bwd_sm90(const BwdArgs& a, cudaStream_t stream);

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
