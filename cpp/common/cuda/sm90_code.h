// Whether a kernel runs code built for sm_90+ on a device: features such as
// thread-block clusters and programmatic dependent launch exist only there,
// and a newer GPU may instead JIT the kernel's older PTX, in which those
// parts compiled to nothing.
#pragma once
#include <cuda_runtime.h>

namespace jaxcraft {

template <typename Kernel>
cudaError_t runs_sm90_code(Kernel* kernel, int device, bool* out) {
  int major = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  *out = false;
  if (major < 9) return cudaSuccess;
  cudaFuncAttributes attrs;
  if ((err = cudaFuncGetAttributes(&attrs, kernel)) != cudaSuccess) return err;
  *out = attrs.ptxVersion >= 90;
  return cudaSuccess;
}

}  // namespace jaxcraft
