#pragma once
#include "contract/softmax.h"
#include "cpu/parallel.h"

namespace jaxcraft {

// `runner`: where to spread rows (null: std::thread).
void softmax_fwd_cpu(const SoftmaxFwdParams& p, const TaskRunner* runner = nullptr);
void softmax_bwd_cpu(const SoftmaxBwdParams& p, const TaskRunner* runner = nullptr);

}  // namespace jaxcraft
