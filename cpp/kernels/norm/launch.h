#pragma once
#include <cuda_runtime.h>

#include "contract/norm.h"

namespace jaxcraft {

// Both return the launch error (cudaGetLastError), never synchronize.
cudaError_t launch_norm_fwd(const NormFwdParams& p, cudaStream_t stream);
cudaError_t launch_norm_bwd(const NormBwdParams& p, cudaStream_t stream);

}  // namespace jaxcraft
