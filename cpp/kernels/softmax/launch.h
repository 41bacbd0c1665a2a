#pragma once
#include <cuda_runtime.h>

#include "contract/softmax.h"

namespace jaxcraft {

// Both return the launch error (cudaGetLastError), never synchronize.
cudaError_t launch_softmax_fwd(const SoftmaxFwdParams& p, cudaStream_t stream);
cudaError_t launch_softmax_bwd(const SoftmaxBwdParams& p, cudaStream_t stream);

}  // namespace jaxcraft
