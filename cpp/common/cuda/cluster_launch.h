// Host side of thread-block clusters (sm_90+; whether a kernel can run as
// clusters: runs_sm90_code): the launch configuration that groups a 1-D
// grid into clusters of `split` consecutive blocks.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "common/cuda/device_cache.h"
#include "common/cuda/sm90_code.h"

namespace jaxcraft {

// `blocks` blocks of `threads` threads in clusters of `split` (plain blocks
// when split == 1). Not copyable: the configuration points at its attribute.
class ClusterLaunch {
 public:
  ClusterLaunch(int split, int64_t blocks, int threads, size_t smem, cudaStream_t stream) {
    attr_.id = cudaLaunchAttributeClusterDimension;
    attr_.val.clusterDim.x = static_cast<unsigned>(split);
    attr_.val.clusterDim.y = 1;
    attr_.val.clusterDim.z = 1;
    config_.gridDim = dim3(static_cast<unsigned>(blocks));
    config_.blockDim = dim3(static_cast<unsigned>(threads));
    config_.dynamicSmemBytes = smem;
    config_.stream = stream;
    config_.attrs = &attr_;
    config_.numAttrs = split > 1 ? 1 : 0;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;

  template <typename... Params, typename... Args>
  cudaError_t launch(void (*kernel)(Params...), Args&&... args) const {
    return cudaLaunchKernelEx(&config_, kernel, std::forward<Args>(args)...);
  }

  // How many such clusters fit on the device at once.
  template <typename Kernel>
  cudaError_t max_active_clusters(Kernel* kernel, int* out) const {
    return cudaOccupancyMaxActiveClusters(out, kernel, &config_);
  }

 private:
  cudaLaunchAttribute attr_ = {};
  cudaLaunchConfig_t config_ = {};
};

// How many blocks of `kernel` (split == 1), or clusters of `split` of them,
// fit on the current device at once.
template <typename Kernel>
cudaError_t resident_groups(Kernel* kernel, int split, int threads, size_t smem, int* out) {
  if (split > 1) return ClusterLaunch(split, split, threads, smem, nullptr).max_active_clusters(kernel, out);
  int per_sm = 0, sms = 0;
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (err == cudaSuccess) err = multiprocessor_count(&sms);
  *out = per_sm * sms;
  return err;
}

}  // namespace jaxcraft
