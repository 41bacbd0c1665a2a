// Host entry points of the CUDA flash-attention kernels (sm_80+).
#pragma once
#include <cuda_runtime.h>

#include "contract/attention.h"

namespace jaxcraft {

// Writes p.o and p.lse. Returns cudaErrorInvalidValue for inputs the kernels
// do not handle (contract/attention.h: attention_cuda_unsupported) or missing
// pointers.
cudaError_t launch_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream);

// Writes p.dq, p.dk, p.dv and uses p.delta (always) and p.dq_accum (only when
// !p.deterministic) as scratch. Never allocates or synchronizes.
cudaError_t launch_attention_bwd(const AttentionBwdParams& p, cudaStream_t stream);

}  // namespace jaxcraft
