// Layer norm / RMS norm backward with the row held in registers: kGroup
// threads share a row, each holding kVecs 16-byte vectors, so dy and h are
// read once and dh written once (rows of a whole block arrive through a
// shared-memory ring, BwdStages). With kSplit > 1 (sm_90+, launched as
// clusters of kSplit CTAs) CTA r of a cluster holds the r-th slice of the
// row, so a row kSplit times wider fits in the same registers per thread;
// row statistics meet in distributed shared memory (RowSum). Requires
// cols % Vec<T>::kN == 0 and cols <= kSplit * kGroup * kVecs * Vec<T>::kN.
#pragma once
#include "contract/norm.h"
#include "kernels/norm/norm_bwd_stages.cuh"
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
__device__ __forceinline__ void bwd_rows(const NormBwdParams& p, int stages) {
  constexpr int kN = Vec<T>::kN;
  constexpr int kRowsPerBlock = block_threads<kGroup>() / kGroup;
  constexpr int kRowCapacity = kGroup * kVecs * kN;
  // Row sums of g = dy * scale and of g * xhat, reduced together.
  using Sum = RowSum<kGroup, kSplit, 2>;
  __shared__ typename Sum::Shared sum_smem;
  Sum row_sum(sum_smem);
  // [kRowsPerBlock][kRowCapacity] floats (fold) when kRowsPerBlock > 1, else the row stages.
  extern __shared__ float4 dyn_smem[];
  float* const fold = reinterpret_cast<float*>(dyn_smem);

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

  // The thread's columns stay the same over its rows: their scale is read once.
  float scale[kVecs][kN];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    if (p.scale && cols.owns(i)) load_params(p.scale + cols.col(i), scale[i]);
    else
#pragma unroll
      for (int j = 0; j < kN; ++j) scale[i][j] = 1.f;
  }

  // Rows held as stored (bf16: half the registers of float32). Rows of a
  // whole block (kGroup >= 256) or of a cluster come through a ring of
  // `stages` rows in shared memory (BwdStages): stages - 1 rows' loads are
  // in flight while this row crosses its barriers and writes dh. Narrower
  // rows, several to a block, load one at a time into registers, with the
  // block's next rows prefetched into L2.
  constexpr bool kStaged = kRowsPerBlock == 1;
  using Row = BwdRow<T, kVecs>;
  const BwdStages<T, kVecs, kGroup> ring{reinterpret_cast<char*>(dyn_smem), stages};
  auto load_row = [&](int64_t row, Row& r) {
    if (row >= p.rows) return;
    if (p.mean) r.mean = p.mean[row];
    r.rstd = p.rstd[row];
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (cols.owns(i)) {
        const int64_t off = row * C + cols.col(i);
        r.dy[i] = load_vec(dy + off);
        r.h[i] = load_vec(h + off);
      }
    }
  };
  const int64_t first_row = cluster_index<kSplit>() * kRowsPerBlock;
  const int64_t row_stride = num_clusters<kSplit>() * kRowsPerBlock;
  if constexpr (kStaged)
    for (int s = 0; s + 1 < stages; ++s) ring.issue(s, first_row + s * row_stride, p, cols);
  int stage = 0;
  for (int64_t base = first_row; base < p.rows; base += row_stride) {
    const int64_t row = base + group;
    const bool row_ok = row < p.rows;
    Row cur;
    if constexpr (kStaged) {
      ring.issue(stage == 0 ? stages - 1 : stage - 1, row + (stages - 1) * row_stride, p, cols);
      cur = ring.take(stage, p, cols);
      stage = stage + 1 == stages ? 0 : stage + 1;
    } else {
      load_row(row, cur);
      prefetch_rows<kRowsPerBlock>(dy, base + row_stride, p.rows, C, cols);
      prefetch_rows<kRowsPerBlock>(h, base + row_stride, p.rows, C, cols);
    }
    // dh_extra is read after this row's barrier: the next rows' go to L2 now.
    if (dh_extra) prefetch_rows<kRowsPerBlock>(dh_extra, base + row_stride, p.rows, C, cols);
    // g = dy * scale and xhat, from the row as stored: computed here for the
    // sums and again for dh, rather than held in float32 registers.
    auto element = [&](int i, int j, float* g, float* xhat) {
      *xhat = (to_f32(cur.h[i].v[j]) - cur.mean) * cur.rstd;
      *g = to_f32(cur.dy[i].v[j]) * scale[i][j];
    };
    float sums[2] = {0.f, 0.f};  // g, g * xhat
    if (row_ok) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (!cols.owns(i)) continue;
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float g, xhat;
          element(i, j, &g, &xhat);
          const float d = to_f32(cur.dy[i].v[j]);
          dscale[i][j] += d * xhat;
          dbias[i][j] += d;
          sums[0] += g;
          sums[1] += g * xhat;
        }
      }
    }
    row_sum(sums);
    const float inv_c = 1.f / float(C);
    const float mean_g = p.rms ? 0.f : sums[0] * inv_c;
    const float mean_gx = sums[1] * inv_c;
    if (row_ok) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (cols.owns(i)) {
          const int64_t off = row * C + cols.col(i);
          float extra[kN], out[kN];
          if (dh_extra) load_f32(dh_extra + off, extra);
#pragma unroll
          for (int j = 0; j < kN; ++j) {
            float g, xhat;
            element(i, j, &g, &xhat);
            out[j] = cur.rstd * (g - mean_g - xhat * mean_gx);
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
norm_bwd_rows_kernel(NormBwdParams p, int stages) {
  if constexpr (kSplit == 1 || kClustersCompiled) bwd_rows<T, kGroup, kVecs, kSplit>(p, stages);
}

}  // namespace norm
}  // namespace jaxcraft
