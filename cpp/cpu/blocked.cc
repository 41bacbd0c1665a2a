// The tile loops of blocked.h. They are most of the CPU attention kernels'
// time: per visible (query, key) pair one dot product and one or two
// multiply-add rows of head_dim. add_weighted_rows takes four rows per pass,
// so that the accumulator row is loaded and stored once per four keys
// instead of once per key (2.2x faster at head dim 64 and 128 with AVX2; a
// dot_rows that took four keys per pass the same way ran 4x slower: GCC
// kept its 4 x 8 partial sums in memory, and with GCC's vector extension
// for them it was no faster than this one). The selects of max_of vectorize
// only where compares may not trap (-fno-trapping-math, CMakeLists.txt).
#include "cpu/blocked.h"

#include "cpu/isa_clones.h"

namespace jaxcraft {
namespace cpu {

namespace {

// Independent partial sums in dot(): without -ffast-math the compiler may not
// reassociate a single float accumulator, but it does vectorize these lanes.
constexpr int kDotLanes = 8;

inline float dot(const float* a, const float* b, int64_t n) {
  float partial[kDotLanes] = {};
  int64_t h = 0;
  for (; h + kDotLanes <= n; h += kDotLanes) {
    for (int lane = 0; lane < kDotLanes; ++lane) partial[lane] += a[h + lane] * b[h + lane];
  }
  float sum = 0.f;
  for (; h < n; ++h) sum += a[h] * b[h];
  for (int lane = 0; lane < kDotLanes; ++lane) sum += partial[lane];
  return sum;
}

}  // namespace

constexpr int64_t kKeys = 4;  // rows per pass of add_weighted_rows
constexpr int kLanes = 16;    // partial results of max_of and exp_shift_sum

JAXCRAFT_CPU_CLONES float max_of(const float* __restrict__ v, int64_t n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = kNegInf;
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = v[c + l] > acc[l] ? v[c + l] : acc[l];
  for (; c < n; ++c) acc[0] = v[c] > acc[0] ? v[c] : acc[0];
  float m = kNegInf;
  for (int l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

JAXCRAFT_CPU_CLONES float exp_shift_sum(float* __restrict__ v, int64_t n, float shift) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      v[c + l] = exp_keep_nan(v[c + l] - shift);
      acc[l] += v[c + l];
    }
  for (; c < n; ++c) {
    v[c] = exp_keep_nan(v[c] - shift);
    acc[0] += v[c];
  }
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

JAXCRAFT_CPU_CLONES void dot_rows(const float* x, const float* rows, int64_t n, int64_t c0,
                                  int64_t c1, float scale, float* out) {
  for (int64_t c = c0; c < c1; ++c) out[c] = scale * dot(x, rows + c * n, n);
}

JAXCRAFT_CPU_CLONES void add_weighted_rows(const float* w, const float* rows, int64_t n,
                                           int64_t c0, int64_t c1, float* acc) {
  int64_t c = c0;
  for (; c + kKeys <= c1; c += kKeys) {
    const float* r0 = rows + c * n;
    const float* r1 = r0 + n;
    const float* r2 = r1 + n;
    const float* r3 = r2 + n;
    for (int64_t h = 0; h < n; ++h) {
      float a = acc[h];
      a += w[c] * r0[h];
      a += w[c + 1] * r1[h];
      a += w[c + 2] * r2[h];
      a += w[c + 3] * r3[h];
      acc[h] = a;
    }
  }
  for (; c < c1; ++c) {
    const float* r = rows + c * n;
    for (int64_t h = 0; h < n; ++h) acc[h] += w[c] * r[h];
  }
}

JAXCRAFT_CPU_CLONES void add_to_rows(const float* w, const float* x, float* rows, int64_t n,
                                     int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) {
    float* r = rows + c * n;
    for (int64_t h = 0; h < n; ++h) r[h] += w[c] * x[h];
  }
}

}  // namespace cpu
}  // namespace jaxcraft
