// Kernel-side arguments (32-bit sizes, validated and clamped by the
// launchers) and the per-bucket entry points the instance files define.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "contract/dtype.h"

namespace jaxcraft {
namespace attn {

struct MaskArgs {
  int causal;
  int offset;
  int window_left;   // < 0: unbounded
  int window_right;  // < 0: unbounded
  const int32_t* q_lengths;
  const int32_t* kv_lengths;
  // Segment ids and their tile ranges; a boolean mask with element strides
  // (contract/attention.h: AttentionMask says the layouts). Null when absent.
  const int32_t* q_segment_ids;
  const int32_t* kv_segment_ids;
  const int32_t* segment_key_range;
  const int32_t* segment_query_range;
  const uint8_t* mask;
  long long mask_stride_b, mask_stride_n;
};

// contract/attention.h: AttentionScores, with the dropout threshold and 1 / (1 - rate)
// precomputed. has_dropout == (dropout_key != null).
struct ScoreArgs {
  float softcap;  // <= 0: none
  const void* bias;
  int bias_f32;
  long long bias_stride_b, bias_stride_n;
  const uint32_t* dropout_key;
  uint32_t dropout_threshold;
  float dropout_keep_scale;
  int dropout_broadcast;
};

struct ShapeArgs {
  int batch, seqlen_q, seqlen_k, num_heads, num_kv_heads, head_dim;
};

struct FwdArgs {
  ShapeArgs shape;
  MaskArgs mask;
  ScoreArgs scores;
  float scale;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  // Scratch for persistent Hopper launches (one word, zeroed by the
  // launcher on the stream before each launch): the count of work units
  // handed out, from which each CTA takes its next unit once it is free.
  // Null: each CTA strides through the units in a fixed order.
  uint32_t* tile_counter;
};

struct BwdArgs {
  ShapeArgs shape;
  MaskArgs mask;
  ScoreArgs scores;
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
  void* dbias;      // null: no bias; else written (or accumulated) by the dK/dV kernel
  int dbias_f32;    // dbias dtype: float32, or the inputs' 16-bit dtype (one writer per element)
};

// dbias needs atomics when several (b, n) add into one element: a broadcast
// batch or head axis (stride 0) with more than one batch row or head
// (contract/attention.h: dbias_shared).
__host__ __device__ inline bool dbias_needs_atomics(const ScoreArgs& sc, const ShapeArgs& s) {
  return (sc.bias_stride_b == 0 && s.batch > 1) || (sc.bias_stride_n == 0 && s.num_heads > 1);
}

// Zeroes dbias (bias elements the kernels never reach, and the sum that
// shared elements accumulate into). Each dK/dV launch path calls it unless
// it writes every element itself.
inline cudaError_t zero_dbias(const BwdArgs& a, cudaStream_t stream) {
  if (a.dbias == nullptr) return cudaSuccess;
  const ShapeArgs& s = a.shape;
  const long long elems = (a.scores.bias_stride_b ? s.batch : 1LL) *
                          (a.scores.bias_stride_n ? s.num_heads : 1LL) * s.seqlen_q * s.seqlen_k;
  return cudaMemsetAsync(a.dbias, 0, (a.dbias_f32 ? 4 : 2) * elems, stream);
}

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
