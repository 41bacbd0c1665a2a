// CUDA kernels for softmax over the last axis of [rows, cols], memory-bound,
// float32 math whatever the storage type (norm_common.cuh's 16-byte vectors
// and conversions).
//
// Row statistics are one online pair per thread, (m, s): the maximum of the
// kept elements it saw and the sum of exp(x - m) over them; pairs combine as
//   m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m)
// (commutative bit for bit, so every lane of a butterfly ends with the same
// pair), with m = -inf meaning "nothing finite kept yet" (s then 0, or NaN
// from a NaN element, which propagates as in jax.nn.softmax).
//
// Two kernels per direction:
// - rows kernel: kGroup threads per row (a warp, or a whole block for wider
//   rows), each holding kVecs 16-byte vectors in registers: x is read once
//   and y written once (the backward: y and dy read once, dx written once).
//   Needs cols % (16 / sizeof(T)) == 0 and 16-byte aligned buffers.
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
// (kGroup > 32: one row per block) through `scratch` (one slot per warp). The
// last barrier lets the caller reuse `scratch` for its next row.
template <int kGroup>
__device__ __forceinline__ MaxSum group_max_sum(MaxSum v, MaxSum* scratch) {
  v = warp_max_sum(v);
  if constexpr (kGroup > kWarp) {
    constexpr int kWarps = kGroup / kWarp;
    if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = combine(v, scratch[w]);
    __syncthreads();
  }
  return v;
}

template <int kGroup>
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  v = norm::warp_sum<kWarp>(v);
  if constexpr (kGroup > kWarp) {
    constexpr int kWarps = kGroup / kWarp;
    if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v += scratch[w];
    __syncthreads();
  }
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
    softmax_fwd_rows_kernel(const SoftmaxFwdParams p) {
  constexpr int kN = Vec<T>::kN;
  __shared__ MaxSum scratch[kGroup / kWarp];
  const int lane = threadIdx.x % kGroup;
  const int64_t vectors = p.cols / kN;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  // Uniform over the block when kGroup > 32 (one row per block): the
  // reductions synchronize.
  for (int64_t row = first_row<kGroup>(); row < p.rows; row += row_stride<kGroup>()) {
    const T* xr = x + row * p.cols;
    const uint8_t* mr = p.mask ? p.mask + row * p.mask_row_stride : nullptr;
    // One exp per element: e = exp(x - this thread's max) stays in
    // registers, and y = e * exp(thread max - row max) / row sum.
    float e[kVecs][kN];
    uint32_t keep[kVecs];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t vec = lane + int64_t(i) * kGroup;
      keep[i] = 0;
      if (vec < vectors) {
        const Vec<T> v = load_vec(xr + vec * kN);
        keep[i] = mask_bits<kN>(mr, vec * kN);
#pragma unroll
        for (int j = 0; j < kN; ++j) e[i][j] = to_f32(v.v[j]);
        m = fmaxf(m, kept_max(e[i], keep[i]));
      }
    }
    const float shift = shift_of(m);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        e[i][j] = keep[i] >> j & 1u ? exp_for<T>(e[i][j] - shift) : 0.f;
        s += e[i][j];
      }
    }
    const MaxSum st = group_max_sum<kGroup>({m, s}, scratch);
    // A thread whose kept values are all -inf (e = 0) gives them
    // exp(-inf - row max) = 0, or NaN when the row max is -inf too (a kept
    // all -inf row is NaN in jax). A row max of +inf or a NaN sum makes the
    // factor NaN, as jax.
    const float factor = m != -CUDART_INF_F ? exp_for<T>(m - st.m) / st.s
                                            : (st.m == -CUDART_INF_F ? CUDART_NAN_F : 0.f);
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
    softmax_bwd_rows_kernel(const SoftmaxBwdParams p) {
  constexpr int kN = Vec<T>::kN;
  __shared__ float scratch[kGroup / kWarp];
  const int lane = threadIdx.x % kGroup;
  const int64_t vectors = p.cols / kN;
  const T* y = static_cast<const T*>(p.y);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  for (int64_t row = first_row<kGroup>(); row < p.rows; row += row_stride<kGroup>()) {
    const int64_t base = row * p.cols;
    Vec<T> yv[kVecs], gv[kVecs];
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t vec = lane + int64_t(i) * kGroup;
      if (vec < vectors) {
        yv[i] = load_vec(y + base + vec * kN);
        gv[i] = load_vec(dy + base + vec * kN);
      }
    }
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
      if (lane + i * kGroup < vectors)
#pragma unroll
        for (int j = 0; j < kN; ++j) dot += to_f32(yv[i].v[j]) * to_f32(gv[i].v[j]);
    dot = group_sum<kGroup>(dot, scratch);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t vec = lane + int64_t(i) * kGroup;
      if (vec < vectors) {
        Vec<T> out;
#pragma unroll
        for (int j = 0; j < kN; ++j)
          out.v[j] = from_f32<T>(to_f32(yv[i].v[j]) * (to_f32(gv[i].v[j]) - dot));
        store_vec(dx + base + vec * kN, out);
      }
    }
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
