// Host-side test data for the standalone kernel test programs (not the
// library): dtype sizes and names, float <-> 16-bit conversion into byte
// buffers, a small reproducible random generator.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "contract/dtype.h"

namespace jaxcraft_test {

using jaxcraft::DType;

constexpr uint8_t kPoison = 0xff;  // NaN in every dtype: unwritten outputs fail

inline size_t dsize(DType dt) { return dt == DType::kF32 ? 4 : 2; }
inline const char* dname(DType dt) {
  return dt == DType::kF32 ? "f32" : dt == DType::kBF16 ? "bf16" : "f16";
}

// Stores float x as dtype dt at element i of bytes; returns the stored value.
inline double put(std::vector<uint8_t>& bytes, size_t i, float x, DType dt) {
  if (dt == DType::kF32) {
    std::memcpy(&bytes[i * 4], &x, 4);
    return x;
  }
  if (dt == DType::kBF16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    std::memcpy(&bytes[i * 2], &h, 2);
    return __bfloat162float(h);
  }
  const __half h = __float2half_rn(x);
  std::memcpy(&bytes[i * 2], &h, 2);
  return __half2float(h);
}

// Element i of bytes (dtype dt) as a double.
inline double get(const std::vector<uint8_t>& bytes, size_t i, DType dt) {
  if (dt == DType::kF32) {
    float x;
    std::memcpy(&x, &bytes[i * 4], 4);
    return x;
  }
  uint16_t b;
  std::memcpy(&b, &bytes[i * 2], 2);
  if (dt == DType::kBF16) return __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&b));
  return __half2float(*reinterpret_cast<__half*>(&b));
}

// splitmix64: reproducible across platforms and quick enough for tens of
// millions of elements.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s += 0x9e3779b97f4a7c15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) / double(1ull << 53); }
  // Near-normal (sum of 4 uniforms, Irwin-Hall, rescaled; within +-3.5).
  float normal() {
    constexpr double kIrwinHallStd = 0.5773502691896258;  // sqrt(4 / 12)
    return float((uniform() + uniform() + uniform() + uniform() - 2.0) / kIrwinHallStd);
  }
  // Normal with unbounded tails (Box-Muller).
  double gaussian() {
    const double u = std::max(uniform(), 1e-300), v = uniform();
    return std::sqrt(-2 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo)); }
};

}  // namespace jaxcraft_test
