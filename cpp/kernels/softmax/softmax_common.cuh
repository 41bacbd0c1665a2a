// Device helpers shared by the softmax kernels (softmax_rows_kernels.cuh,
// softmax_stream_kernels.cuh, softmax_warp_kernel.cuh): float32 math
// whatever the storage type (norm_common.cuh's 16-byte vectors;
// rows::element_pair for values held packed in registers), block and
// cluster reductions, mask bits, and which rows a thread group walks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>

#include "contract/softmax.h"
#include "kernels/norm/norm_common.cuh"
#include "kernels/norm/norm_row_sum.cuh"
#include "kernels/rows/warp_row.cuh"
#include "math/fast_math.h"

namespace jaxcraft {
namespace softmax {

using norm::kVecBytes;
using norm::kWarp;
using norm::load_vec;
using norm::store_vec;
using norm::Vec;
using rows::element_pair;
using rows::Max;
using rows::Sum;
using rows::warp_allreduce;

// The backward's per-vector pieces on values held as stored (element_pair):
// dot plus the vector's sum of y dy, and dx = y (dy - dot).
template <typename T>
__device__ __forceinline__ float add_dot(const Vec<T>& y, const Vec<T>& dy, float dot) {
#pragma unroll
  for (int k = 0; k < Vec<T>::kN / 2; ++k) {
    const float2 a = element_pair(y, k), b = element_pair(dy, k);
    dot += a.x * b.x;
    dot += a.y * b.y;
  }
  return dot;
}
template <typename T>
__device__ __forceinline__ Vec<T> softmax_grad(const Vec<T>& y, const Vec<T>& dy, float dot) {
  Vec<T> dx;
#pragma unroll
  for (int k = 0; k < Vec<T>::kN / 2; ++k) {
    const float2 a = element_pair(y, k), b = element_pair(dy, k);
    dx.v[2 * k] = from_f32<T>(a.x * (b.x - dot));
    dx.v[2 * k + 1] = from_f32<T>(a.y * (b.y - dot));
  }
  return dx;
}

// Narrow rows: one warp per row, this many threads (rows) per block, so a
// block keeps 8 warps of loads in flight.
constexpr int kNarrowBlock = 256;

template <int kGroup>
__host__ __device__ constexpr int block_threads() {
  return kGroup > kNarrowBlock ? kGroup : (kGroup == kWarp ? kNarrowBlock : kGroup);
}

// max or sum over the kGroup threads of a row: a warp by shuffles; a whole
// block (kGroup > 32: one row per block) through `slots` (one per warp). No
// barrier after the read: the caller alternates between slot arrays so that
// a barrier of the next reduction orders this read before their reuse.
template <int kGroup, class Op>
__device__ __forceinline__ float group_reduce(float v, float* slots, Op op) {
  v = warp_allreduce<kWarp>(v, op);
  if constexpr (kGroup > kWarp) {
    constexpr int kWarps = kGroup / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (lane == 0) slots[threadIdx.x / kWarp] = v;
    __syncthreads();
    // Lane w takes warp w's value and every warp reduces them again, where
    // every thread reading all slots cost 32 loads and 31 ops per thread in
    // a 1024-thread block.
    v = warp_allreduce<kWarps>(lane < kWarps ? slots[lane] : Op::identity(), op);
  }
  return v;
}

// (M, S) of the pairs (m_i, s_i) that lanes 0..kLanes-1 hold, s_i a sum of
// exp(x - m_i) (lanes past kLanes hold (-inf, 0)): M = max m_i and S = sum
// s_i exp(m_i - M), the same bits in every lane (warp_allreduce). A pair
// with m_i = -inf adds nothing (exp(m_i - M) is NaN where M = -inf too).
template <int kLanes>
__device__ __forceinline__ float2 merge_pairs(float2 pair) {
  const float m = warp_allreduce<kLanes>(pair.x, Max{});
  const float s = warp_allreduce<kLanes>(pair.x == -CUDART_INF_F ? 0.f : pair.y * expf(pair.x - m), Sum{});
  return make_float2(m, s);
}

// The same, ending with a barrier, so that `scratch` may be reused at once.
template <int kGroup>
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  v = group_reduce<kGroup>(v, scratch, Sum{});
  if constexpr (kGroup > kWarp) __syncthreads();
  return v;
}

// A block's reduced value (the same in every thread), reduced again over the
// kSplit CTAs of its cluster (sm_90+): threads 0..kSplit-1 push it into slot
// `rank` of every CTA's `cta_slots` (remote stores, published by the cluster
// barrier), then every CTA combines the kSplit slots in rank order, so all
// of them get the same bits. Callers alternate two slot arrays, as for
// group_reduce; no CTA touches a peer's memory after its last barrier.
template <int kSplit, class Op>
__device__ __forceinline__ float cluster_reduce(float v, float* cta_slots, Op op) {
  if constexpr (kSplit == 1) {
    return v;
  } else {
#if JAXCRAFT_NORM_HAS_CLUSTERS
    if (threadIdx.x < kSplit)
      *cooperative_groups::this_cluster().map_shared_rank(cta_slots + norm::cluster_rank<kSplit>(),
                                                          static_cast<int>(threadIdx.x)) = v;
#endif
    norm::cluster_sync();
    v = cta_slots[0];
#pragma unroll
    for (int r = 1; r < kSplit; ++r) v = op(v, cta_slots[r]);
    return v;
  }
}

// exp(x - m) for an output stored as T, m_log2e = m log2(e). 16-bit outputs
// keep 8-11 bits, so one FFMA and MUFU.EX2 (ex2.approx, ~2^-22 relative) is
// exact enough, where expf is ~10 instructions: the bf16 forward issued
// instructions in 73% of the cycles at 4096 columns under ncu with expf.
// float32 outputs keep expf. x = m = -inf (a kept all -inf row)
// gives NaN, as jax.
template <typename T>
__device__ __forceinline__ float exp_shifted(float x, float m, float m_log2e) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return expf(x - m);
  } else {
    return fast_exp2(fmaf(x, kLog2e, -m_log2e));
  }
}

