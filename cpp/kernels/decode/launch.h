// Host entry points of the CUDA decode-attention kernels (sm_80+).
#pragma once
#include <cuda_runtime.h>

#include "contract/decode.h"

namespace jaxcraft {

// Writes p.o, using p.partial_o / p.partial_lse as split scratch (at most
// p.max_splits splits). Never allocates or synchronizes; returns the launch
// error (cudaGetLastError), or cudaErrorInvalidValue for inputs that
// decode_attention_cuda_unsupported (contract/decode.h) rejects.
cudaError_t launch_decode_attention(const DecodeParams& p, cudaStream_t stream);

}  // namespace jaxcraft
