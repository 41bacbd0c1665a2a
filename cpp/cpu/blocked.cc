// The tile loops of blocked.h, most of the CPU attention kernels' time.
// gemm keeps a 4 x 16 block of its result in registers over the whole
// depth, through GCC's generic vectors (104-118 GFLOP/s on one AVX2 core of
// a 2-core development machine, about its FMA peak; the attention forward
// and backward run 1.7-2.2x faster than with one dot product or one
// y += w x row per (query, key) pair, which loads and stores an operand per
// multiply-add). dot_rows, the decode kernel's, keeps 8 lanes of
// partial sums (four keys per pass ran 4x slower: GCC kept the 4 x 8 sums
// in memory). The selects of max_of vectorize only where compares may not
// trap (-fno-trapping-math, CMakeLists.txt).
#include "cpu/blocked.h"

#include "cpu/isa_clones.h"
#include "cpu/lane_reduce.h"

namespace jaxcraft {
namespace cpu {

namespace {

// kWidth floats as one of GCC's generic vectors: 8 for AVX2, 4 for SSE2
// and NEON. A vector wider than the target's registers is emulated through
// memory (8-float vectors ran 40x slower on the x86-64 baseline than on
// AVX2), so each ISA gets its own width.
template <int kWidth>
struct Lanes {
  typedef float Vec __attribute__((vector_size(4 * kWidth)));
};

// gemm's register block: rows [i, i + kRows) x columns [j, j + kWidth kVecs)
// of c, accumulated in registers over the whole depth: per k, kVecs loads
// of b's row, kRows broadcasts of a, kRows x kVecs multiply-adds. Inlined
// into each ISA's gemm, so that it is compiled for that ISA.
template <int kWidth, int kRows, int kVecs>
[[gnu::always_inline]] inline void gemm_block(int64_t i, int64_t j, int64_t depth,
                                              StridedMatrix a, const float* b, int64_t ldb,
                                              float alpha, bool accumulate, float* c,
                                              int64_t ldc) {
  using Vec = typename Lanes<kWidth>::Vec;
  Vec acc[kRows][kVecs] = {};
  const float* a_i = a.data + i * a.row;
  for (int64_t k = 0; k < depth; ++k) {
    Vec bk[kVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) __builtin_memcpy(&bk[v], b + k * ldb + j + v * kWidth, sizeof(Vec));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float x = a_i[r * a.row + k * a.col];  // broadcast by the product
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) acc[r][v] += x * bk[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      float* dst = c + (i + r) * ldc + j + v * kWidth;
      Vec out = alpha * acc[r][v];
      if (accumulate) {
        Vec old;
        __builtin_memcpy(&old, dst, sizeof(Vec));
        out += old;
      }
      __builtin_memcpy(dst, &out, sizeof(Vec));
    }
  }
}

// Columns [j, j + kWidth kVecs) of every row: blocks of kGemmRows rows, then
// the rows left one at a time.
constexpr int kGemmRows = 4;
template <int kWidth, int kVecs>
[[gnu::always_inline]] inline void gemm_columns(int64_t m, int64_t j, int64_t depth,
                                                StridedMatrix a, const float* b, int64_t ldb,
                                                float alpha, bool accumulate, float* c,
                                                int64_t ldc) {
  int64_t i = 0;
  for (; i + kGemmRows <= m; i += kGemmRows)
    gemm_block<kWidth, kGemmRows, kVecs>(i, j, depth, a, b, ldb, alpha, accumulate, c, ldc);
  for (; i < m; ++i) gemm_block<kWidth, 1, kVecs>(i, j, depth, a, b, ldb, alpha, accumulate, c, ldc);
}

// The whole product in blocks of 2 kWidth columns, then kWidth, then the
// last few (head dims that are not multiples of the lanes) one at a time.
template <int kWidth>
[[gnu::always_inline]] inline void gemm_width(int64_t m, int64_t n, int64_t depth,
                                              StridedMatrix a, const float* b, int64_t ldb,
                                              float alpha, bool accumulate, float* c,
                                              int64_t ldc) {
  int64_t j = 0;
  for (; j + 2 * kWidth <= n; j += 2 * kWidth)
    gemm_columns<kWidth, 2>(m, j, depth, a, b, ldb, alpha, accumulate, c, ldc);
  if (j + kWidth <= n) {
    gemm_columns<kWidth, 1>(m, j, depth, a, b, ldb, alpha, accumulate, c, ldc);
    j += kWidth;
  }
  for (; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      float sum = 0.f;
      for (int64_t k = 0; k < depth; ++k) sum += a.data[i * a.row + k * a.col] * b[k * ldb + j];
      float* dst = c + i * ldc + j;
      *dst = accumulate ? *dst + alpha * sum : alpha * sum;
    }
  }
}

#if defined(__GNUC__) && defined(__x86_64__)
#define JAXCRAFT_GEMM_AVX2 1
// AVX2 + FMA where the CPU has them (chosen at run time, as
// JAXCRAFT_CPU_CLONES does for the row loops below).
__attribute__((target("avx2,fma"))) void gemm_avx2(int64_t m, int64_t n, int64_t depth,
                                                   StridedMatrix a, const float* b, int64_t ldb,
                                                   float alpha, bool accumulate, float* c,
                                                   int64_t ldc) {
  gemm_width<8>(m, n, depth, a, b, ldb, alpha, accumulate, c, ldc);
}
#endif

}  // namespace

int gemm_lanes() {
#ifdef JAXCRAFT_GEMM_AVX2
  static const int lanes = [] {
    if (cpu_portable_forced()) return 4;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 8 : 4;
  }();
  return lanes;
#else
  return 4;
#endif
}

void gemm(int64_t m, int64_t n, int64_t depth, StridedMatrix a, const float* b, int64_t ldb,
          float alpha, bool accumulate, float* c, int64_t ldc) {
#ifdef JAXCRAFT_GEMM_AVX2
  if (gemm_lanes() == 8) return gemm_avx2(m, n, depth, a, b, ldb, alpha, accumulate, c, ldc);
#endif
  gemm_width<4>(m, n, depth, a, b, ldb, alpha, accumulate, c, ldc);
}

JAXCRAFT_CPU_CLONES void dot_rows(const float* x, const float* rows, int64_t n, int64_t c0,
                                  int64_t c1, float scale, float* out) {
  for (int64_t c = c0; c < c1; ++c) {
    const float* row = rows + c * n;
    out[c] = scale * lane_sum<8>(n, [&](int64_t h) { return x[h] * row[h]; });
  }
}

JAXCRAFT_CPU_CLONES float max_of(const float* __restrict__ v, int64_t n) {
  return lane_max(n, [&](int64_t c) { return v[c]; });
}

JAXCRAFT_CPU_CLONES float exp_shift_sum(float* __restrict__ v, int64_t n, float shift) {
  return lane_sum(n, [&](int64_t c) { return v[c] = exp_keep_nan(v[c] - shift); });
}

}  // namespace cpu
}  // namespace jaxcraft
