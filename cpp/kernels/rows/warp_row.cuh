// Rows held in registers by groups of lanes (a part of a warp, one to eight
// warps, or a cluster of one-row blocks), shared by the softmax and norm
// warp kernels: which vectors a lane holds, float32 views of 16-bit values
// held packed, and the reductions over a row's lanes, warps and CTAs.
#pragma once
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>

#include "kernels/norm/norm_common.cuh"
#include "kernels/norm/norm_row_sum.cuh"

namespace jaxcraft {
namespace rows {

using norm::kWarp;
using norm::Vec;

// Elements 2k and 2k + 1 of a vector as float32, converted afresh at every
// call: `asm volatile` is never merged with an earlier conversion, so the
// compiler cannot keep the row's float32 copy alive across the reductions
// (with the plain conversions the bf16 warp kernel took 160 registers).
__device__ __forceinline__ float2 unpack_pair(uint32_t w, __nv_bfloat16) {
  uint32_t lo, hi;
  asm volatile("{\n\tshl.b32 %0, %2, 16;\n\tand.b32 %1, %2, 0xffff0000;\n\t}" : "=r"(lo), "=r"(hi) : "r"(w));
  return make_float2(__uint_as_float(lo), __uint_as_float(hi));
}
__device__ __forceinline__ float2 unpack_pair(uint32_t w, __half) {
  float lo, hi;
  asm volatile("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
               : "=f"(lo), "=f"(hi)
               : "r"(w));
  return make_float2(lo, hi);
}

template <typename T>
__device__ __forceinline__ float2 element_pair(const Vec<T>& v, int k) {
  if constexpr (sizeof(T) == sizeof(float))
    return make_float2(v.v[2 * k], v.v[2 * k + 1]);
  else
    return unpack_pair(reinterpret_cast<const uint32_t*>(v.v)[k], T{});
}

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static __device__ float identity() { return -CUDART_INF_F; }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
  static __device__ float identity() { return 0.f; }
};

// op over lanes 0..kLanes-1 of the warp (a power of two), returned in every
// lane: a butterfly in which each pair of lanes computes op(a, b) and
// op(b, a), the same bits for max and sum, then lane 0's value.
template <int kLanes, class Op>
__device__ __forceinline__ float warp_allreduce(float v, Op op) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if constexpr (kLanes < kWarp) v = __shfl_sync(0xffffffffu, v, 0);
  return v;
}

// op over each aligned group of kLanes lanes (a power of two up to a warp),
// returned in every lane of the group: the butterfly alone, the same bits in
// each lane of a group (op(a, b) and op(b, a) agree for max and sum).
template <int kLanes, class Op>
__device__ __forceinline__ float lanes_allreduce(float v, Op op) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Rows of kLanes threads (1 to 32 lanes, or one to eight warps) in a kBlock-thread block: the
// group g of the block takes row blockIdx.x kBlock / kLanes + g, and its
// lane l (0..kLanes-1) vectors l, l + kLanes, ..., so each load instruction
// of a warp reads 512 consecutive bytes. With kSplit > 1 (clusters of
// kSplit one-row blocks) the row is cluster blockIdx.x / kSplit, and the
// lanes run on over the cluster's CTAs in rank order.
template <typename T, int kBlock, int kLanes = kWarp, int kSplit = 1>
struct WarpRow {
  static_assert(kSplit == 1 || kLanes == kBlock, "a cluster splits one-row blocks");
  static constexpr int kN = Vec<T>::kN;
  static constexpr int kRowLanes = kLanes * kSplit;
  static constexpr int kStride = kRowLanes * kN;  // elements from one of a lane's vectors to the next
  int64_t row;
  int lane, vectors;
  __device__ WarpRow(int64_t cols)
      : row(kSplit > 1 ? int64_t(blockIdx.x / kSplit) : int64_t(blockIdx.x) * (kBlock / kLanes) + threadIdx.x / kLanes),
        lane(kSplit > 1 ? int(blockIdx.x % kSplit) * kBlock + int(threadIdx.x) : int(threadIdx.x % kLanes)),
        vectors(static_cast<int>(cols / kN)) {}
  __device__ int64_t first(int64_t cols) const { return row * cols + lane * kN; }  // vector 0's element
  __device__ bool owns(int i) const { return lane + kRowLanes * i < vectors; }
  // f(i) for every vector i this lane holds.
  template <int kVecs, class F>
  __device__ __forceinline__ void for_owned(F f) const {
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
      if (owns(i)) f(i);
  }
};

// f(k) for each element pair k of a vector of T.
template <typename T, class F>
__device__ __forceinline__ void for_pairs(F f) {
#pragma unroll
  for (int k = 0; k < Vec<T>::kN / 2; ++k) f(k);
}

// Publishes this warp's value in slots[warp] (one slot per warp of the
// block) and waits for the row's other kWarps - 1 warps (named barrier 1 +
// the row's group in the block); returns the row's first slot.
template <int kWarps, typename V>
__device__ __forceinline__ const V* share_row_warps(V v, V* slots) {
  const int warp = threadIdx.x / kWarp;
  if (threadIdx.x % kWarp == 0) slots[warp] = v;
  asm volatile("bar.sync %0, %1;" ::"r"(1 + warp / kWarps), "r"(kWarps * kWarp) : "memory");
  return slots + (warp - warp % kWarps);
}

// Cluster kernels (kSplit > 1) arrive at the cluster barrier as they start
// and wait before their first remote store (share_cluster): every peer must
// have started by then, and the row's loads hide the wait.
template <int kSplit>
__device__ __forceinline__ void arrive_cluster_started() {
#if JAXCRAFT_NORM_HAS_CLUSTERS
  if constexpr (kSplit > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}

// Threads 0..kSplit-1 push the CTA's value into slot `rank` of every CTA's
// `cta_slots` (sm_90 clusters of one-row blocks), and every CTA waits at the
// cluster barrier, after which its slots hold the kSplit values. No CTA
// touches a peer after that barrier.
template <int kSplit, typename V>
__device__ __forceinline__ void share_cluster(V v, V* cta_slots) {
#if JAXCRAFT_NORM_HAS_CLUSTERS
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  if (threadIdx.x < kSplit)
    *cooperative_groups::this_cluster().map_shared_rank(cta_slots + norm::cluster_rank<kSplit>(),
                                                        static_cast<int>(threadIdx.x)) = v;
#endif
  norm::cluster_sync();
}

// The row's sum of the warps' sums v over its kWarps warps and kSplit CTAs,
// the same bits in every lane (warp_allreduce).
template <int kWarps, int kSplit>
__device__ __forceinline__ float sum_row(float v, float* slots, float* cta_slots) {
  const int lane = threadIdx.x % kWarp;
  if constexpr (kWarps > 1) {
    const float* row = share_row_warps<kWarps>(v, slots);
    v = warp_allreduce<kWarps>(lane < kWarps ? row[lane] : 0.f, Sum{});
  }
  if constexpr (kSplit > 1) {
    share_cluster<kSplit>(v, cta_slots);
    v = warp_allreduce<kSplit>(lane < kSplit ? cta_slots[lane] : 0.f, Sum{});
  }
  return v;
}

}  // namespace rows
}  // namespace jaxcraft
