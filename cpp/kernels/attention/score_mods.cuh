// Per-element changes to the logits and probabilities (contract/attention.h:
// AttentionScores): logit soft cap and dropout. Shared by the
// portable and the Hopper kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "math/fast_math.h"
#include "math/philox.h"

namespace jaxcraft {
namespace attn {

// cap * tanh(x / cap). tanhf, not tanh.approx: the approximation's 2^-11
// relative error would show in float32-accumulated logits.
__device__ __forceinline__ float soft_cap(float x, float cap) { return cap * tanhf(x / cap); }

// cap * tanh(x / cap) as cap - 2 cap / (1 + e^(2 x / cap)): one ex2.approx
// and one rcp.approx (each ~2^-22 relative), so the absolute error is about
// cap * 2^-21 (tanh.approx's 2^-11 relative error would show). Saturates
// cleanly: e = inf gives cap, e = 0 gives -cap. The portable and the Hopper
// kernels, forward and backward, all use this one function, so recomputed
// logits match the ones the forward's lse was taken over.
__device__ __forceinline__ float soft_cap_fast(float x, float cap, float inv_cap) {
  const float e = fast_exp2(x * (2.f * kLog2e) * inv_cap);
  return fmaf(-2.f * cap, fast_rcp(1.f + e), cap);
}

// d(capped)/dx from the capped value itself: 1 - tanh^2 = 1 - (capped / cap)^2.
__device__ __forceinline__ float soft_cap_grad(float capped, float cap) {
  const float t = capped / cap;
  return 1.f - t * t;
}

// The four dropout words of keys 4 j4 .. 4 j4 + 3 of row i, head n, batch b;
// key 4 j4 + e is kept when word e >= sc.dropout_threshold.
__device__ __forceinline__ Philox4 dropout_words(const ScoreArgs& sc, int b, int n, int i, int j4) {
  const uint32_t key[2] = {sc.dropout_key[0], sc.dropout_key[1]};
  return sc.dropout_broadcast ? dropout_block(key, 0, 0, i, j4) : dropout_block(key, b, n, i, j4);
}

}  // namespace attn
}  // namespace jaxcraft
