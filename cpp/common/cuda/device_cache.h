// Per-device integers the launchers ask for (SM counts, occupancy, cluster
// support), asked once per device: the queries cost host time on every launch
// otherwise. Neither they nor the cache synchronize or touch a stream.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

namespace jaxcraft {

constexpr int kMaxCachedDevices = 64;  // devices past this ask every time

// `cache` holds one value per device (0: not asked yet); query(device, &v)
// computes a missing one, which is then stored as max(v, 1).
template <typename Query>
cudaError_t per_device(std::atomic<int> (&cache)[kMaxCachedDevices], Query query, int* out) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < kMaxCachedDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) {
      *out = cached;
      return cudaSuccess;
    }
  }
  int value = 0;
  if ((err = query(device, &value)) != cudaSuccess) return err;
  value = std::max(value, 1);
  if (device < kMaxCachedDevices) cache[device].store(value, std::memory_order_relaxed);
  *out = value;
  return cudaSuccess;
}

// The current device's SM count.
inline cudaError_t multiprocessor_count(int* out) {
  static std::atomic<int> cache[kMaxCachedDevices];
  return per_device(cache, [](int device, int* v) {
    return cudaDeviceGetAttribute(v, cudaDevAttrMultiProcessorCount, device);
  }, out);
}

}  // namespace jaxcraft
