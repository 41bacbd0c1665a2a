// Pieces shared by the blocked CPU attention kernels (attention.cc,
// decode_attention.cc): tile products, the online softmax's row steps
// (its loops also softmax.cc's), key intervals, and the work-item threading
// over XLA's pool.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>

#include "cpu/parallel.h"
#include "math/activation_math.h"

namespace jaxcraft {
namespace cpu {

// Below about this many multiply-adds per thread, starting a thread costs
// more than it saves.
constexpr double kMinWorkPerThread = double{1 << 20};

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// exp that keeps NaN (host_expf, the vectorizable exp, maps it to a tiny
// value): exp(-inf - -inf) = NaN, as jax.nn computes it.
inline float exp_keep_nan(float x) { return x != x ? x : activation::host_expf(x); }

// Loops over a row of logits, compiled for AVX2 + FMA and the baseline
// (cpu/isa_clones.h), with 16 lanes of partial results so that they
// vectorize. The largest of v[0, n) (-inf when n = 0); NaNs are skipped
// (they reach the sum below).
float max_of(const float* v, int64_t n);
// v[c] = exp_keep_nan(v[c] - shift) in place; returns their sum.
float exp_shift_sum(float* v, int64_t n, float shift);

// out[c] = scale * (x . row c) for the rows c in [c0, c1) of a tile (row c
// at rows + c * n), each a dot product with 8 lanes of partial sums
// (cpu/lane_reduce.h), compiled for AVX2 + FMA and the baseline
// (cpu/isa_clones.h): a row of logits, for the few query rows of a decode
// step (gemm below needs the keys transposed, which costs more there than
// it saves).
void dot_rows(const float* x, const float* rows, int64_t n, int64_t c0, int64_t c1, float scale,
              float* out);

// A float matrix read through strides: element (i, k) at
// data[i * row + k * col]. A row-major tile with leading dimension ld reads
// as itself with {ld, 1} and as its transpose with {1, ld}.
struct StridedMatrix {
  const float* data;
  int64_t row, col;
};

// The tile products of the attention kernels (S = Q K^T, O += P V, and the
// backward's dP, dV, dK, dQ), in 8-lane AVX2 + FMA code where the CPU has
// them and 4-lane vectors (SSE2, NEON) elsewhere, picked at run time:
//   c[i * ldc + j] = alpha * sum over k < depth of a(i, k) * b[k * ldb + j]
//                    (+ c[i * ldc + j] when accumulate), for i < m, j < n.
// Each element sums its products in k order; only FMA contraction differs
// by ISA.
void gemm(int64_t m, int64_t n, int64_t depth, StridedMatrix a, const float* b, int64_t ldb,
          float alpha, bool accumulate, float* c, int64_t ldc);

// gemm's vector width on this machine: 8 (AVX2 + FMA) or 4 (also with
// JAXCRAFT_CPU_PORTABLE=1, cpu/isa_clones.h).
int gemm_lanes();

inline void scale_row(float alpha, float* y, int64_t n) {
  for (int64_t h = 0; h < n; ++h) y[h] *= alpha;
}

// One online softmax step of a row whose running max, sum and accumulator
// row (n floats) are given, against its logits x[c0, c1) of a key tile:
// the sum and accumulator rescaled to the new max, x[c0, c1) turned into
// the weights exp(x - max) in place and added to the sum. False, touching
// nothing, while every logit so far is -inf (no weight to add). NaN logits
// reach the sum (max_of skips them), so a NaN input gives a NaN row, as in
// jax.nn, even where no other logit is finite.
inline bool online_softmax_step(float& row_max, float& row_sum, float* acc, int64_t n, float* x,
                                int64_t c0, int64_t c1) {
  float new_max = std::max(row_max, max_of(x + c0, c1 - c0));
  if (new_max == kNegInf) {
    if (std::none_of(x + c0, x + c1, [](float v) { return v != v; })) return false;
    new_max = 0.f;  // any finite shift: the NaNs make the sum NaN
  }
  const float correction = std::exp(row_max - new_max);
  scale_row(correction, acc, n);
  row_sum = row_sum * correction + exp_shift_sum(x + c0, c1 - c0, new_max);
  row_max = new_max;
  return true;
}

// Every mask bound is a lower or an upper limit on the key index, so the keys
// a row sees are one half-open interval [begin, end).
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool empty() const { return begin >= end; }
};

inline int64_t num_workers(const TaskRunner* runner) {
  return runner ? runner->num_threads() + 1
                : std::max<int64_t>(1, std::thread::hardware_concurrency());
}

// Runs worker(item) for every item in [0, num_items). Each thread builds its
// own worker (which owns its scratch) and pulls item indices from a shared
// counter. Items write disjoint outputs and compute them in a fixed order, so
// results do not depend on which thread ran which item.
template <typename MakeWorker>
void for_each_item(const TaskRunner* runner, int64_t num_items, double work_per_item,
                   MakeWorker make_worker) {
  if (num_items <= 0) return;
  const auto by_work =
      static_cast<int64_t>(static_cast<double>(num_items) * work_per_item / kMinWorkPerThread);
  const int64_t threads = std::max<int64_t>(1, std::min({num_workers(runner), num_items, by_work}));
  std::atomic<int64_t> next{0};
  // One worker loop per thread slot; the slots run on `runner` (XLA's pool).
  parallel_for(runner, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slot = begin; slot < end; ++slot) {
      auto worker = make_worker();
      for (int64_t item = next.fetch_add(1); item < num_items; item = next.fetch_add(1)) {
        worker(item);
      }
    }
  });
}

}  // namespace cpu
}  // namespace jaxcraft
