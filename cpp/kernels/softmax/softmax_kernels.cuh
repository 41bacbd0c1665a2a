// CUDA kernels for softmax over the last axis of [rows, cols], memory-bound,
// float32 math whatever the storage type (norm_common.cuh's 16-byte vectors
// and conversions).
//
// The rows kernel, which holds the whole row, reduces the row max and then
// the sum of exp(x - max). The stream kernel, which sees the row once before
// writing, keeps one online pair per thread, (m, s): the maximum of the
// kept elements it saw and the sum of exp(x - m) over them; pairs combine as
//   m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m)
// (commutative bit for bit, so every lane of a butterfly ends with the same
// pair), with m = -inf meaning "nothing finite kept yet" (s then 0, or NaN
// from a NaN element, which propagates as in jax.nn.softmax).
//
// Two kernels per direction:
// - rows kernel: kGroup threads per row (a warp, or a whole block for wider
//   rows), each holding kVecs 16-byte vectors: x is read once and y written
//   once (the backward: y and dy read once, dx written once). Rows arrive
//   through a shared-memory ring (row_ring.cuh) `stages` deep, chosen by the
//   launcher. Needs cols % (16 / sizeof(T)) == 0 and 16-byte aligned buffers.
// - stream kernel: any width and alignment. kGroup threads per row walk it
//   twice from global memory (online pass, then the write pass; the second
//   read mostly hits L2 while a block's row is <= a few hundred KB). Vector
//   loads between a scalar head (up to the first 16-byte boundary) and a
//   scalar tail, when x and y (dy, dx) are 16-byte aligned (then every row
//   of them has the same misalignment).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>

#include "kernels/norm/norm_common.cuh"
#include "kernels/softmax/params.h"
#include "kernels/softmax/row_ring.cuh"

namespace jaxcraft {
namespace softmax {

using norm::from_f32;
using norm::kVecBytes;
using norm::kWarp;
using norm::load_vec;
using norm::store_vec;
using norm::to_f32;
using norm::Vec;

// Narrow rows: one warp per row, this many threads (rows) per block, so a
// block keeps 8 warps of loads in flight.
constexpr int kNarrowBlock = 256;

template <int kGroup>
__host__ __device__ constexpr int block_threads() {
  return kGroup > kNarrowBlock ? kGroup : (kGroup == kWarp ? kNarrowBlock : kGroup);
}

struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -CUDART_INF_F) return {m, a.s + b.s};  // both empty: 0 (or NaN)
  // exp(-inf - m) = 0 for an empty side; m = +inf gives NaN (jax: all NaN).
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum warp_max_sum(MaxSum v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    MaxSum o;
    o.m = __shfl_xor_sync(0xffffffffu, v.m, offset);
    o.s = __shfl_xor_sync(0xffffffffu, v.s, offset);
    v = combine(v, o);
  }
  return v;
}

// Over the kGroup threads of a row: a warp by shuffles; a whole block
// (kGroup > 32: one row per block, the stream kernels) through `scratch`
// (one slot per warp), whose slots every warp merges by a second butterfly
// (5 merges, not kWarps - 1 in a row). The last barrier lets the caller
// reuse `scratch` for its next row.
template <int kGroup>
__device__ __forceinline__ MaxSum group_max_sum(MaxSum v, MaxSum* scratch) {
  v = warp_max_sum(v);
  if constexpr (kGroup > kWarp) {
    constexpr int kWarps = kGroup / kWarp;
    static_assert(kWarps <= kWarp, "one slot per lane");
    const int lane = threadIdx.x % kWarp;
    if (lane == 0) scratch[threadIdx.x / kWarp] = v;
    __syncthreads();
    v = warp_max_sum(lane < kWarps ? scratch[lane] : MaxSum{-CUDART_INF_F, 0.f});
    __syncthreads();
  }
  return v;
}

