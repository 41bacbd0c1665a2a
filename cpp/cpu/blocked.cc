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

// 8 floats: one AVX2 register in the x86-64-v3 clone, two SSE registers in
// the baseline one (GCC's generic vectors; a scalar operand is broadcast).
typedef float Vec8 __attribute__((vector_size(32)));
constexpr int kVec = 8;

// gemm's register block: rows [i, i + kRows) x columns [j, j + kVec kVecs)
// of c, accumulated in registers over the whole depth: per k, kVecs loads
// of b's row, kRows broadcasts of a, kRows x kVecs multiply-adds. (The
// attention kernels' products were one dot product or one y += w x row at
// a time, which load and store an operand per multiply-add.) Inlined into
// gemm's clones, so that it is compiled for each one's ISA.
template <int kRows, int kVecs>
[[gnu::always_inline]] inline void gemm_block(int64_t i, int64_t j, int64_t depth,
                                              StridedMatrix a, const float* b, int64_t ldb,
                                              float alpha, bool accumulate, float* c,
                                              int64_t ldc) {
  Vec8 acc[kRows][kVecs] = {};
  const float* a_i = a.data + i * a.row;
  for (int64_t k = 0; k < depth; ++k) {
    Vec8 bk[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) __builtin_memcpy(&bk[v], b + k * ldb + j + v * kVec, sizeof(Vec8));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float x = a_i[r * a.row + k * a.col];
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[r][v] += x * bk[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      float* dst = c + (i + r) * ldc + j + v * kVec;
      Vec8 out = alpha * acc[r][v];
      if (accumulate) {
        Vec8 old;
        __builtin_memcpy(&old, dst, sizeof(Vec8));
        out += old;
      }
      __builtin_memcpy(dst, &out, sizeof(Vec8));
    }
  }
}

// Columns [j, j + kVec kVecs) of every row: blocks of kGemmRows rows, then
// the rows left one at a time.
constexpr int kGemmRows = 4;
template <int kVecs>
[[gnu::always_inline]] inline void gemm_columns(int64_t m, int64_t j, int64_t depth,
                                                StridedMatrix a, const float* b, int64_t ldb,
                                                float alpha, bool accumulate, float* c,
                                                int64_t ldc) {
  int64_t i = 0;
  for (; i + kGemmRows <= m; i += kGemmRows)
    gemm_block<kGemmRows, kVecs>(i, j, depth, a, b, ldb, alpha, accumulate, c, ldc);
  for (; i < m; ++i) gemm_block<1, kVecs>(i, j, depth, a, b, ldb, alpha, accumulate, c, ldc);
}

}  // namespace

JAXCRAFT_CPU_CLONES void gemm(int64_t m, int64_t n, int64_t depth, StridedMatrix a,
                              const float* b, int64_t ldb, float alpha, bool accumulate, float* c,
                              int64_t ldc) {
  int64_t j = 0;
  for (; j + 2 * kVec <= n; j += 2 * kVec)
    gemm_columns<2>(m, j, depth, a, b, ldb, alpha, accumulate, c, ldc);
  if (j + kVec <= n) {
    gemm_columns<1>(m, j, depth, a, b, ldb, alpha, accumulate, c, ldc);
    j += kVec;
  }
  for (; j < n; ++j) {  // the last n % 8 columns (head dims that are not multiples of 8)
    for (int64_t i = 0; i < m; ++i) {
      float sum = 0.f;
      for (int64_t k = 0; k < depth; ++k) sum += a.data[i * a.row + k * a.col] * b[k * ldb + j];
      float* dst = c + i * ldc + j;
      *dst = accumulate ? *dst + alpha * sum : alpha * sum;
    }
  }
}

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
