// Layer norm / RMS norm backward with the row held in registers: kGroup
// threads share a row, each holding kVecs 16-byte vectors, so dy and h are
// read once and dh written once. With kSplit > 1 (sm_90+, launched as
// clusters of kSplit CTAs) CTA r of a cluster holds the r-th slice of the
// row, so a row kSplit times wider fits in the same registers per thread;
// row statistics meet in distributed shared memory (RowSum). Requires
// cols % Vec<T>::kN == 0 and cols <= kSplit * kGroup * kVecs * Vec<T>::kN.
#pragma once
#include "contract/norm.h"
#include "kernels/norm/norm_common.cuh"
#include "kernels/norm/norm_row_sum.cuh"

namespace jaxcraft {
namespace norm {

// Thread 0 asks L2 for this block's share of rows [row, row + kRowsPerBlock)
// of t: whole rows, or with a cluster this CTA's slice (thread 0 holds the
// slice's first vector, and `left` counts the slice).
template <int kRowsPerBlock, typename T, int kGroup, int kN>
__device__ __forceinline__ void prefetch_rows(const T* t, int64_t row, int64_t rows, int64_t cols,
                                              const ThreadColumns<kGroup, kN>& own) {
  if (threadIdx.x != 0 || row >= rows || own.left <= 0) return;
  const int64_t n = rows - row < kRowsPerBlock ? rows - row : kRowsPerBlock;
  prefetch_l2(t + row * cols + own.col0,
              (n - 1) * cols * int64_t(sizeof(T)) + own.left * int64_t(sizeof(Vec<T>)));
}

// Clusters of a 1-D launch are runs of kSplit consecutive blocks: cluster
// blockIdx.x / kSplit walks rows (or owns a partial row) as one block would.
template <int kSplit>
__device__ __forceinline__ int64_t cluster_index() { return blockIdx.x / kSplit; }

template <int kSplit>
__device__ __forceinline__ int64_t num_clusters() { return gridDim.x / kSplit; }

// Backward. Cluster c (a block when kSplit == 1) owns partial row c of
// dscale/dbias: its groups walk rows c*R + g, c*R + g + clusters*R, ...;
// per-thread column sums stay in registers, each CTA over its own slice, and
// are folded across the block's groups through shared memory at the end
// (fixed order: deterministic).
template <typename T, int kGroup, int kVecs, int kSplit>
__device__ __forceinline__ void bwd_rows(const NormBwdParams& p) {
  constexpr int kN = Vec<T>::kN;
  constexpr int kRowsPerBlock = block_threads<kGroup>() / kGroup;
  constexpr int kRowCapacity = kGroup * kVecs * kN;
  // Row sums of g = dy * scale and of g * xhat, reduced together.
  using Sum = RowSum<kGroup, kSplit, 2>;
  __shared__ typename Sum::Shared sum_smem;
  Sum row_sum(sum_smem);
  extern __shared__ float fold[];  // [kRowsPerBlock][kRowCapacity] when kRowsPerBlock > 1

  const int lane = threadIdx.x % kGroup;
  const int group = threadIdx.x / kGroup;
  const ThreadColumns<kGroup, kN> cols = thread_columns<kGroup, kSplit, kN>(p.cols, lane);
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

  const int64_t first_row = cluster_index<kSplit>() * kRowsPerBlock;
  const int64_t row_stride = num_clusters<kSplit>() * kRowsPerBlock;
  for (int64_t base = first_row; base < p.rows; base += row_stride) {
    const int64_t row = base + group;
    const bool row_ok = row < p.rows;
    const float mean = (row_ok && p.mean) ? p.mean[row] : 0.f;
    const float rstd = row_ok ? p.rstd[row] : 0.f;
    float dyv[kVecs][kN], xhat[kVecs][kN];  // dy, then g = dy * scale
    float sums[2] = {0.f, 0.f};  // g, g * xhat
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (row_ok && cols.owns(i)) {
        const int64_t col = cols.col(i);
        const int64_t off = row * C + col;
        load_f32(dy + off, dyv[i]);
        load_f32(h + off, xhat[i]);
        float s[kN];
        if (p.scale) load_params(p.scale + col, s);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          xhat[i][j] = (xhat[i][j] - mean) * rstd;
          dscale[i][j] += dyv[i][j] * xhat[i][j];
          dbias[i][j] += dyv[i][j];
          // dyv now holds g = dy * scale: the second pass reads no scale again.
          if (p.scale) dyv[i][j] *= s[j];
          sums[0] += dyv[i][j];
          sums[1] += dyv[i][j] * xhat[i][j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kN; ++j) dyv[i][j] = xhat[i][j] = 0.f;
      }
    }
    // The block's next rows stream into L2 while this row's sums cross the
    // barrier(s) and its dh is written: their loads then wait on L2, not HBM.
    // (Two or three rows ahead measured no faster, and slower with dh_extra.)
    prefetch_rows<kRowsPerBlock>(dy, base + row_stride, p.rows, C, cols);
    prefetch_rows<kRowsPerBlock>(h, base + row_stride, p.rows, C, cols);
    if (dh_extra) prefetch_rows<kRowsPerBlock>(dh_extra, base + row_stride, p.rows, C, cols);
    row_sum(sums);
    const float inv_c = 1.f / float(C);
    const float mean_g = p.rms ? 0.f : sums[0] * inv_c;
    const float mean_gx = sums[1] * inv_c;
    if (row_ok) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (cols.owns(i)) {
          const int64_t col = cols.col(i);
          const int64_t off = row * C + col;
          float extra[kN], out[kN];
          if (dh_extra) load_f32(dh_extra + off, extra);
#pragma unroll
          for (int j = 0; j < kN; ++j) {
            out[j] = rstd * (dyv[i][j] - mean_g - xhat[i][j] * mean_gx);
            if (dh_extra) out[j] += extra[j];
          }
          store_f32(dh + off, out);
        }
      }
    }
  }

  if (!p.dscale_partial && !p.dbias_partial) return;
  float* const outs[2] = {p.dscale_partial, p.dbias_partial};
  // The partial rows past the grid's clusters (the launcher runs no more
  // than fit at once) are zeros.
  for (int64_t zero = cluster_index<kSplit>() + num_clusters<kSplit>(); zero < p.num_partials;
       zero += num_clusters<kSplit>())
    for (float* out : outs)
      if (out)
        for (int64_t col = cluster_rank<kSplit>() * blockDim.x + threadIdx.x; col < C; col += kSplit * blockDim.x)
          out[zero * C + col] = 0.f;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    float* out = outs[which];
    if (!out) continue;
    float(&acc)[kVecs][kN] = which == 0 ? dscale : dbias;
    out += cluster_index<kSplit>() * C;
    if constexpr (kRowsPerBlock == 1) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (cols.owns(i)) {
          const int64_t col = cols.col(i);
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
      static_assert(kSplit == 1, "clusters split blocks that hold one row");
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

// Cluster instances (kSplit > 1) compile to empty kernels below sm_90.
template <typename T, int kGroup, int kVecs, int kSplit>
__global__ void __launch_bounds__(block_threads<kGroup>())
norm_bwd_rows_kernel(NormBwdParams p) {
  if constexpr (kSplit == 1 || kClustersCompiled) bwd_rows<T, kGroup, kVecs, kSplit>(p);
}

}  // namespace norm
}  // namespace jaxcraft
