// The general path: any cols (no alignment or size limit), scalar accesses,
// one block per row. Forward: Welford statistics in one read of the row, then
// a second read (mostly from L2) to write y. Backward: two reads of the row
// for dh, then a third, column tile by column tile, for the block's
// dscale/dbias partial row (deterministic, no atomics).
#pragma once
#include "contract/norm.h"
#include "kernels/norm/norm_common.cuh"

namespace jaxcraft {
namespace norm {

constexpr int kStreamBlock = 512;

struct Welford {
  float n = 0.f, mean = 0.f, m2 = 0.f;

  __device__ void add(float x) {
    n += 1.f;
    const float d = x - mean;
    mean += d / n;
    m2 += d * (x - mean);
  }

  // Chan et al. parallel merge.
  __device__ void merge(const Welford& o) {
    if (o.n == 0.f) return;
    const float n_ab = n + o.n;
    const float d = o.mean - mean;
    mean += d * (o.n / n_ab);
    m2 += o.m2 + d * d * (n * o.n / n_ab);
    n = n_ab;
  }
};

__device__ __forceinline__ Welford block_welford(Welford w) {
  __shared__ Welford warp_results[kStreamBlock / kWarp];
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    Welford o;
    o.n = __shfl_xor_sync(0xffffffffu, w.n, offset);
    o.mean = __shfl_xor_sync(0xffffffffu, w.mean, offset);
    o.m2 = __shfl_xor_sync(0xffffffffu, w.m2, offset);
    w.merge(o);
  }
  if (threadIdx.x % kWarp == 0) warp_results[threadIdx.x / kWarp] = w;
  __syncthreads();
  Welford total;
  for (int i = 0; i < kStreamBlock / kWarp; ++i) total.merge(warp_results[i]);
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return group_sum<kStreamBlock>(v, scratch);
}

template <typename T>
__global__ void __launch_bounds__(kStreamBlock) norm_fwd_stream_kernel(NormFwdParams p) {
  const int64_t C = p.cols;
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  T* h_out = static_cast<T*>(p.h_out);
  __shared__ float sq_scratch[kStreamBlock / kWarp];
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t base = row * C;
    // The residual path re-reads h from h_out, which this same thread wrote.
    const T* src = res ? h_out : x;
    Welford w;
    float sq = 0.f;
    for (int64_t c = threadIdx.x; c < C; c += kStreamBlock) {
      float v = to_f32(x[base + c]);
      if (res) {
        const T hv = from_f32<T>(v + to_f32(res[base + c]));
        h_out[base + c] = hv;
        v = to_f32(hv);
      }
      w.add(v);
      sq += v * v;
    }
    float mean = 0.f, var;
    if (p.rms) {
      var = block_sum(sq, sq_scratch) / float(C);
    } else {
      const Welford total = block_welford(w);
      mean = total.mean;
      var = total.m2 / float(C);
    }
    const float rstd = rsqrtf(var + p.epsilon);
    if (threadIdx.x == 0) {
      if (p.mean) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
    for (int64_t c = threadIdx.x; c < C; c += kStreamBlock) {
      float out = (to_f32(src[base + c]) - mean) * rstd;
      if (p.scale) out *= p.scale[c];
      if (p.bias) out += p.bias[c];
      y[base + c] = from_f32<T>(out);
    }
    __syncthreads();
  }
}

// Columns per thread in the backward's dscale/dbias pass (see below): 2 x 8
// scalar loads in flight per thread and 16 accumulator registers.
constexpr int kStreamTileCols = 8;

template <typename T>
__global__ void __launch_bounds__(kStreamBlock) norm_bwd_stream_kernel(NormBwdParams p) {
  const int64_t C = p.cols;
  const T* dy = static_cast<const T*>(p.dy);
  const T* h = static_cast<const T*>(p.h);
  const T* dh_extra = static_cast<const T*>(p.dh_extra);
  T* dh = static_cast<T*>(p.dh);
  __shared__ float g_scratch[kStreamBlock / kWarp], gx_scratch[kStreamBlock / kWarp];
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t base = row * C;
    const float mean = p.mean ? p.mean[row] : 0.f;
    const float rstd = p.rstd[row];
    float sum_g = 0.f, sum_gx = 0.f;
    for (int64_t c = threadIdx.x; c < C; c += kStreamBlock) {
      const float dyv = to_f32(dy[base + c]);
      const float xhat = (to_f32(h[base + c]) - mean) * rstd;
      const float g = p.scale ? dyv * p.scale[c] : dyv;
      sum_g += g;
      sum_gx += g * xhat;
    }
    const float mean_g = p.rms ? 0.f : block_sum(sum_g, g_scratch) / float(C);
    const float mean_gx = block_sum(sum_gx, gx_scratch) / float(C);
    for (int64_t c = threadIdx.x; c < C; c += kStreamBlock) {
      const float dyv = to_f32(dy[base + c]);
      const float xhat = (to_f32(h[base + c]) - mean) * rstd;
      const float g = p.scale ? dyv * p.scale[c] : dyv;
      float out = rstd * (g - mean_g - xhat * mean_gx);
      if (dh_extra) out += to_f32(dh_extra[base + c]);
      dh[base + c] = from_f32<T>(out);
    }
    __syncthreads();
  }

  // Partial row blockIdx.x of dscale/dbias, a tile of columns at a time: the
  // tile's sums stay in registers while the block walks its rows once more,
  // then are written once. That third read of dy and h costs 2 * sizeof(T)
  // bytes per element, where a read-modify-write of the partial rows for
  // every row cost 16.
  if (!p.dscale_partial && !p.dbias_partial) return;
  constexpr int64_t kTile = int64_t(kStreamBlock) * kStreamTileCols;
  for (int64_t tile = 0; tile < C; tile += kTile) {
    float dscale[kStreamTileCols], dbias[kStreamTileCols];
#pragma unroll
    for (int k = 0; k < kStreamTileCols; ++k) dscale[k] = dbias[k] = 0.f;
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const int64_t base = row * C;
      const float mean = p.mean ? p.mean[row] : 0.f;
      const float rstd = p.rstd[row];
#pragma unroll
      for (int k = 0; k < kStreamTileCols; ++k) {
        const int64_t c = tile + threadIdx.x + k * kStreamBlock;
        if (c < C) {
          const float dyv = to_f32(dy[base + c]);
          const float xhat = (to_f32(h[base + c]) - mean) * rstd;
          dscale[k] += dyv * xhat;
          dbias[k] += dyv;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kStreamTileCols; ++k) {
      const int64_t c = tile + threadIdx.x + k * kStreamBlock;
      if (c < C) {
        if (p.dscale_partial) p.dscale_partial[int64_t(blockIdx.x) * C + c] = dscale[k];
        if (p.dbias_partial) p.dbias_partial[int64_t(blockIdx.x) * C + c] = dbias[k];
      }
    }
  }
}

}  // namespace norm
}  // namespace jaxcraft
