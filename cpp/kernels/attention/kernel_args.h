// Kernel-side arguments (32-bit sizes, validated and clamped by the
// launchers) and the per-bucket entry points the instance files define.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"

namespace jaxcraft {
namespace attn {

struct MaskArgs {
  int causal;
  int offset;
  int window_left;   // < 0: unbounded
  int window_right;  // < 0: unbounded
  const int32_t* q_lengths;
  const int32_t* kv_lengths;
};

struct ShapeArgs {
  int batch, seqlen_q, seqlen_k, num_heads, num_kv_heads, head_dim;
};

struct FwdArgs {
  ShapeArgs shape;
  MaskArgs mask;
  float scale;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
};

struct BwdArgs {
  ShapeArgs shape;
  MaskArgs mask;
  float scale;
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* d_o;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  float* delta;
  float* dq_accum;  // null: dK/dV kernel skips dQ (deterministic path)
};

// Defined in fwd_kernel.cuh / bwd_*.cuh, instantiated per head-dim bucket in
// instances_hdim*.cu so the heavy kernels compile in parallel.
template <DType kDt, int kHeadDim>
cudaError_t run_fwd(const FwdArgs& a, cudaStream_t stream);
template <DType kDt, int kHeadDim>
cudaError_t run_bwd_dkdv(const BwdArgs& a, cudaStream_t stream);
template <DType kDt, int kHeadDim>
cudaError_t run_bwd_dq(const BwdArgs& a, cudaStream_t stream);

}  // namespace attn
}  // namespace jaxcraft