// max or sum over the kGroup threads of a row: a warp by shuffles; a whole
// block (kGroup > 32: one row per block) through `slots` (one per warp). No
// barrier after the read: the caller alternates between slot arrays so that
// a barrier of the next reduction orders this read before their reuse.
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
template <int kGroup, class Op>
__device__ __forceinline__ float group_reduce(float v, float* slots, Op op) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if constexpr (kGroup > kWarp) {
    constexpr int kWarps = kGroup / kWarp;
    if (threadIdx.x % kWarp == 0) slots[threadIdx.x / kWarp] = v;
    __syncthreads();
    v = slots[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = op(v, slots[w]);
  }
  return v;
}

// The same, ending with a barrier, so that `scratch` may be reused at once.
template <int kGroup>
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  v = group_reduce<kGroup>(v, scratch, Sum{});
  if constexpr (kGroup > kWarp) __syncthreads();
  return v;
}

// exp(d) for a rows-kernel output stored as T. 16-bit outputs keep 8-11
// bits, so __expf (one multiply + MUFU.EX2, error ~2^-21 relative) is exact
// enough, where expf is ~10 instructions: with it the bf16 forward was
// instruction-bound (59% of copy at 4096 columns; f32, twice the bytes for
// the same instructions, reached 101%). float32 outputs keep expf. (The
// stream kernel keeps expf: with __expf its bf16 forward measured 15%
// slower at 4k x 128k, bench/NOTES.md.)
template <typename T>
__device__ __forceinline__ float exp_for(float d) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return expf(d);
  } else {
    return __expf(d);
  }
}

// The maximum of the kept values, and the shift to subtract before exp: the
// maximum, or 0 when nothing finite is kept (exp(-inf - 0) = 0, where
// -inf - -inf would be NaN).
template <int kN>
__device__ __forceinline__ float kept_max(const float (&v)[kN], uint32_t keep) {
  float m = -CUDART_INF_F;
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (keep >> j & 1u) m = fmaxf(m, v[j]);
  return m;
}
__device__ __forceinline__ float shift_of(float m) { return m == -CUDART_INF_F ? 0.f : m; }

// Adds kept values to a pair: their maximum first, then one exp each.
template <int kN>
__device__ __forceinline__ MaxSum add_values(MaxSum st, const float (&v)[kN], uint32_t keep) {
  const float m = kept_max(v, keep);
  const float shift = shift_of(m);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (keep >> j & 1u) s += expf(v[j] - shift);
  return combine(st, {m, s});
}

// The kN mask bits of the vector at element `col` of mask row `mask_row`
// (all set without a mask). kN bytes aligned to kN (rows kernel: whole
// vectors at multiples of kN).
template <int kN>
__device__ __forceinline__ uint32_t mask_bits(const uint8_t* mask_row, int64_t col) {
  if (!mask_row) return (1u << kN) - 1u;
  struct alignas(kN) Bytes {
    uint8_t b[kN];
  };
  const Bytes bytes = *reinterpret_cast<const Bytes*>(mask_row + col);
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < kN; ++j) bits |= uint32_t(bytes.b[j] != 0) << j;
  return bits;
}

// y = kept ? exp(x - m) * inv : 0 (m = -inf with something kept: NaN, as jax).
__device__ __forceinline__ float output(float x, bool kept, MaxSum st, float inv) {
  return kept ? expf(x - st.m) * inv : 0.f;
}

template <int kGroup>
__device__ __forceinline__ int64_t first_row() {
  return int64_t(blockIdx.x) * (block_threads<kGroup>() / kGroup) + threadIdx.x / kGroup;
}

template <int kGroup>
__device__ __forceinline__ int64_t row_stride() {
  return int64_t(gridDim.x) * (block_threads<kGroup>() / kGroup);
}

