// Entry points of the Hopper kernels (defined in fwd_kernel.cuh and
// bwd_kernel.cuh, instantiated per head-dim bucket in fwd_hdim*.cu and
// bwd_hdim*.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/attention/kernel_args.h"

namespace jaxcraft {
namespace attn {
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

// True when this build carries the sm_90a kernel and the current device can
// run it.
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
