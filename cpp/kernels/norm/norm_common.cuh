// Device helpers shared by the norm kernels: typed 16-byte vectors and
// deterministic (fixed-order) reductions over a group of threads.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace jaxcraft {
namespace norm {

constexpr int kWarp = 32;
constexpr int kVecBytes = 16;  // one LDG.128 / STG.128 per vector

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// kN elements of T moved as one 16-byte access.
template <typename T>
struct alignas(kVecBytes) Vec {
  static constexpr int kN = kVecBytes / sizeof(T);
  T v[kN];
};

template <typename T>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[Vec<T>::kN]) {
  const Vec<T> vec = *reinterpret_cast<const Vec<T>*>(p);
#pragma unroll
  for (int i = 0; i < Vec<T>::kN; ++i) out[i] = to_f32(vec.v[i]);
}

template <typename T>
__device__ __forceinline__ void store_f32(T* p, const float (&in)[Vec<T>::kN]) {
  Vec<T> vec;
#pragma unroll
  for (int i = 0; i < Vec<T>::kN; ++i) vec.v[i] = from_f32<T>(in[i]);
  *reinterpret_cast<Vec<T>*>(p) = vec;
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

// Rounds through T: the fused residual add is defined in the input dtype.
template <typename T>
__device__ __forceinline__ float round_to(float x) { return to_f32(from_f32<T>(x)); }

template <int kLanes>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the kGroup consecutive threads that share a row. For groups wider
// than a warp, warps meet in `scratch` (kGroup / 32 floats per group); every
// thread of the block must call it (it synchronizes) and `scratch` must not be
// reused before the next __syncthreads.
template <int kGroup>
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  constexpr int kLanes = kGroup < kWarp ? kGroup : kWarp;
  v = warp_sum<kLanes>(v);
  if constexpr (kGroup <= kWarp) {
    return v;
  } else {
    constexpr int kWarpsPerGroup = kGroup / kWarp;
    const int group = threadIdx.x / kGroup;
    const int warp_in_group = (threadIdx.x % kGroup) / kWarp;
    if (threadIdx.x % kWarp == 0) scratch[group * kWarpsPerGroup + warp_in_group] = v;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarpsPerGroup; ++w) total += scratch[group * kWarpsPerGroup + w];
    return total;
  }
}

}  // namespace norm
}  // namespace jaxcraft