// ------------------------------------------------------------------ forward
template <typename T, int kGroup, int kVecs>
__global__ void __launch_bounds__(block_threads<kGroup>())
    softmax_fwd_rows_kernel(const SoftmaxFwdParams p, const int stages) {
  constexpr int kN = Vec<T>::kN;
  using Ring = RowRing<T, block_threads<kGroup>(), kVecs>;
  extern __shared__ __align__(kVecBytes) unsigned char ring_smem[];
  __shared__ float slots[2][kGroup / kWarp];  // the max's and the sum's
  const Ring ring(ring_smem);
  // The mask's kN bytes per vector, in a ring of the same slots after x's.
  uint8_t* mask_ring = ring_smem + stages * Ring::kStageBytes;
  const int lane = threadIdx.x % kGroup;
  const int64_t vectors = p.cols / kN;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  auto fetch = [&](int64_t row, int stage) {
    if (row >= p.rows) return;
    const uint8_t* mr = p.mask ? p.mask + row * p.mask_row_stride : nullptr;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t vec = lane + int64_t(i) * kGroup;
      if (vec < vectors) {
        cp_async_16(smem_u32(ring.slot(stage, i)), x + row * p.cols + vec * kN);
        if (mr) cp_async_ca<kN>(smem_u32(mask_ring + Ring::index(stage, i) * kN), mr + vec * kN);
      }
    }
  };
  // Uniform over the block when kGroup > 32 (one row per block): the
  // reductions synchronize.
  const int64_t first = first_row<kGroup>(), stride = row_stride<kGroup>();
  Ring::prologue(fetch, first, stride, stages);
  int stage = 0;
  for (int64_t row = first; row < p.rows; row += stride) {
    Ring::advance(fetch, row, stride, stages, stage);
    // Two phases, each one block reduction: the row max M over the kept
    // elements, then e = exp(x - M) (kept in registers) and their sum.
    // Cheaper than merging (max, sum) pairs: a pair merge costs two exps,
    // and a 1024-thread row merged 31 of them per thread.
    float e[kVecs][kN];
    uint32_t keep[kVecs];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t vec = lane + int64_t(i) * kGroup;
      keep[i] = 0;
      if (vec < vectors) {
        const Vec<T> v = *ring.slot(stage, i);
        keep[i] = mask_bits<kN>(p.mask ? mask_ring + Ring::index(stage, i) * kN : nullptr, 0);
#pragma unroll
        for (int j = 0; j < kN; ++j) e[i][j] = to_f32(v.v[j]);
        m = fmaxf(m, kept_max(e[i], keep[i]));
      }
    }
    // M = -inf: nothing kept (every e = 0, y = 0), or kept values all -inf
    // (exp(-inf + inf) = NaN, as jax). M = +inf, or a NaN among the kept
    // values, makes the sum and so the row NaN, as jax.
    m = group_reduce<kGroup>(m, slots[0], Max{});
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        e[i][j] = keep[i] >> j & 1u ? exp_for<T>(e[i][j] - m) : 0.f;
        s += e[i][j];
      }
    }
    const float factor = 1.f / group_reduce<kGroup>(s, slots[1], Sum{});
    T* yr = y + row * p.cols;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t vec = lane + int64_t(i) * kGroup;
      if (vec < vectors) {
        Vec<T> out;
#pragma unroll
        for (int j = 0; j < kN; ++j) out.v[j] = from_f32<T>(keep[i] >> j & 1u ? e[i][j] * factor : 0.f);
        store_vec(yr + vec * kN, out);
      }
    }
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
}

// Elements of a row before its first 16-byte boundary (kVec), else 0 vectors.
template <typename T, bool kVec>
__device__ __forceinline__ int64_t head_elems(const T* row, int64_t cols) {
  if constexpr (!kVec) {
    return cols;
  } else {
    const int64_t mis = (reinterpret_cast<uintptr_t>(row) % kVecBytes) / sizeof(T);
    const int64_t head = mis ? Vec<T>::kN - mis : 0;
    return head < cols ? head : cols;
  }
}

