// Moving [rows x head_dim] tiles of 16-bit elements between global and
// shared memory. Shared tiles are row-major with kRowPad extra elements per
// row: a 16-byte pad shifts consecutive rows by 4 banks, so the 8 row
// addresses of every ldmatrix phase (and every 16-byte cp.async store) land
// in distinct banks for any head-dim bucket, including 32 and 96 where an
// XOR swizzle over 8 chunks would not fit the row.
#pragma once
#include <cstdint>

#include "kernels/attention/mma_sm80.cuh"

namespace jaxcraft {
namespace attn {

constexpr int kRowPad = kElemsPerCopy;

template <int kCols>
__host__ __device__ constexpr int padded_stride() {
  return kCols + kRowPad;
}

template <int kRows, int kCols>
__host__ __device__ constexpr int tile_bytes() {
  return kRows * padded_stride<kCols>() * 2;
}

// Async copy of a kRows x kCols tile whose row r starts at src + r * row_stride.
// Rows >= valid_rows and columns >= head_dim are zero-filled without being
// read (`fallback` is any valid address of the tensor, never dereferenced).
// Each thread keeps one global pointer and steps it by a fixed number of rows
// per copy, so the tile costs one 64-bit add per 16 bytes instead of a set of
// precomputed 64-bit addresses that the compiler would hoist out of the KV
// loop and hold in registers (or spill) for the whole kernel.
template <int kRows, int kCols, int kThreads, typename Elem>
__device__ __forceinline__ void load_tile_async(uint32_t dst, const Elem* src, int64_t row_stride,
                                                int valid_rows, int head_dim,
                                                const void* fallback, int tid) {
  constexpr int kChunks = kCols / kElemsPerCopy;
  constexpr int kTotal = kRows * kChunks;
  constexpr int kIters = (kTotal + kThreads - 1) / kThreads;
  if constexpr (kThreads % kChunks == 0) {
    constexpr int kRowsPerIter = kThreads / kChunks;
    const int r0 = tid / kChunks;
    const int c = (tid % kChunks) * kElemsPerCopy;
    const bool col_ok = c < head_dim;
    const Elem* p = src + r0 * row_stride + c;
    const int64_t step = kRowsPerIter * row_stride;
    uint32_t d = dst + (r0 * padded_stride<kCols>() + c) * 2;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int r = r0 + it * kRowsPerIter;
      if (kTotal % kThreads == 0 || r < kRows) {
        const bool ok = col_ok && r < valid_rows;
        cp_async_16(d, ok ? static_cast<const void*>(p) : fallback, ok);
      }
      p += step;
      d += kRowsPerIter * padded_stride<kCols>() * 2;
    }
  } else {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = it * kThreads + tid;
      if (kTotal % kThreads == 0 || i < kTotal) {
        const int r = i / kChunks;
        const int c = (i % kChunks) * kElemsPerCopy;
        const bool ok = r < valid_rows && c < head_dim;
        const void* p = ok ? static_cast<const void*>(src + r * row_stride + c) : fallback;
        cp_async_16(dst + (r * padded_stride<kCols>() + c) * 2, p, ok);
      }
    }
  }
}

// Copies rows [0, rows_out) of a shared tile to global memory; rows at or past
// zero_from are written as zeros (query rows past q_len). Only the first
// head_dim columns are written.
template <int kRows, int kCols, int kThreads, typename Elem>
__device__ __forceinline__ void store_tile(Elem* dst, int64_t row_stride, const Elem* src,
                                           int rows_out, int zero_from, int head_dim, int tid) {
  constexpr int kChunks = kCols / kElemsPerCopy;
  constexpr int kTotal = kRows * kChunks;
  constexpr int kIters = (kTotal + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * kThreads + tid;
    if (kTotal % kThreads == 0 || i < kTotal) {
      const int r = i / kChunks;
      const int c = (i % kChunks) * kElemsPerCopy;
      if (r < rows_out && c < head_dim) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < zero_from) v = *reinterpret_cast<const uint4*>(src + r * padded_stride<kCols>() + c);
        *reinterpret_cast<uint4*>(dst + r * row_stride + c) = v;
      }
    }
  }
}

// Writes a warp's C-layout accumulator slab [16 x 8*kTiles] (scaled) into a
// padded shared tile at (row0, col0) as 16-bit pairs.
template <DType kDt, int kTiles, typename Elem>
__device__ __forceinline__ void store_acc_slab(Elem* tile, int stride, int row0, int col0,
                                               const float (&acc)[kTiles][4], float scale,
                                               int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int c = col0 + j * kMmaN + 2 * t;
    *reinterpret_cast<uint32_t*>(tile + (row0 + g) * stride + c) =
        pack2<kDt>(acc[j][0] * scale, acc[j][1] * scale);
    *reinterpret_cast<uint32_t*>(tile + (row0 + g + 8) * stride + c) =
        pack2<kDt>(acc[j][2] * scale, acc[j][3] * scale);
  }
}

}  // namespace attn
}  // namespace jaxcraft
