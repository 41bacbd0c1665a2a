// The memory-bound helpers of the backward pass: delta = rowsum(dO * O)
// (which also zeroes the fp32 dQ accumulator, saving a memset pass) and the
// accumulator -> input dtype conversion.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"

namespace jaxcraft {
namespace attn {

constexpr int kDeltaThreads = 256;
constexpr int kConvertThreads = 256;
constexpr int kConvertBlocksPerSm = 8;  // enough resident blocks to saturate HBM

// Lanes that share one (b, t, n) row in the delta kernel: one 16-byte load of
// O and of dO each per lane and head_dim / 8 lanes (a power of two, at most a
// warp). A whole warp per row left three quarters of it idle at head dim 64,
// and the kernel ran at a third of the copy bandwidth.
__host__ __device__ inline int delta_lanes_per_row(int64_t head_dim) {
  int lanes = 1;
  while (lanes < kWarpSize && lanes * kElemsPerCopy < head_dim) lanes *= 2;
  return lanes;
}

__device__ __forceinline__ float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
__device__ __forceinline__ float2 to_float2(__half2 x) { return __half22float2(x); }

template <DType kDt>
__global__ void __launch_bounds__(kDeltaThreads) attn_bwd_delta_kernel(const BwdArgs a) {
  using Elem = typename ElemOf<kDt>::type;
  using Elem2 = typename std::conditional<kDt == DType::kBF16, __nv_bfloat162, __half2>::type;
  const ShapeArgs& sh = a.shape;
  const int lanes = delta_lanes_per_row(sh.head_dim);
  const int sub = threadIdx.x % lanes;
  const int64_t row = (int64_t(blockIdx.x) * kDeltaThreads + threadIdx.x) / lanes;
  // Whole lane groups leave together, so the shuffles below see only live lanes.
  if (row >= int64_t(sh.batch) * sh.seqlen_q * sh.num_heads) return;
  const int n = static_cast<int>(row % sh.num_heads);
  const int64_t bt = row / sh.num_heads;
  const int tq = static_cast<int>(bt % sh.seqlen_q);
  const int b = static_cast<int>(bt / sh.seqlen_q);
  float acc = 0.f;
  if (tq < seq_lens(a.mask, sh, b).q_len) {
    const Elem* o = static_cast<const Elem*>(a.o) + row * sh.head_dim;
    const Elem* d_o = static_cast<const Elem*>(a.d_o) + row * sh.head_dim;
    for (int c = sub * kElemsPerCopy; c < sh.head_dim; c += lanes * kElemsPerCopy) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
      const uint4 gv = *reinterpret_cast<const uint4*>(d_o + c);
      const Elem2* o2 = reinterpret_cast<const Elem2*>(&ov);
      const Elem2* g2 = reinterpret_cast<const Elem2*>(&gv);
#pragma unroll
      for (int i = 0; i < kElemsPerCopy / 2; ++i) {
        const float2 x = to_float2(o2[i]), y = to_float2(g2[i]);
        acc += x.x * y.x + x.y * y.y;
      }
    }
  }
  if (a.dq_accum) {
    float4* dq = reinterpret_cast<float4*>(a.dq_accum + row * sh.head_dim);
    for (int c = sub; c < sh.head_dim / 4; c += lanes) dq[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // Within the lane group (aligned in its warp; xor offsets below `lanes` stay in it).
  const int lane = threadIdx.x % kWarpSize;
  const unsigned group = lanes == kWarpSize ? ~0u : ((1u << lanes) - 1) << (lane - sub);
  for (int m = lanes / 2; m > 0; m /= 2) acc += __shfl_xor_sync(group, acc, m);
  if (sub == 0) a.delta[(int64_t(b) * sh.num_heads + n) * sh.seqlen_q + tq] = acc;
}

// dq = scale * dq_accum, 8 elements (two float4 loads, one 16-byte store) per step.
template <DType kDt>
__global__ void __launch_bounds__(kConvertThreads)
    attn_bwd_dq_convert_kernel(const float* acc, void* dq, int64_t n8, float scale) {
  using Elem = typename ElemOf<kDt>::type;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float4 x = reinterpret_cast<const float4*>(acc)[2 * i];
    const float4 y = reinterpret_cast<const float4*>(acc)[2 * i + 1];
    uint4 out;
    out.x = pack2<kDt>(x.x * scale, x.y * scale);
    out.y = pack2<kDt>(x.z * scale, x.w * scale);
    out.z = pack2<kDt>(y.x * scale, y.y * scale);
    out.w = pack2<kDt>(y.z * scale, y.w * scale);
    reinterpret_cast<uint4*>(static_cast<Elem*>(dq))[i] = out;
  }
}

}  // namespace attn
}  // namespace jaxcraft
