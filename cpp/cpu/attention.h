// Flash attention on the host: the CPU counterpart of the CUDA kernels, with
// the same contract (kernels/attention/params.h) and the same blocked
// online-softmax algorithm, so both backends agree on masks, GQA and the
// handling of rows that see no key.
#pragma once

#include "cpu/parallel.h"
#include "kernels/attention/params.h"

namespace jaxcraft {

// Writes p.o [B, T, N, H] (input dtype) and p.lse [B, N, T] (float32).
void attention_fwd_cpu(const AttentionFwdParams& p, const TaskRunner* runner = nullptr);

// Writes p.dq, p.dk, p.dv (input dtype), and p.delta when it is non-null.
// Always deterministic: every output element is reduced by one thread in a
// fixed order, so p.deterministic needs no special path and p.dq_accum is
// not used.
void attention_bwd_cpu(const AttentionBwdParams& p, const TaskRunner* runner = nullptr);

}  // namespace jaxcraft
