// Decode attention on the host: the CPU counterpart of the CUDA split-K
// kernels, with the same contract (contract/decode.h): paged or
// contiguous caches, clamped lengths, masked bad pages, rows that see no key
// give zeros.
#pragma once

#include "contract/decode.h"
#include "cpu/parallel.h"

namespace jaxcraft {

// Writes p.o [B, Tq, N, H]. Split partials live in host memory it allocates
// itself; p.partial_o / p.partial_lse are not used.
void decode_attention_cpu(const DecodeParams& p, const TaskRunner* runner = nullptr);

}  // namespace jaxcraft
