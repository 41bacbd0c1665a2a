#pragma once
#include <cuda_runtime.h>

#include "contract/embedding.h"

namespace jaxcraft {

// Both return the first launch error (cudaGetLastError), never synchronize.
cudaError_t launch_embedding_fwd(const EmbeddingFwdParams& p, cudaStream_t stream);
cudaError_t launch_embedding_bwd(const EmbeddingBwdParams& p, cudaStream_t stream);

}  // namespace jaxcraft
