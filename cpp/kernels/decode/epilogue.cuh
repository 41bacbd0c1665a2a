// The end of a split kernel: kSlots independent online-softmax states per
// query row (warps, or lane groups, that each streamed their own keys) are
// merged through shared memory, and the CTA writes its rows: the output when
// there is one split, else the split's normalized partial output and its
// logsumexp (log2 units).
#pragma once
#include "kernels/decode/device.cuh"

namespace jaxcraft {
namespace decode {

template <typename T, int kSlots, int kRows, int kHeadDim, int kThreads>
struct Epilogue {
  // Four floats of padding per row: consecutive rows start 16 bytes apart in
  // bank space, so a warp's row-strided float2 stores do not all collide.
  static constexpr int kStride = kHeadDim + 4;
  static constexpr int kQuads = kHeadDim / 4;  // float4 items per row
  // s_o: [kSlots][kRows][kStride] float32, in memory the caller provides.
  static constexpr size_t kSmemBytes = sizeof(float) * kSlots * kRows * kStride;

  // Small per-row state, in static shared memory.
  struct Stats {
    float max[kSlots * kRows];     // log2 units; -inf: the slot saw no key for the row
    float sum[kSlots * kRows];
    float weight[kSlots * kRows];  // exp2(max - row max) / row sum
    float lse[kRows];
  };

  __device__ static float* o_slot(float* s_o, int slot, int row) {
    return s_o + (slot * kRows + row) * kStride;
  }

  // Every thread calls this after writing its slot's rows of s_o and
  // stats.max / stats.sum (unnormalized, relative to the slot's own max).
  __device__ static void run(const DecodeArgs& a, int b, int kh, int split, int row0,
                             float* s_o, Stats& stats) {
    __syncthreads();
    const int tid = threadIdx.x;
    if (tid < kRows) {
      float row_max = kNegInf;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) row_max = fmaxf(row_max, stats.max[s * kRows + tid]);
      float total = 0.f;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const float m = stats.max[s * kRows + tid];
        const float w = m == kNegInf ? 0.f : exp2f(m - row_max);
        stats.weight[s * kRows + tid] = w;
        total += stats.sum[s * kRows + tid] * w;
      }
      // No key: zeros and lse = -inf. A NaN score (a NaN query or key) makes
      // the total NaN, and the row's output and lse NaN, as jax.nn.
      const bool has_keys = total > 0.f || total != total;
      const float inv = has_keys ? 1.f / total : 0.f;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) stats.weight[s * kRows + tid] *= inv;
      stats.lse[tid] = has_keys ? row_max + log2f(total) : kNegInf;
    }
    __syncthreads();

    const DecodeParams& p = a.p;
    const int group_rows = static_cast<int>(p.seqlen_q * a.group.divisor);
    const int rows = min(kRows, group_rows - row0);
    const int head_dim = static_cast<int>(p.head_dim);
    for (int item = tid; item < kRows * kQuads; item += kThreads) {
      const int r = item / kQuads;
      const int d = (item % kQuads) * 4;
      if (r >= rows || d >= head_dim) continue;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const float w = stats.weight[s * kRows + r];
        const float4 v = *reinterpret_cast<const float4*>(o_slot(s_o, s, r) + d);
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
      }
      if (a.num_splits == 1) {
        store4(static_cast<T*>(p.o) + q_offset(a, b, kh, row0 + r) + d, acc);
      } else {
        const int64_t prow = partial_row(a, split, b, kh, row0 + r);
        *reinterpret_cast<float4*>(p.partial_o + prow * head_dim + d) = acc;
        if (d == 0) p.partial_lse[prow] = stats.lse[r];
      }
    }
  }
};

}  // namespace decode
}  // namespace jaxcraft