__device__ __forceinline__ bool kept_at(const uint8_t* mask_row, int64_t c) {
  return !mask_row || mask_row[c] != 0;
}

template <typename T, int kGroup, bool kVec>
__global__ void __launch_bounds__(block_threads<kGroup>())
    softmax_fwd_stream_kernel(const SoftmaxFwdParams p) {
  constexpr int kN = Vec<T>::kN;
  __shared__ MaxSum scratch[kGroup / kWarp];
  const int lane = threadIdx.x % kGroup;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  for (int64_t row = first_row<kGroup>(); row < p.rows; row += row_stride<kGroup>()) {
    const T* xr = x + row * p.cols;
    T* yr = y + row * p.cols;
    const uint8_t* mr = p.mask ? p.mask + row * p.mask_row_stride : nullptr;
    const int64_t head = head_elems<T, kVec>(xr, p.cols);
    const int64_t vectors = kVec ? (p.cols - head) / kN : 0;
    const int64_t tail = head + vectors * kN;
    // Online pass: scalar head and tail, then whole vectors.
    MaxSum st = {-CUDART_INF_F, 0.f};
    for (int64_t c = lane; c < head; c += kGroup)
      st = add_values<1>(st, {to_f32(xr[c])}, kept_at(mr, c));
    for (int64_t c = tail + lane; c < p.cols; c += kGroup)
      st = add_values<1>(st, {to_f32(xr[c])}, kept_at(mr, c));
#pragma unroll 4
    for (int64_t vec = lane; vec < vectors; vec += kGroup) {
      const int64_t c0 = head + vec * kN;
      const Vec<T> v = load_vec(xr + c0);
      float f[kN];
      uint32_t keep = 0;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        f[j] = to_f32(v.v[j]);
        keep |= uint32_t(kept_at(mr, c0 + j)) << j;
      }
      st = add_values(st, f, keep);
    }
    st = group_max_sum<kGroup>(st, scratch);
    const float inv = 1.f / st.s;
    // Write pass.
    for (int64_t c = lane; c < head; c += kGroup)
      yr[c] = from_f32<T>(output(to_f32(xr[c]), kept_at(mr, c), st, inv));
    for (int64_t c = tail + lane; c < p.cols; c += kGroup)
      yr[c] = from_f32<T>(output(to_f32(xr[c]), kept_at(mr, c), st, inv));
#pragma unroll 4
    for (int64_t vec = lane; vec < vectors; vec += kGroup) {
      const int64_t c0 = head + vec * kN;
      const Vec<T> v = load_vec(xr + c0);
      Vec<T> out;
#pragma unroll
      for (int j = 0; j < kN; ++j)
        out.v[j] = from_f32<T>(output(to_f32(v.v[j]), kept_at(mr, c0 + j), st, inv));
      store_vec(yr + c0, out);
    }
  }
}

