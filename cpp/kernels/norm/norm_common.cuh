// Device helpers shared by the norm kernels: typed 16-byte vectors and
// deterministic (fixed-order) reductions over a group of threads.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/convert.cuh"

namespace jaxcraft {
namespace norm {

constexpr int kWarp = 32;
constexpr int kVecBytes = 16;  // one LDG.128 / STG.128 per vector

// kN elements of T moved as one 16-byte access.
template <typename T>
struct alignas(kVecBytes) Vec {
  static constexpr int kN = kVecBytes / sizeof(T);
  T v[kN];
};

template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T>*>(p);
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T>& vec) {
  *reinterpret_cast<Vec<T>*>(p) = vec;
}

template <typename T>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[Vec<T>::kN]) {
  const Vec<T> vec = load_vec(p);
#pragma unroll
  for (int i = 0; i < Vec<T>::kN; ++i) out[i] = to_f32(vec.v[i]);
}

template <typename T>
__device__ __forceinline__ void store_f32(T* p, const float (&in)[Vec<T>::kN]) {
  Vec<T> vec;
#pragma unroll
  for (int i = 0; i < Vec<T>::kN; ++i) vec.v[i] = from_f32<T>(in[i]);
  store_vec(p, vec);
}

// Asks L2 to fetch [p, p + bytes) (16-byte aligned, a multiple of 16 bytes):
// on sm_90 one bulk-copy-engine request that writes no registers, so a block
// can start on its next rows before it waits at a barrier. Older GPUs: nothing.
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(uint32_t(bytes)));
#endif
}

// kN float32 parameters (scale, bias) for a vector of kN elements of T.
template <int kN>
__device__ __forceinline__ void load_params(const float* p, float (&out)[kN]) {
  constexpr int kChunk = Vec<float>::kN;
  static_assert(kN % kChunk == 0, "parameter loads are whole 16-byte vectors");
#pragma unroll
  for (int i = 0; i < kN; i += kChunk) {
    const Vec<float> vec = *reinterpret_cast<const Vec<float>*>(p + i);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) out[i + j] = vec.v[j];
  }
}

template <int kLanes>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sums over the kGroup consecutive threads that share a row, kValues at once.
// For groups wider than a warp, warps meet in `scratch` (kValues floats per
// warp of the block); every thread of the block must call it (it synchronizes)
// and `scratch` must not be reused before the next __syncthreads.
template <int kGroup, int kValues>
__device__ __forceinline__ void group_sums(float (&v)[kValues], float* scratch) {
  constexpr int kLanes = kGroup < kWarp ? kGroup : kWarp;
#pragma unroll
  for (int k = 0; k < kValues; ++k) v[k] = warp_sum<kLanes>(v[k]);
  if constexpr (kGroup > kWarp) {
    constexpr int kWarpsPerGroup = kGroup / kWarp;
    const int warp = threadIdx.x / kWarp;
    if (threadIdx.x % kWarp == 0) {
#pragma unroll
      for (int k = 0; k < kValues; ++k) scratch[warp * kValues + k] = v[k];
    }
    __syncthreads();
    const int first_warp = threadIdx.x / kGroup * kWarpsPerGroup;
#pragma unroll
    for (int k = 0; k < kValues; ++k) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kWarpsPerGroup; ++w) total += scratch[(first_warp + w) * kValues + k];
      v[k] = total;
    }
  }
}

template <int kGroup>
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  float sums[1] = {v};
  group_sums<kGroup>(sums, scratch);
  return sums[0];
}

}  // namespace norm
}  // namespace jaxcraft
