// Layer norm / RMS norm with the row held in registers: kGroup threads share a
// row, each holding kVecs 16-byte vectors, so x is read once and y written
// once. Requires cols % Vec<T>::kN == 0 and cols <= kGroup * kVecs * kN.
#pragma once
#include "kernels/norm/norm_common.cuh"
#include "kernels/norm/params.h"

namespace jaxcraft {
namespace norm {

// Threads per block: small groups pack several rows into one block so that a
// block keeps >= 8 warps of loads in flight.
constexpr int kMinBlock = 256;

template <int kGroup>
constexpr int block_threads() { return kGroup > kMinBlock ? kGroup : kMinBlock; }

template <typename T, int kGroup, int kVecs>
__global__ void __launch_bounds__(block_threads<kGroup>())
norm_fwd_rows_kernel(NormFwdParams p) {
  constexpr int kN = Vec<T>::kN;
  constexpr int kRowsPerBlock = block_threads<kGroup>() / kGroup;
  constexpr int kScratch = kGroup > kWarp ? block_threads<kGroup>() / kWarp : 1;
  __shared__ float sum_scratch[kScratch], sq_scratch[kScratch];

  const int lane = threadIdx.x % kGroup;
  const int group = threadIdx.x / kGroup;
  const int64_t C = p.cols;
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  T* h_out = static_cast<T*>(p.h_out);

  // The loop bound is uniform across the block: group_sum synchronizes.
  for (int64_t base = int64_t(blockIdx.x) * kRowsPerBlock; base < p.rows;
       base += int64_t(gridDim.x) * kRowsPerBlock) {
    const int64_t row = base + group;
    const bool row_ok = row < p.rows;
    float v[kVecs][kN];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t col = int64_t(lane + i * kGroup) * kN;
      if (row_ok && col < C) {
        const int64_t off = row * C + col;
        load_f32(x + off, v[i]);
        if (res) {
          float r[kN];
          load_f32(res + off, r);
#pragma unroll
          for (int j = 0; j < kN; ++j) v[i][j] = round_to<T>(v[i][j] + r[j]);
          store_f32(h_out + off, v[i]);
        }
#pragma unroll
        for (int j = 0; j < kN; ++j) sum += v[i][j];
      } else {
#pragma unroll
        for (int j = 0; j < kN; ++j) v[i][j] = 0.f;
      }
    }
    const float inv_c = 1.f / float(C);
    const float mean = p.rms ? 0.f : group_sum<kGroup>(sum, sum_scratch) * inv_c;
    // Two-pass variance over the registers: no cancellation for large means.
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t col = int64_t(lane + i * kGroup) * kN;
      if (row_ok && col < C) {
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float d = v[i][j] - mean;
          sq += d * d;
        }
      }
    }
    const float rstd = rsqrtf(group_sum<kGroup>(sq, sq_scratch) * inv_c + p.epsilon);
    if (row_ok) {
      if (lane == 0) {
        if (p.mean) p.mean[row] = mean;
        p.rstd[row] = rstd;
      }
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int64_t col = int64_t(lane + i * kGroup) * kN;
        if (col < C) {
          float out[kN];
#pragma unroll
          for (int j = 0; j < kN; ++j) out[j] = (v[i][j] - mean) * rstd;
          if (p.scale) {
            float s[kN];
            load_params(p.scale + col, s);
#pragma unroll
            for (int j = 0; j < kN; ++j) out[j] *= s[j];
          }
          if (p.bias) {
            float b[kN];
            load_params(p.bias + col, b);
#pragma unroll
            for (int j = 0; j < kN; ++j) out[j] += b[j];
          }
          store_f32(y + row * C + col, out);
        }
      }
    }
    __syncthreads();  // scratch is reused by the next row
  }
}