// The maximum of the kept values (-inf when none).
template <int kN>
__device__ __forceinline__ float kept_max(const float (&v)[kN], uint32_t keep) {
  float m = -CUDART_INF_F;
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (keep >> j & 1u) m = fmaxf(m, v[j]);
  return m;
}

// The kN mask bits of the vector at element `col` of mask row `mask_row`
// (all set without a mask). kN bytes aligned to kN (rows kernel: whole
// vectors at multiples of kN).
template <int kN>
__device__ __forceinline__ uint32_t mask_bits(const uint8_t* mask_row, int64_t col) {
  if (!mask_row) return (1u << kN) - 1u;
  struct alignas(kN) Bytes {
    uint8_t b[kN];
  };
  const Bytes bytes = *reinterpret_cast<const Bytes*>(mask_row + col);
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < kN; ++j) bits |= uint32_t(bytes.b[j] != 0) << j;
  return bits;
}

// The rows a thread group walks: first_row, first_row + row_stride, ...
// With kSplit > 1 the launch is clusters of kSplit consecutive blocks (one
// row per block), and cluster blockIdx.x / kSplit walks rows as one block.
template <int kGroup, int kSplit = 1>
__device__ __forceinline__ int64_t first_row() {
  return int64_t(blockIdx.x / kSplit) * (block_threads<kGroup>() / kGroup) + threadIdx.x / kGroup;
}

template <int kGroup, int kSplit = 1>
__device__ __forceinline__ int64_t row_stride() {
  return int64_t(gridDim.x / kSplit) * (block_threads<kGroup>() / kGroup);
}

}  // namespace softmax
}  // namespace jaxcraft
