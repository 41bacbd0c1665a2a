#pragma once
#include "contract/embedding.h"
#include "cpu/parallel.h"

namespace jaxcraft {

// `runner`: where to spread the work (null: std::thread).
void embedding_fwd_cpu(const EmbeddingFwdParams& p, const TaskRunner* runner = nullptr);
void embedding_bwd_cpu(const EmbeddingBwdParams& p, const TaskRunner* runner = nullptr);

}  // namespace jaxcraft
