// Merges the split partials of every output row (b, t, n) by their
// logsumexp: o = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), M = max_s lse_s.
// Splits that saw no key (lse = -inf) are skipped, never multiplied: their
// partial o may be anything.
//
// One CTA per row: warp w takes splits w, w + kCombineWarps, ..., keeping
// kSplitsInFlight partial rows' loads outstanding, and the warps' sums meet
// in shared memory. The rows that need a combine come few with many splits
// (1 x 128k: 32 rows x 32 splits), so this kernel's time is load latency: a
// warp per row reading one split after another took 10 us there (ncu),
// 5% of the call.
#pragma once
#include "kernels/decode/device.cuh"

namespace jaxcraft {
namespace decode {

constexpr int kCombineWarps = 4;
constexpr int kCombineThreads = kCombineWarps * kWarpSize;
constexpr int kMaxHeadDim = 256;
constexpr int kCombineVecs = kMaxHeadDim / (4 * kWarpSize);  // float4s per lane
constexpr int kSplitsInFlight = 4;                           // per warp (48 registers, no spills)
static_assert(kCombineThreads * 4 >= kMaxHeadDim, "one output float4 per thread");

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
    decode_combine_kernel(const __grid_constant__ DecodeArgs a) {
  __shared__ float4 s_acc[kCombineWarps][kMaxHeadDim / 4];
  __shared__ float s_total[kCombineWarps];
  const DecodeParams& p = a.p;
  const int64_t rows = p.batch * p.seqlen_q * p.num_heads;
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int head_dim = static_cast<int>(p.head_dim);
  const int splits = a.num_splits;

  // Every warp finds the row's max lse itself (a few L2 reads) rather than
  // waiting on a barrier for it.
  float row_max = kNegInf;
  for (int s = lane; s < splits; s += kWarpSize) row_max = fmaxf(row_max, p.partial_lse[s * rows + row]);
#pragma unroll
  for (int m = kWarpSize / 2; m > 0; m /= 2) row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, m));

  float4 acc[kCombineVecs];
#pragma unroll
  for (int v = 0; v < kCombineVecs; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.f;
  for (int s0 = warp; s0 < splits && row_max != kNegInf; s0 += kCombineWarps * kSplitsInFlight) {
    float w[kSplitsInFlight];
    float4 x[kSplitsInFlight][kCombineVecs];
#pragma unroll
    for (int u = 0; u < kSplitsInFlight; ++u) {
      const int s = s0 + u * kCombineWarps;
      const float lse = s < splits ? p.partial_lse[s * rows + row] : kNegInf;
      w[u] = lse == kNegInf ? 0.f : exp2f(lse - row_max);
      const float* o = p.partial_o + (s * rows + row) * head_dim;
#pragma unroll
      for (int v = 0; v < kCombineVecs; ++v) {
        const int d = (lane + v * kWarpSize) * 4;
        x[u][v] = w[u] > 0.f && d < head_dim ? *reinterpret_cast<const float4*>(o + d)
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int u = 0; u < kSplitsInFlight; ++u) {
      total += w[u];
#pragma unroll
      for (int v = 0; v < kCombineVecs; ++v) {
        acc[v].x += w[u] * x[u][v].x;
        acc[v].y += w[u] * x[u][v].y;
        acc[v].z += w[u] * x[u][v].z;
        acc[v].w += w[u] * x[u][v].w;
      }
    }
  }
#pragma unroll
  for (int v = 0; v < kCombineVecs; ++v) s_acc[warp][lane + v * kWarpSize] = acc[v];
  if (lane == 0) s_total[warp] = total;
  __syncthreads();

  const int vec = threadIdx.x;  // one float4 of the output per thread
  if (vec * 4 >= head_dim) return;
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  float weight = 0.f;
#pragma unroll
  for (int i = 0; i < kCombineWarps; ++i) {
    sum.x += s_acc[i][vec].x;
    sum.y += s_acc[i][vec].y;
    sum.z += s_acc[i][vec].z;
    sum.w += s_acc[i][vec].w;
    weight += s_total[i];
  }
  const float inv = weight > 0.f ? 1.f / weight : 0.f;
  store4(static_cast<T*>(p.o) + row * head_dim + vec * 4,
         make_float4(sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv));
}

}  // namespace decode
}  // namespace jaxcraft
