#pragma once
#include "contract/activations.h"
#include "cpu/parallel.h"

namespace jaxcraft {

// `runner`: where to spread rows (null: std::thread).
void activation_fwd_cpu(const ActivationFwdParams& p, const TaskRunner* runner = nullptr);
void activation_bwd_cpu(const ActivationBwdParams& p, const TaskRunner* runner = nullptr);

}  // namespace jaxcraft
