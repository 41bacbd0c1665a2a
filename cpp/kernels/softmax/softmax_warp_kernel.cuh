// Softmax with one to eight warps (and past one block a cluster of such
// blocks) per row and the row held in registers as stored. Forward:
// unmasked rows of up to 32 x kVecs 16-byte vectors per warp (kVecs <= 32:
// 128 registers of row per lane); backward: y and dy, 8 vectors of each per
// lane. No shared memory and no barrier for a one-warp row: a warp loads
// its whole row at once, reduces the max and then the sum by shuffles and
// writes y, while the SM's other warps keep their loads in flight. A row
// over several warps adds one named barrier over those warps, for their
// (max, sum) pairs (backward: the sum of y dy), and a row over a cluster one
// cluster barrier. The rows kernels at these widths give a row to a block
// of 64-1024 threads, with a block barrier per reduction and the rows
// staged through shared memory (docs/design.md). Each exponential is
// computed twice, for the sum and for y: holding exp(x - max) in float32
// would take twice the registers of a 16-bit row.
#pragma once
#include <math_constants.h>

#include "kernels/softmax/softmax_common.cuh"

namespace jaxcraft {
namespace softmax {

using rows::arrive_cluster_started;
using rows::for_pairs;
using rows::share_cluster;
using rows::share_row_warps;
using rows::sum_row;
using rows::WarpRow;

// Forward blocks, three per SM under the register cap: 8 warps each (85
// registers) while the row takes up to 64 registers per lane, 4 warps each
// (170) for rows of 128 registers per lane (float32, 32 vectors per lane):
// 12 warps per SM where one 256-thread block of ~163 registers gave 8
// (H100, bf16 [16k, 8192] 190.6 -> 187.5 us when 16-bit rows took 32
// vectors per lane, f32 [16k, 4096] within 1%).
template <int kVecs>
constexpr int kFwdWarpBlock = kVecs <= 16 ? kNarrowBlock : 128;

// The row's (max, sum) over its kWarps warps and kSplit CTAs, in every lane.
// Each warp has exponentiated against its own max m (sum s); every warp
// merges the warps' pairs, then the CTAs' (merge_pairs: the same bits in
// each).
template <int kWarps, int kSplit>
__device__ __forceinline__ float2 merge_row_pairs(float m, float s, float2* slots, float2* cta_slots) {
  const int lane = threadIdx.x % kWarp;
  const float2 none = make_float2(-CUDART_INF_F, 0.f);
  float2 pair = make_float2(m, s);
  if constexpr (kWarps > 1) {
    const float2* row = share_row_warps<kWarps>(pair, slots);
    pair = merge_pairs<kWarps>(lane < kWarps ? row[lane] : none);
  }
  if constexpr (kSplit > 1) {
    share_cluster<kSplit>(pair, cta_slots);
    pair = merge_pairs<kSplit>(lane < kSplit ? cta_slots[lane] : none);
  }
  return pair;
}

template <typename T, int kVecs, int kWarps, int kSplit>
__device__ __forceinline__ void fwd_warp(const SoftmaxFwdParams& p) {
  constexpr int kBlock = kFwdWarpBlock<kVecs>;
  static_assert(kBlock % (kWarps * kWarp) == 0, "a block holds whole rows");
  __shared__ float2 slots[kBlock / kWarp];
  __shared__ float2 cta_slots[kSplit];
  arrive_cluster_started<kSplit>();
  const WarpRow<T, kBlock, kWarps * kWarp, kSplit> w(p.cols);
  if (w.row >= p.rows) return;  // the row's whole group (cluster: never, the grid is exact)
  const T* x = static_cast<const T*>(p.x) + w.first(p.cols);
  T* y = static_cast<T*>(p.y) + w.first(p.cols);
  Vec<T> v[kVecs];
  w.template for_owned<kVecs>([&](int i) { v[i] = load_vec(x + w.kStride * i); });
  // As the rows kernels: a NaN or +inf in the row makes the sum and so the
  // row NaN, and an all -inf row gives exp(-inf + inf) = NaN, as jax.
  float m = -CUDART_INF_F;
  w.template for_owned<kVecs>([&](int i) {
    for_pairs<T>([&](int k) {
      const float2 e = element_pair(v[i], k);
      m = fmaxf(m, fmaxf(e.x, e.y));
    });
  });
  m = warp_allreduce<kWarp>(m, Max{});
  float m_log2e = m * kLog2e;
  float s = 0.f;
  w.template for_owned<kVecs>([&](int i) {
    for_pairs<T>([&](int k) {
      const float2 e = element_pair(v[i], k);
      s += exp_shifted<T>(e.x, m, m_log2e);
      s += exp_shifted<T>(e.y, m, m_log2e);
    });
  });
  const float2 row = merge_row_pairs<kWarps, kSplit>(m, warp_allreduce<kWarp>(s, Sum{}), slots, cta_slots);
  m = row.x;
  m_log2e = m * kLog2e;
  const float inv = 1.f / row.y;
  w.template for_owned<kVecs>([&](int i) {
    Vec<T> out;
    for_pairs<T>([&](int k) {
      const float2 e = element_pair(v[i], k);
      out.v[2 * k] = from_f32<T>(exp_shifted<T>(e.x, m, m_log2e) * inv);
      out.v[2 * k + 1] = from_f32<T>(exp_shifted<T>(e.y, m, m_log2e) * inv);
    });
    store_vec(y + w.kStride * i, out);
  });
}

// The backward on the same layout: y and dy held as stored, kBwdVecs
// vectors of each per lane (64 registers of row), dx = y (dy - sum(y dy))
// with the dot reduced by shuffles, then over the row's kWarps warps and
// kSplit CTAs (sum_row). 256-thread blocks, three per SM under the
// register cap (80 registers, no spill).
constexpr int kBwdVecs = 8;
constexpr int kBwdWarpBlock = kNarrowBlock;

template <typename T, int kWarps, int kSplit>
__device__ __forceinline__ void bwd_warp(const SoftmaxBwdParams& p) {
  constexpr int kBlock = kBwdWarpBlock;
  constexpr int kVecs = kBwdVecs;
  static_assert(kBlock % (kWarps * kWarp) == 0, "a block holds whole rows");
  __shared__ float slots[kBlock / kWarp];
  __shared__ float cta_slots[kSplit];
  arrive_cluster_started<kSplit>();
  const WarpRow<T, kBlock, kWarps * kWarp, kSplit> w(p.cols);
  if (w.row >= p.rows) return;  // the row's whole group (cluster: never, the grid is exact)
  const int64_t first = w.first(p.cols);
  const T* y = static_cast<const T*>(p.y) + first;
  const T* dy = static_cast<const T*>(p.dy) + first;
  T* dx = static_cast<T*>(p.dx) + first;
  Vec<T> yv[kVecs], gv[kVecs];
  w.template for_owned<kVecs>([&](int i) {
    yv[i] = load_vec(y + w.kStride * i);
    gv[i] = load_vec(dy + w.kStride * i);
  });
  float dot = 0.f;
  w.template for_owned<kVecs>([&](int i) { dot = add_dot(yv[i], gv[i], dot); });
  dot = sum_row<kWarps, kSplit>(warp_allreduce<kWarp>(dot, Sum{}), slots, cta_slots);
  w.template for_owned<kVecs>([&](int i) { store_vec(dx + w.kStride * i, softmax_grad(yv[i], gv[i], dot)); });
}

// Cluster instances (kSplit > 1) are empty kernels below sm_90, where the
// launchers never run them (resident_walkers) but still ask their attributes.
template <typename T, int kVecs, int kWarps, int kSplit = 1>
__global__ void __launch_bounds__(kFwdWarpBlock<kVecs>, 3)
    softmax_fwd_warp_kernel(const SoftmaxFwdParams p) {
  if constexpr (kSplit == 1 || norm::kClustersCompiled) fwd_warp<T, kVecs, kWarps, kSplit>(p);
}

template <typename T, int kWarps, int kSplit = 1>
__global__ void __launch_bounds__(kBwdWarpBlock, 3) softmax_bwd_warp_kernel(const SoftmaxBwdParams p) {
  if constexpr (kSplit == 1 || norm::kClustersCompiled) bwd_warp<T, kWarps, kSplit>(p);
}

}  // namespace softmax
}  // namespace jaxcraft