// ----------------------------------------------------------------- backward
template <typename T, int kGroup, int kVecs>
__global__ void __launch_bounds__(block_threads<kGroup>())
    softmax_bwd_rows_kernel(const SoftmaxBwdParams p, const int stages) {
  constexpr int kN = Vec<T>::kN;
  using Ring = RowRing<T, block_threads<kGroup>(), kVecs>;
  extern __shared__ __align__(kVecBytes) unsigned char ring_smem[];
  __shared__ float slots[2][kGroup / kWarp];  // by row parity (group_reduce)
  const Ring y_ring(ring_smem), dy_ring(ring_smem + stages * Ring::kStageBytes);
  const int lane = threadIdx.x % kGroup;
  const int64_t vectors = p.cols / kN;
  const T* y = static_cast<const T*>(p.y);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  auto fetch = [&](int64_t row, int stage) {
    if (row >= p.rows) return;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t vec = lane + int64_t(i) * kGroup;
      if (vec < vectors) {
        cp_async_16(smem_u32(y_ring.slot(stage, i)), y + row * p.cols + vec * kN);
        cp_async_16(smem_u32(dy_ring.slot(stage, i)), dy + row * p.cols + vec * kN);
      }
    }
  };
  const int64_t first = first_row<kGroup>(), stride = row_stride<kGroup>();
  Ring::prologue(fetch, first, stride, stages);
  int stage = 0, parity = 0;
  for (int64_t row = first; row < p.rows; row += stride) {
    Ring::advance(fetch, row, stride, stages, stage);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (lane + i * kGroup < vectors) {
        const Vec<T> yv = *y_ring.slot(stage, i), gv = *dy_ring.slot(stage, i);
#pragma unroll
        for (int j = 0; j < kN; ++j) dot += to_f32(yv.v[j]) * to_f32(gv.v[j]);
      }
    }
    dot = group_reduce<kGroup>(dot, slots[parity], Sum{});
    parity ^= 1;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t vec = lane + int64_t(i) * kGroup;
      if (vec < vectors) {
        const Vec<T> yv = *y_ring.slot(stage, i), gv = *dy_ring.slot(stage, i);
        Vec<T> out;
#pragma unroll
        for (int j = 0; j < kN; ++j) out.v[j] = from_f32<T>(to_f32(yv.v[j]) * (to_f32(gv.v[j]) - dot));
        store_vec(dx + row * p.cols + vec * kN, out);
      }
    }
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
}

template <typename T, int kGroup, bool kVec>
__global__ void __launch_bounds__(block_threads<kGroup>())
    softmax_bwd_stream_kernel(const SoftmaxBwdParams p) {
  constexpr int kN = Vec<T>::kN;
  __shared__ float scratch[kGroup / kWarp];
  const int lane = threadIdx.x % kGroup;
  for (int64_t row = first_row<kGroup>(); row < p.rows; row += row_stride<kGroup>()) {
    const int64_t base = row * p.cols;
    const T* yr = static_cast<const T*>(p.y) + base;
    const T* gr = static_cast<const T*>(p.dy) + base;
    T* dr = static_cast<T*>(p.dx) + base;
    const int64_t head = head_elems<T, kVec>(yr, p.cols);
    const int64_t vectors = kVec ? (p.cols - head) / kN : 0;
    const int64_t tail = head + vectors * kN;
    float dot = 0.f;
    for (int64_t c = lane; c < head; c += kGroup) dot += to_f32(yr[c]) * to_f32(gr[c]);
    for (int64_t c = tail + lane; c < p.cols; c += kGroup) dot += to_f32(yr[c]) * to_f32(gr[c]);
#pragma unroll 4
    for (int64_t vec = lane; vec < vectors; vec += kGroup) {
      const Vec<T> a = load_vec(yr + head + vec * kN), b = load_vec(gr + head + vec * kN);
#pragma unroll
      for (int j = 0; j < kN; ++j) dot += to_f32(a.v[j]) * to_f32(b.v[j]);
    }
    dot = group_sum<kGroup>(dot, scratch);
    for (int64_t c = lane; c < head; c += kGroup)
      dr[c] = from_f32<T>(to_f32(yr[c]) * (to_f32(gr[c]) - dot));
    for (int64_t c = tail + lane; c < p.cols; c += kGroup)
      dr[c] = from_f32<T>(to_f32(yr[c]) * (to_f32(gr[c]) - dot));
#pragma unroll 4
    for (int64_t vec = lane; vec < vectors; vec += kGroup) {
      const int64_t c0 = head + vec * kN;
      const Vec<T> a = load_vec(yr + c0), b = load_vec(gr + c0);
      Vec<T> out;
#pragma unroll
      for (int j = 0; j < kN; ++j) out.v[j] = from_f32<T>(to_f32(a.v[j]) * (to_f32(b.v[j]) - dot));
      store_vec(dr + c0, out);
    }
  }
}

}  // namespace softmax
}  // namespace jaxcraft
