#pragma once
#include "contract/norm.h"
#include "cpu/parallel.h"

namespace jaxcraft {

// `runner`: where to spread rows (null: std::thread).
void norm_fwd_cpu(const NormFwdParams& p, const TaskRunner* runner = nullptr);
void norm_bwd_cpu(const NormBwdParams& p, const TaskRunner* runner = nullptr);

}  // namespace jaxcraft
