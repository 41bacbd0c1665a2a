// Merges the split partials of every output row (b, t, n) by their
// logsumexp: o = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), M = max_s lse_s.
// Splits that saw no key (lse = -inf) are skipped, never multiplied: their
// partial o may be anything. One warp per row; a lane owns 4 dims per 128.
#pragma once
#include "kernels/decode/device.cuh"

namespace jaxcraft {
namespace decode {

constexpr int kCombineThreads = 128;
constexpr int kCombineRowsPerCta = kCombineThreads / kWarpSize;
constexpr int kMaxHeadDim = 256;
constexpr int kCombineVecs = kMaxHeadDim / (4 * kWarpSize);  // float4s per lane

template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
    decode_combine_kernel(const __grid_constant__ DecodeArgs a) {
  const DecodeParams& p = a.p;
  const int64_t rows = p.batch * p.seqlen_q * p.num_heads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCombineRowsPerCta + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarpSize;
  const int head_dim = static_cast<int>(p.head_dim);

  float row_max = kNegInf;
  for (int s = 0; s < a.num_splits; ++s) row_max = fmaxf(row_max, p.partial_lse[s * rows + row]);

  float4 acc[kCombineVecs];
#pragma unroll
  for (int i = 0; i < kCombineVecs; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.f;
  for (int s = 0; s < a.num_splits && row_max != kNegInf; ++s) {
    const float lse = p.partial_lse[s * rows + row];
    if (lse == kNegInf) continue;
    const float w = exp2f(lse - row_max);
    total += w;
    const float* o = p.partial_o + (s * rows + row) * head_dim;
#pragma unroll
    for (int i = 0; i < kCombineVecs; ++i) {
      const int d = (lane + i * kWarpSize) * 4;
      if (d >= head_dim) break;
      const float4 x = *reinterpret_cast<const float4*>(o + d);
      acc[i].x += w * x.x;
      acc[i].y += w * x.y;
      acc[i].z += w * x.z;
      acc[i].w += w * x.w;
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  T* out = static_cast<T*>(p.o) + row * head_dim;
#pragma unroll
  for (int i = 0; i < kCombineVecs; ++i) {
    const int d = (lane + i * kWarpSize) * 4;
    if (d >= head_dim) break;
    store4(out + d, make_float4(acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv));
  }
}

}  // namespace decode
}  // namespace jaxcraft
