#pragma once
#include <cuda_runtime.h>

#include "contract/activations.h"

namespace jaxcraft {

// Both return the launch error (cudaGetLastError), never synchronize.
cudaError_t launch_activation_fwd(const ActivationFwdParams& p, cudaStream_t stream);
cudaError_t launch_activation_bwd(const ActivationBwdParams& p, cudaStream_t stream);

}  // namespace jaxcraft
