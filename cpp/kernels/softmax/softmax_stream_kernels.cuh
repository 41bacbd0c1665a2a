// Softmax stream kernels: any width and alignment. kGroup threads per row
// walk it twice from global memory (online pass, then the write pass; the
// second read mostly hits L2 while a block's row is <= a few hundred KB).
// Vector loads between a scalar head (up to the first 16-byte boundary) and
// a scalar tail, when x and y (dy, dx) are 16-byte aligned (then every row
// of them has the same misalignment).
//
// Row statistics are one online pair per thread, (m, s): the maximum of the
// kept elements it saw and the sum of exp(x - m) over them; pairs combine as
//   m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m)
// (commutative bit for bit, so every lane of a butterfly ends with the same
// pair), with m = -inf meaning "nothing finite kept yet" (s then 0, or NaN
// from a NaN element, which propagates as in jax.nn.softmax). These kernels
// keep expf: with __expf the 4k x 128k bf16 forward measures 15% slower.
#pragma once
#include "kernels/softmax/softmax_common.cuh"

namespace jaxcraft {
namespace softmax {

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
// (kGroup > 32: one row per block) through `scratch`
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

// The shift to subtract before exp: the maximum, or 0 when nothing finite is
// kept (exp(-inf - 0) = 0, where -inf - -inf would be NaN).
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

// y = kept ? exp(x - m) * inv : 0 (m = -inf with something kept: NaN, as jax).
__device__ __forceinline__ float output(float x, bool kept, MaxSum st, float inv) {
  return kept ? expf(x - st.m) * inv : 0.f;
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

// f(c) for each of this lane's scalar columns: the head [0, head) and the
// tail [tail, cols) that the vector loop does not cover.
template <int kGroup, typename F>
__device__ __forceinline__ void for_scalar_cols(int lane, int64_t head, int64_t tail, int64_t cols,
                                                F f) {
  for (int64_t c = lane; c < head; c += kGroup) f(c);
  for (int64_t c = tail + lane; c < cols; c += kGroup) f(c);
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
    for_scalar_cols<kGroup>(lane, head, tail, p.cols, [&](int64_t c) {
      st = add_values<1>(st, {to_f32(xr[c])}, kept_at(mr, c));
    });
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
    for_scalar_cols<kGroup>(lane, head, tail, p.cols, [&](int64_t c) {
      yr[c] = from_f32<T>(output(to_f32(xr[c]), kept_at(mr, c), st, inv));
    });
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
    for_scalar_cols<kGroup>(lane, head, tail, p.cols,
                            [&](int64_t c) { dot += to_f32(yr[c]) * to_f32(gr[c]); });
#pragma unroll 4
    for (int64_t vec = lane; vec < vectors; vec += kGroup) {
      const Vec<T> a = load_vec(yr + head + vec * kN), b = load_vec(gr + head + vec * kN);
#pragma unroll
      for (int j = 0; j < kN; ++j) dot += to_f32(a.v[j]) * to_f32(b.v[j]);
    }
    dot = group_sum<kGroup>(dot, scratch);
    for_scalar_cols<kGroup>(lane, head, tail, p.cols, [&](int64_t c) {
      dr[c] = from_f32<T>(to_f32(yr[c]) * (to_f32(gr[c]) - dot));
    });
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
