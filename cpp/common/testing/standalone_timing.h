// Timing for the standalone kernel test programs (not the library): the
// time per launch of repeated launches, the device-to-device copy bandwidth the
// GB/s figures are compared with, and random data to time on.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/testing/standalone_check.h"

namespace jaxcraft_test {

// Milliseconds per call of `launch` (returning a cudaError_t): the median
// of three rounds of `reps` back-to-back calls, after a warm-up of reps / 2
// calls (at least 2), so that one round a stray stall lengthened does not
// move the number. (The activation test's first case, which reads ~8% slow,
// read the same with one warm-up call: its cause is elsewhere.)
template <class Launch>
float mean_launch_ms(Launch&& launch, int reps) {
  constexpr int kRounds = 3;
  cudaEvent_t t[kRounds + 1];
  for (cudaEvent_t& e : t) CHECK(cudaEventCreate(&e));
  for (int i = 0; i < std::max(2, reps / 2); ++i) CHECK(launch());
  CHECK(cudaEventRecord(t[0]));
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < reps; ++i) CHECK(launch());
    CHECK(cudaEventRecord(t[r + 1]));
  }
  CHECK(cudaEventSynchronize(t[kRounds]));
  float ms[kRounds];
  for (int r = 0; r < kRounds; ++r) CHECK(cudaEventElapsedTime(&ms[r], t[r], t[r + 1]));
  for (cudaEvent_t& e : t) CHECK(cudaEventDestroy(e));
  std::sort(ms, ms + kRounds);
  return ms[kRounds / 2] / reps;
}

// Timing data: a hash of the index, uniform in [-4, 4), filled on the device
// (gigabyte buffers; values do not change the work, but timing on zeros can
// flatter a kernel).
template <typename T>
__global__ void fill_random(T* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = T(float(h >> 8) * (8.f / 16777216.f) - 4.f);
  }
}

// GB/s of a 1 GiB device-to-device copy, counting bytes read and written.
inline float copy_bandwidth_gbps(int reps) {
  constexpr size_t kBytes = size_t(1) << 30;
  void *a, *b;
  CHECK(cudaMalloc(&a, kBytes));
  CHECK(cudaMalloc(&b, kBytes));
  const float ms = mean_launch_ms(
      [&] { return cudaMemcpyAsync(b, a, kBytes, cudaMemcpyDeviceToDevice); }, reps);
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return float(2.0 * kBytes / ms / 1e6);
}

}  // namespace jaxcraft_test
