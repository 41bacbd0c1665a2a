// Conversions between the storage types and float32, the kernels' arithmetic
// type (round to nearest even on the way back).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "contract/dtype.h"

namespace jaxcraft {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// dispatch_dtype over CUDA's storage types; cudaErrorInvalidValue outside the enum.
template <typename Fn>
cudaError_t dispatch_cuda_dtype(DType dtype, Fn&& fn) {
  return dispatch_dtype<__nv_bfloat16, __half>(dtype, fn, cudaErrorInvalidValue);
}

}  // namespace jaxcraft