// Backward. Block b owns partial row b of dscale/dbias: its groups walk rows
// b*R + g, b*R + g + gridDim*R, ...; per-thread column sums stay in registers
// and are folded across the block's groups through shared memory at the end
// (fixed order: deterministic).
template <typename T, int kGroup, int kVecs>
__global__ void __launch_bounds__(block_threads<kGroup>())
norm_bwd_rows_kernel(NormBwdParams p) {
  constexpr int kN = Vec<T>::kN;
  constexpr int kRowsPerBlock = block_threads<kGroup>() / kGroup;
  constexpr int kScratch = kGroup > kWarp ? block_threads<kGroup>() / kWarp : 1;
  constexpr int kRowCapacity = kGroup * kVecs * kN;
  __shared__ float g_scratch[kScratch], gx_scratch[kScratch];
  extern __shared__ float fold[];  // [kRowsPerBlock][kRowCapacity] when kRowsPerBlock > 1

  const int lane = threadIdx.x % kGroup;
  const int group = threadIdx.x / kGroup;
  const int64_t C = p.cols;
  const T* dy = static_cast<const T*>(p.dy);
  const T* h = static_cast<const T*>(p.h);
  const T* dh_extra = static_cast<const T*>(p.dh_extra);
  T* dh = static_cast<T*>(p.dh);

  float dscale[kVecs][kN], dbias[kVecs][kN];
#pragma unroll
  for (int i = 0; i < kVecs; ++i)
#pragma unroll
    for (int j = 0; j < kN; ++j) dscale[i][j] = dbias[i][j] = 0.f;

  for (int64_t base = int64_t(blockIdx.x) * kRowsPerBlock; base < p.rows;
       base += int64_t(gridDim.x) * kRowsPerBlock) {
    const int64_t row = base + group;
    const bool row_ok = row < p.rows;
    const float mean = (row_ok && p.mean) ? p.mean[row] : 0.f;
    const float rstd = row_ok ? p.rstd[row] : 0.f;
    float dyv[kVecs][kN], xhat[kVecs][kN];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t col = int64_t(lane + i * kGroup) * kN;
      if (row_ok && col < C) {
        const int64_t off = row * C + col;
        load_f32(dy + off, dyv[i]);
        load_f32(h + off, xhat[i]);
        float s[kN];
        if (p.scale) load_params(p.scale + col, s);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          xhat[i][j] = (xhat[i][j] - mean) * rstd;
          const float g = p.scale ? dyv[i][j] * s[j] : dyv[i][j];
          sum_g += g;
          sum_gx += g * xhat[i][j];
          dscale[i][j] += dyv[i][j] * xhat[i][j];
          dbias[i][j] += dyv[i][j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kN; ++j) dyv[i][j] = xhat[i][j] = 0.f;
      }
    }
    const float inv_c = 1.f / float(C);
    const float mean_g = p.rms ? 0.f : group_sum<kGroup>(sum_g, g_scratch) * inv_c;
    const float mean_gx = group_sum<kGroup>(sum_gx, gx_scratch) * inv_c;
    if (row_ok) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int64_t col = int64_t(lane + i * kGroup) * kN;
        if (col < C) {
          const int64_t off = row * C + col;
          float s[kN], extra[kN], out[kN];
          if (p.scale) load_params(p.scale + col, s);
          if (dh_extra) load_f32(dh_extra + off, extra);
#pragma unroll
          for (int j = 0; j < kN; ++j) {
            const float g = p.scale ? dyv[i][j] * s[j] : dyv[i][j];
            out[j] = rstd * (g - mean_g - xhat[i][j] * mean_gx);
            if (dh_extra) out[j] += extra[j];
          }
          store_f32(dh + off, out);
        }
      }
    }
    __syncthreads();
  }

  if (!p.dscale_partial && !p.dbias_partial) return;
  float* const outs[2] = {p.dscale_partial, p.dbias_partial};
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    float* out = outs[which];
    if (!out) continue;
    float(&acc)[kVecs][kN] = which == 0 ? dscale : dbias;
    out += int64_t(blockIdx.x) * C;
    if constexpr (kRowsPerBlock == 1) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int64_t col = int64_t(lane + i * kGroup) * kN;
        if (col < C) {
#pragma unroll
          for (int j = 0; j < kN; j += Vec<float>::kN) {
            Vec<float> chunk;
#pragma unroll
            for (int k = 0; k < Vec<float>::kN; ++k) chunk.v[k] = acc[i][j + k];
            *reinterpret_cast<Vec<float>*>(out + col + j) = chunk;
          }
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVecs; ++i)
#pragma unroll
        for (int j = 0; j < kN; ++j) fold[group * kRowCapacity + (lane + i * kGroup) * kN + j] = acc[i][j];
      __syncthreads();
      for (int64_t col = threadIdx.x; col < C; col += blockDim.x) {
        float total = 0.f;
#pragma unroll
        for (int g = 0; g < kRowsPerBlock; ++g) total += fold[g * kRowCapacity + col];
        out[col] = total;
      }
      __syncthreads();
    }
  }
}

}  // namespace norm
}  // namespace jaxcraft
