// Flash attention on the host: the CPU counterpart of the CUDA kernels, with
// the same contract (contract/attention.h) and the same blocked
// online-softmax algorithm, so both backends agree on masks (including
// segment ids and the boolean mask), GQA, the score changes (soft cap, bias,
// dropout from math/philox.h, drawing the same keep-mask bit for bit) and
// the handling of rows that see no key.
#pragma once

#include "contract/attention.h"
#include "cpu/parallel.h"

namespace jaxcraft {

// Writes p.o [B, T, N, H] (input dtype) and p.lse [B, N, T] (float32).
void attention_fwd_cpu(const AttentionFwdParams& p, const TaskRunner* runner = nullptr);

// Writes p.dq, p.dk, p.dv (input dtype), p.delta when it is non-null, and
// p.dbias when there is a bias and it is non-null (every element written,
// the sum over the (b, n) that share it on broadcast axes).
// Always deterministic: every output element is reduced by one thread in a
// fixed order, so p.deterministic needs no special path and p.dq_accum is
// not used; a broadcast bias costs an extra pass over the bias tiles instead
// of atomics.
void attention_bwd_cpu(const AttentionBwdParams& p, const TaskRunner* runner = nullptr);

}  // namespace jaxcraft
