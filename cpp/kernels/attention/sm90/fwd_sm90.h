// Entry points of the Hopper forward kernel (defined in fwd_kernel.cuh,
// instantiated per head-dim bucket in fwd_hdim*.cu).
#pragma once
#include <cuda_runtime.h>

#include "kernels/attention/kernel_args.h"

namespace jaxcraft {
namespace attn {
namespace sm90 {

// True when this build carries the sm_90a kernel and the current device can
// run it.
template <DType kDt, int kHeadDim>
bool fwd_sm90_available();

template <DType kDt, int kHeadDim>
cudaError_t run_fwd_sm90(const FwdArgs& a, cudaStream_t stream);

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
