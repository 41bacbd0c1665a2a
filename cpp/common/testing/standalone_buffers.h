// Device buffers and error bookkeeping for the standalone kernel tests.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/testing/standalone_check.h"
#include "common/testing/standalone_data.h"

namespace jaxcraft_test {

// `bytes` of device memory, poisoned (kPoison: NaN in every dtype) so that an
// output the kernel leaves unwritten fails, plus kSlack bytes past the end for
// views that start a few bytes in (the misaligned-pointer cases).
struct DeviceBuffer {
  static constexpr size_t kSlack = 16;
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    CHECK(cudaMalloc(&p, n + kSlack));
    CHECK(cudaMemset(p, kPoison, n + kSlack));
  }
  DeviceBuffer(const void* host, size_t n) : DeviceBuffer(n) {
    if (n) CHECK(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p); }
  // The view that starts `offset_bytes` in (at most kSlack).
  uint8_t* at(size_t offset_bytes) const { return static_cast<uint8_t*>(p) + offset_bytes; }
  // `bytes` bytes from `offset_bytes` on (at most kSlack), as T.
  template <typename T = uint8_t>
  std::vector<T> back(size_t offset_bytes = 0) const {
    std::vector<T> h(bytes / sizeof(T));
    if (!h.empty())
      CHECK(cudaMemcpy(h.data(), at(offset_bytes), h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Largest |got - ref| / tol(ref) over a tensor; > 1 fails (NaN fails too).
struct Err {
  double worst = 0;
  void add(double got, double ref, double tol) {
    const double e = std::fabs(got - ref) / tol;
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
};

// Prints " what=<worst>" (with "(FAIL)" past 1) and clears *all_ok on a failure.
inline bool report(const char* what, const Err& e, bool* all_ok) {
  const bool ok = e.worst <= 1.0;
  std::printf(" %s=%.2f%s", what, e.worst, ok ? "" : "(FAIL)");
  *all_ok &= ok;
  return ok;
}

}  // namespace jaxcraft_test
