// Layer norm / RMS norm forward with the row held in registers as stored:
// kLanes lanes per row (part of a warp, or one to eight warps), kVecs 16-byte
// vectors per lane, and past one block a cluster of kSplit one-row blocks
// (sm_90+). A block holds whole rows and runs once (no loop over rows): a
// lane issues all its loads at once, and the SM's other blocks keep theirs
// in flight while a row crosses its reductions. The statistics take one
// exchange between warps (and one between CTAs): each part of the row
// reports (count, sum, squared deviations from its own mean), merged
// without cancellation (merge_moments). Needs cols % Vec<T>::kN == 0 and
// 16-byte aligned buffers.
#pragma once
#include "contract/norm.h"
#include "kernels/rows/warp_row.cuh"

namespace jaxcraft {
namespace norm {

// Eight warps per block; three blocks per SM under the register cap (85)
// for eight vectors per lane, two (128) for sixteen, which spilled at 85.
constexpr int kWarpBlock = 256;
template <int kVecs>
constexpr int kWarpBlocksPerSm = kVecs <= 8 ? 3 : 2;

// A part of a row: its element count, sum, and sum of squared deviations
// from its own mean.
struct Moments {
  float n = 0.f, sum = 0.f, m2 = 0.f;
};

// The moments of the parts that lanes 0..kParts-1 hold, in every lane (the
// same bits: rows::warp_allreduce): M2 = sum(m2_k + n_k (mean_k - mean)^2),
// Chan et al.'s combination, which has no cancellation for large means.
template <int kParts>
__device__ __forceinline__ Moments merge_moments(const Moments& part) {
  using rows::Sum;
  using rows::warp_allreduce;
  Moments row;
  row.n = warp_allreduce<kParts>(part.n, Sum{});
  row.sum = warp_allreduce<kParts>(part.sum, Sum{});
  const float d = part.n > 0.f ? part.sum / part.n - row.sum / row.n : 0.f;
  row.m2 = warp_allreduce<kParts>(part.m2 + part.n * d * d, Sum{});
  return row;
}

// The row's moments from this lane's share of them (`lane`: sum and count;
// `sq(mean)`: this lane's squared deviations from `mean`): first over the
// row's lanes of this warp, then (kWarps > 1) over the row's warps through
// `slots`, then (kSplit > 1) over the cluster's CTAs through `cta_slots`.
template <int kLanes, int kSplit, class Squares>
__device__ __forceinline__ Moments row_moments(float sum, float n, Squares sq, Moments* slots,
                                               Moments* cta_slots) {
  using rows::lanes_allreduce;
  using rows::Sum;
  constexpr int kGroupLanes = kLanes < kWarp ? kLanes : kWarp;
  constexpr int kWarps = kLanes / kGroupLanes;
  Moments part;
  part.sum = lanes_allreduce<kGroupLanes>(sum, Sum{});
  part.n = lanes_allreduce<kGroupLanes>(n, Sum{});
  part.m2 = lanes_allreduce<kGroupLanes>(sq(part.n > 0.f ? part.sum / part.n : 0.f), Sum{});
  const int lane = threadIdx.x % kWarp;
  if constexpr (kWarps > 1) {
    const Moments* row = rows::share_row_warps<kWarps>(part, slots);
    part = merge_moments<kWarps>(lane < kWarps ? row[lane] : Moments{});
  }
  if constexpr (kSplit > 1) {
    rows::share_cluster<kSplit>(part, cta_slots);
    part = merge_moments<kSplit>(lane < kSplit ? cta_slots[lane] : Moments{});
  }
  return part;
}

template <typename T, int kLanes, int kVecs, int kSplit>
__device__ __forceinline__ void fwd_warp(const NormFwdParams& p) {
  using rows::element_pair;
  using rows::for_pairs;
  constexpr int kN = Vec<T>::kN;
  static_assert(kWarpBlock % kLanes == 0, "a block holds whole rows");
  __shared__ Moments slots[kWarpBlock / kWarp];
  __shared__ Moments cta_slots[kSplit];
  rows::arrive_cluster_started<kSplit>();
  const rows::WarpRow<T, kWarpBlock, kLanes, kSplit> w(p.cols);
  // Rows of whole warps leave together; lanes of a shared warp stay for its
  // shuffles, holding nothing.
  const bool row_ok = w.row < p.rows;
  if (kLanes >= kWarp && !row_ok) return;
  auto owned = [&](auto f) { w.template for_owned<kVecs>([&](int i) { if (row_ok) f(i); }); };
  const int64_t first = w.first(p.cols);
  const T* x = static_cast<const T*>(p.x) + first;
  Vec<T> v[kVecs];
  owned([&](int i) { v[i] = load_vec(x + w.kStride * i); });
  if (p.residual) {
    // h = x + residual, rounded to T: the normalized value and the h output.
    const T* res = static_cast<const T*>(p.residual) + first;
    T* h = static_cast<T*>(p.h_out) + first;
    owned([&](int i) {
      const Vec<T> r = load_vec(res + w.kStride * i);
      for_pairs<T>([&](int k) {
        const float2 a = element_pair(v[i], k), b = element_pair(r, k);
        v[i].v[2 * k] = from_f32<T>(a.x + b.x);
        v[i].v[2 * k + 1] = from_f32<T>(a.y + b.y);
      });
      store_vec(h + w.kStride * i, v[i]);
    });
  }
  // RMS norm: the sum of squares as the "sum" (mean 0); layer norm: the sum.
  float sum = 0.f, n = 0.f;
  owned([&](int i) {
    n += kN;
    for_pairs<T>([&](int k) {
      const float2 e = element_pair(v[i], k);
      sum += p.rms ? e.x * e.x + e.y * e.y : e.x + e.y;
    });
  });
  auto squares = [&](float mean) {
    float sq = 0.f;
    if (!p.rms) {
      owned([&](int i) {
        for_pairs<T>([&](int k) {
          const float2 e = element_pair(v[i], k);
          sq += (e.x - mean) * (e.x - mean) + (e.y - mean) * (e.y - mean);
        });
      });
    }
    return sq;
  };
  const Moments row = row_moments<kLanes, kSplit>(sum, n, squares, slots, cta_slots);
  if (!row_ok) return;
  const float inv_c = 1.f / float(p.cols);
  const float mean = p.rms ? 0.f : row.sum * inv_c;
  const float rstd = rsqrtf((p.rms ? row.sum : row.m2) * inv_c + p.epsilon);
  if (w.lane == 0) {
    if (p.mean) p.mean[w.row] = mean;
    p.rstd[w.row] = rstd;
  }
  // Column of this lane's vector i: lane * kN + kStride * i.
  const float* scale = p.scale ? p.scale + w.lane * kN : nullptr;
  const float* bias = p.bias ? p.bias + w.lane * kN : nullptr;
  T* y = static_cast<T*>(p.y) + first;
  owned([&](int i) {
    // Four elements at a time: one 16-byte load each of scale and bias.
    constexpr int kChunk = Vec<float>::kN;
    Vec<T> out;
#pragma unroll
    for (int c = 0; c < kN; c += kChunk) {
      Vec<float> s, b;
      if (scale) s = load_vec(scale + w.kStride * i + c);
      if (bias) b = load_vec(bias + w.kStride * i + c);
#pragma unroll
      for (int k = c / 2; k < (c + kChunk) / 2; ++k) {
        const float2 e = element_pair(v[i], k);
        float lo = (e.x - mean) * rstd, hi = (e.y - mean) * rstd;
        if (scale) lo *= s.v[2 * k - c], hi *= s.v[2 * k + 1 - c];
        if (bias) lo += b.v[2 * k - c], hi += b.v[2 * k + 1 - c];
        out.v[2 * k] = from_f32<T>(lo);
        out.v[2 * k + 1] = from_f32<T>(hi);
      }
    }
    store_vec(y + w.kStride * i, out);
  });
}

// The images that carry an instance's code: cluster instances need sm_90,
// and the one-block sixteen-vector instance runs only where clusters cannot
// (launch_fwd_warp_for), so each is an empty kernel in the other image.
template <int kVecs, int kSplit>
constexpr bool fwd_warp_compiled() {
  return kSplit > 1 ? kClustersCompiled : kVecs < 16 || !kClustersCompiled;
}

template <typename T, int kLanes, int kVecs, int kSplit>
__global__ void __launch_bounds__(kWarpBlock, kWarpBlocksPerSm<kVecs>) norm_fwd_warp_kernel(const NormFwdParams p) {
  if constexpr (fwd_warp_compiled<kVecs, kSplit>()) fwd_warp<T, kLanes, kVecs, kSplit>(p);
}

}  // namespace norm
}  // namespace jaxcraft
