// CUDA kernels for gelu / bias_gelu / swiglu / geglu: elementwise over
// [rows, cols] outputs, memory-bound. Each thread owns kN consecutive columns
// (one 16-byte vector of the storage type, or one element on the scalar
// path) and walks rows; gated ops read the two halves a = x[r, :cols] and
// b = x[r, cols:] of each input row. Math in float32
// (activation_math.h). Blocks are (tx, ty) with tx * ty = kBlockThreads:
// tx threads across the row, ty rows side by side (narrow rows).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/convert.cuh"
#include "contract/activations.h"
#include "math/activation_math.h"

namespace jaxcraft {
namespace activation {

constexpr int kBlockThreads = 256;
constexpr int kVecBytes = 16;  // one LDG.128 / STG.128 per vector
// At least 4 blocks of 256 threads per SM (half of the 2048-thread limit):
// caps the kernels at 64 registers. Uncapped, the backward took ~120 (the
// math of 2 rows x kN elements interleaved) and only 2 blocks fit.
constexpr int kMinBlocksPerSM = 4;
// Rows a thread loads before it computes any. HBM3 needs ~20-40 KB of loads
// in flight per SM; with 1024+ threads per SM, the forward's 2 rows x 1-2
// 16-byte loads give 32-64 KB, the backward's 1 row x 2-3 loads 32-48 KB
// (2 rows spilled registers at the 64-register cap). The ungated forwards
// take 4 rows, in chunks of 4 rows (one round of loads per thread;
// launch_activations.cu). H200, bf16: gelu [16k, 4096] 77.0 -> 75.5 us,
// [16k, 14336] 236.7 -> 228.5; bias_gelu 71.9 -> 68.7, 243.8 -> 237.1; the
// erf form (since its one-reciprocal CDF) 261.2 -> 254.5 at 14336. At 4
// rows the gated forms spill 92-102 bytes (their forward ran twice as long).
template <bool kGated>
constexpr int kFwdRowsInFlight = kGated ? 2 : 4;
constexpr int kBwdRowsInFlight = 1;

// The math a kernel on storage type T runs: Act, but the erf form without
// exp(-x^2)'s rounding corrections for 16-bit outputs (activation_device_math.h).
template <Activation kAct, typename T>
using KernelAct = std::conditional_t<kAct == Activation::kGeluErf && sizeof(T) == 2,
                                     GeluErf<false>, Act<kAct>>;

// Elements per thread on the vector path: one 16-byte access.
template <typename T>
constexpr int kVecElems = kVecBytes / sizeof(T);

// kN elements of T moved as one access (16 bytes on the vector path).
template <typename T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};

template <typename T, int kN>
__device__ __forceinline__ Pack<T, kN> load(const T* p) {
  return *reinterpret_cast<const Pack<T, kN>*>(p);
}

template <typename T, int kN>
__device__ __forceinline__ float elem(const Pack<T, kN>& pack, int i) {
  return to_f32(pack.v[i]);
}

template <typename T, int kN>
__device__ __forceinline__ void store(T* p, const float (&in)[kN]) {
  Pack<T, kN> pack;
#pragma unroll
  for (int i = 0; i < kN; ++i) pack.v[i] = from_f32<T>(in[i]);
  *reinterpret_cast<Pack<T, kN>*>(p) = pack;
}

// kN float32 values (bias, partial sums): 16-byte chunks where kN allows
// (the vector paths: kN = 4 or 8), else one at a time.
constexpr int kF32Chunk = kVecBytes / sizeof(float);

template <int kN>
__device__ __forceinline__ void load_f32(const float* p, float (&out)[kN]) {
  if constexpr (kN % kF32Chunk == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += kF32Chunk) {
      const Pack<float, kF32Chunk> pack = *reinterpret_cast<const Pack<float, kF32Chunk>*>(p + i);
#pragma unroll
      for (int k = 0; k < kF32Chunk; ++k) out[i + k] = pack.v[k];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = p[i];
  }
}

template <int kN>
__device__ __forceinline__ void store_f32(float* p, const float (&in)[kN]) {
  if constexpr (kN % kF32Chunk == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += kF32Chunk) {
      Pack<float, kF32Chunk> pack;
#pragma unroll
      for (int k = 0; k < kF32Chunk; ++k) pack.v[k] = in[i + k];
      *reinterpret_cast<Pack<float, kF32Chunk>*>(p + i) = pack;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) p[i] = in[i];
  }
}

// Rows are cut into `num_chunks` chunks of `rows_per_chunk` consecutive rows;
// block row blockIdx.y takes chunks blockIdx.y, + gridDim.y, ... (grid-stride),
// and within a chunk thread row threadIdx.y takes rows threadIdx.y, + ty, ...
// In the backward with a bias gradient, chunk p is partial sum p.
// kGated is a template parameter (p.gated must agree): the gated kernels hold
// no bias or sums, the others no second half, which keeps both within the
// register cap.

