#pragma once
#include "kernels/norm/params.h"

namespace jaxcraft {

void norm_fwd_cpu(const NormFwdParams& p);
void norm_bwd_cpu(const NormBwdParams& p);

}  // namespace jaxcraft
