// Programmatic dependent launch (sm_90+): a kernel launched this way may be
// scheduled while the kernel before it in the stream still runs, so its
// launch latency overlaps that kernel's tail instead of following it.
// Such a kernel calls wait_for_prior_grid() before it touches global memory
// (reads what the previous kernel wrote, or writes what it may still read);
// the wait returns once that kernel has completed and its writes are
// visible. A kernel calls allow_dependent_grids() once the kernel after it
// may begin launching (the dependent's blocks start only after every block
// of this grid has called it or exited).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "common/cuda/device_cache.h"
#include "common/cuda/sm90_code.h"

namespace jaxcraft {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches kernel<<<grid, threads, smem, stream>>>(args...), as a dependent
// launch where `kernel` runs sm_90+ code (an image JIT-compiled from older
// PTX has no wait in it, so it must not start early).
// `cache`: the caller's per-device answer for this kernel (1 no, 2 yes).
template <typename... Params, typename... Args>
cudaError_t launch_dependent(std::atomic<int> (&cache)[kMaxCachedDevices], void (*kernel)(Params...),
                             dim3 grid, dim3 threads, size_t smem, cudaStream_t stream,
                             Args&&... args) {
  int early = 0;
  cudaError_t err = per_device(cache, [&](int device, int* v) {
    bool yes = false;
    const cudaError_t e = runs_sm90_code(kernel, device, &yes);
    *v = yes ? 2 : 1;
    return e;
  }, &early);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = threads;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = early == 2 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace jaxcraft