template <typename T, Activation kAct, bool kGated, int kN>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    activation_fwd_kernel(const ActivationFwdParams p, const int64_t rows_per_chunk,
                          const int64_t num_chunks) {
  const int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kN;
  if (col >= p.cols) return;
  const int64_t cols = p.cols, in_stride = kGated ? 2 * cols : cols;
  const T* __restrict__ x = static_cast<const T*>(p.x) + col;
  T* __restrict__ y = static_cast<T*>(p.y) + col;
  float bias[kN] = {};
  if (!kGated && p.bias) load_f32(p.bias + col, bias);
  constexpr int kRows = kFwdRowsInFlight<kGated>;
  for (int64_t chunk = blockIdx.y; chunk < num_chunks; chunk += gridDim.y) {
    const int64_t begin = chunk * rows_per_chunk;
    const int64_t end = begin + rows_per_chunk < p.rows ? begin + rows_per_chunk : p.rows;
    for (int64_t r0 = begin + threadIdx.y; r0 < end; r0 += kRows * blockDim.y) {
      // Raw storage-type vectors: 16-bit types hold half the registers of floats.
      Pack<T, kN> a[kRows], b[kRows];
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int64_t r = r0 + k * blockDim.y;
        if (r < end) {
          a[k] = load<T, kN>(x + r * in_stride);
          if constexpr (kGated) b[k] = load<T, kN>(x + r * in_stride + cols);
        }
      }
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int64_t r = r0 + k * blockDim.y;
        if (r >= end) break;
        float out[kN];
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          if constexpr (kGated) {
            out[i] = KernelAct<kAct, T>::value(elem(a[k], i)) * elem(b[k], i);
          } else {
            out[i] = KernelAct<kAct, T>::value(elem(a[k], i) + bias[i]);
          }
        }
        store(y + r * cols, out);
      }
    }
  }
}

// With p.dbias_partial (ungated), each thread sums its columns' gradients over
// its rows of a chunk in row order; the block's ty row-threads then fold in a
// fixed order through shared memory, and thread row 0 writes partial row
// `chunk`. No atomics: the result is bitwise reproducible.
template <typename T, Activation kAct, bool kGated, int kN>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM)
    activation_bwd_kernel(const ActivationBwdParams p, const int64_t rows_per_chunk,
                          const int64_t num_chunks) {
  const int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kN;
  const bool active = col < p.cols;  // inactive threads still meet the fold's barriers
  const int64_t cols = p.cols, in_stride = kGated ? 2 * cols : cols;
  const T* __restrict__ dy = static_cast<const T*>(p.dy) + col;
  const T* __restrict__ x = static_cast<const T*>(p.x) + col;
  T* __restrict__ dx = static_cast<T*>(p.dx) + col;
  float bias[kN] = {};
  if (!kGated && active && p.bias) load_f32(p.bias + col, bias);
  for (int64_t chunk = blockIdx.y; chunk < num_chunks; chunk += gridDim.y) {
    const int64_t begin = chunk * rows_per_chunk;
    const int64_t end = begin + rows_per_chunk < p.rows ? begin + rows_per_chunk : p.rows;
    float sums[kN] = {};
    for (int64_t r0 = begin + threadIdx.y; active && r0 < end; r0 += kBwdRowsInFlight * blockDim.y) {
      Pack<T, kN> g[kBwdRowsInFlight], a[kBwdRowsInFlight], b[kBwdRowsInFlight];
#pragma unroll
      for (int k = 0; k < kBwdRowsInFlight; ++k) {
        const int64_t r = r0 + k * blockDim.y;
        if (r < end) {
          g[k] = load<T, kN>(dy + r * cols);
          a[k] = load<T, kN>(x + r * in_stride);
          if constexpr (kGated) b[k] = load<T, kN>(x + r * in_stride + cols);
        }
      }
#pragma unroll
      for (int k = 0; k < kBwdRowsInFlight; ++k) {
        const int64_t r = r0 + k * blockDim.y;
        if (r >= end) break;
        float da[kN], db[kN];
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          float grad;
          const float gi = elem(g[k], i);
          if constexpr (kGated) {
            const float f = KernelAct<kAct, T>::value_and_grad(elem(a[k], i), grad);
            da[i] = gi * elem(b[k], i) * grad;
            db[i] = gi * f;
          } else {
            KernelAct<kAct, T>::value_and_grad(elem(a[k], i) + bias[i], grad);
            da[i] = gi * grad;
            sums[i] += da[i];
          }
        }
        store(dx + r * in_stride, da);
        if constexpr (kGated) store(dx + r * in_stride + cols, db);
      }
    }
    if constexpr (!kGated) {
      if (p.dbias_partial) {  // uniform over the grid: every thread takes the barriers
        __shared__ float fold[kN][kBlockThreads];  // [element][thread]: no bank conflicts
        if (blockDim.y > 1) {
          const int tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
          for (int i = 0; i < kN; ++i) fold[i][tid] = sums[i];
          __syncthreads();
          if (threadIdx.y == 0) {
            for (int ty = 1; ty < blockDim.y; ++ty)
#pragma unroll
              for (int i = 0; i < kN; ++i) sums[i] += fold[i][ty * blockDim.x + threadIdx.x];
          }
          __syncthreads();  // the next chunk rewrites `fold`
        }
        if (threadIdx.y == 0 && active) store_f32(p.dbias_partial + chunk * cols + col, sums);
      }
    }
  }
}

}  // namespace activation
}  // namespace jaxcraft
