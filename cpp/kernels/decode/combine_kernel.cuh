// Merges the split partials of every output row (b, t, n) by their
// logsumexp: o = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), M = max_s lse_s.
// Splits that saw no key (lse = -inf) are skipped, never multiplied: their
// partial o may be anything. A NaN lse (a NaN score) makes the row NaN, as
// jax.nn.
//
// One CTA per row: warp w takes splits w, w + kCombineWarps, ..., and keeps
// its own running max, weight sum and weighted sum (an online merge), so a
// split's lse and partial o are loaded together, with up to
// kSplitsInFlight splits' loads outstanding per warp; the warps' states
// meet in shared memory. The rows that need a combine come few with many
// splits (1 x 128k: 32 rows x 33 splits), so this kernel's time is load
// latency: one round trip, where a first pass for the max and then
// lse-dependent loads of o took five (8 us vs cuDNN's 5 us reduction kernel
// under Nsight Compute). Eight warps keep up to 64 splits in that one trip
// (four hold 32, so 33 splits would take a second trip).
#pragma once
#include <math_constants.h>

#include "kernels/decode/device.cuh"

namespace jaxcraft {
namespace decode {

constexpr int kCombineWarps = 8;
constexpr int kCombineThreads = kCombineWarps * kWarpSize;
constexpr int kMaxHeadDim = kDecodeCudaMaxHeadDim;
constexpr int kCombineVecs = kMaxHeadDim / (4 * kWarpSize);  // float4s per lane
constexpr int kSplitsInFlight = 8;                           // per warp (no spills)
static_assert(kCombineThreads * 4 >= kMaxHeadDim, "one output float4 per thread");

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
    decode_combine_kernel(const __grid_constant__ DecodeArgs a) {
  __shared__ float4 s_acc[kCombineWarps][kMaxHeadDim / 4];
  __shared__ float s_max[kCombineWarps], s_total[kCombineWarps];
  const DecodeParams& p = a.p;
  // Launched as a dependent of the split kernel: its partials are complete
  // and visible after the wait.
  wait_for_prior_grid();
  allow_dependent_grids();
  const int64_t rows = p.batch * p.seqlen_q * p.num_heads;
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int head_dim = static_cast<int>(p.head_dim);
  const int splits = a.num_splits;

  float row_max = kNegInf, total = 0.f;  // this warp's splits, weights relative to row_max
  bool nan = false;                      // a split of this warp has a NaN lse
  float4 acc[kCombineVecs];
#pragma unroll
  for (int v = 0; v < kCombineVecs; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = warp; s0 < splits; s0 += kCombineWarps * kSplitsInFlight) {
    float lse[kSplitsInFlight];
    float4 x[kSplitsInFlight][kCombineVecs];
#pragma unroll
    for (int u = 0; u < kSplitsInFlight; ++u) {
      const int s = s0 + u * kCombineWarps;
      lse[u] = s < splits ? p.partial_lse[s * rows + row] : kNegInf;
      const float* o = p.partial_o + (s < splits ? s * rows + row : 0) * head_dim;
#pragma unroll
      for (int v = 0; v < kCombineVecs; ++v) {
        const int d = (lane + v * kWarpSize) * 4;
        x[u][v] = s < splits && d < head_dim ? *reinterpret_cast<const float4*>(o + d)
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    float batch_max = row_max;
#pragma unroll
    for (int u = 0; u < kSplitsInFlight; ++u) {
      batch_max = fmaxf(batch_max, lse[u]);  // fmaxf skips NaN: `nan` keeps it
      nan |= lse[u] != lse[u];
    }
    if (batch_max == kNegInf) continue;  // no split so far saw a key
    const float correction = exp2f(row_max - batch_max);  // 0 while row_max is -inf
    total *= correction;
#pragma unroll
    for (int v = 0; v < kCombineVecs; ++v) {
      acc[v].x *= correction;
      acc[v].y *= correction;
      acc[v].z *= correction;
      acc[v].w *= correction;
    }
#pragma unroll
    for (int u = 0; u < kSplitsInFlight; ++u) {
      if (lse[u] == kNegInf) continue;
      const float w = exp2f(lse[u] - batch_max);
      total += w;
#pragma unroll
      for (int v = 0; v < kCombineVecs; ++v) {
        acc[v].x += w * x[u][v].x;
        acc[v].y += w * x[u][v].y;
        acc[v].z += w * x[u][v].z;
        acc[v].w += w * x[u][v].w;
      }
    }
    row_max = batch_max;
  }
#pragma unroll
  for (int v = 0; v < kCombineVecs; ++v) s_acc[warp][lane + v * kWarpSize] = acc[v];
  if (lane == 0) {
    s_max[warp] = nan ? CUDART_NAN_F : row_max;  // a NaN max makes every weight below NaN
    s_total[warp] = total;
  }
  __syncthreads();

  const int vec = threadIdx.x;  // one float4 of the output per thread
  if (vec * 4 >= head_dim) return;
  float m = kNegInf;
#pragma unroll
  for (int i = 0; i < kCombineWarps; ++i) m = fmaxf(m, s_max[i]);
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  float weight = 0.f;
#pragma unroll
  for (int i = 0; i < kCombineWarps; ++i) {
    if (s_max[i] == kNegInf) continue;  // the warp's splits saw no key
    const float w = exp2f(s_max[i] - m);
    sum.x += w * s_acc[i][vec].x;
    sum.y += w * s_acc[i][vec].y;
    sum.z += w * s_acc[i][vec].z;
    sum.w += w * s_acc[i][vec].w;
    weight += w * s_total[i];
  }
  const float inv = weight > 0.f || weight != weight ? 1.f / weight : 0.f;
  store4(static_cast<T*>(p.o) + row * head_dim + vec * 4,
         make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv));
}

}  // namespace decode
}  // namespace jaxcraft
