// The norm backward's row stages: a ring of rows in shared memory, filled by
// cp.async, for the configurations that hold one row per block (or cluster).
// Each thread copies its own vectors of dy and h (and its own copy of the
// row's mean and rstd) and later reads only those, so a stage needs no
// barrier: cp_async_wait orders a thread's copies before its reads. With
// `stages` rows in the ring, stages - 1 rows' loads stay in flight while
// the block crosses the current row's barriers.
#pragma once
#include "common/cuda/cp_async.cuh"
#include "kernels/norm/norm_common.cuh"

namespace jaxcraft {
namespace norm {

// Rows in the ring (the launcher lowers it where shared memory is short).
constexpr int kBwdMaxStages = 3;

// One row slice as a thread holds it: its vectors of dy and h, the row's statistics.
template <typename T, int kVecs>
struct BwdRow {
  Vec<T> dy[kVecs], h[kVecs];
  float mean = 0.f, rstd = 0.f;
};

template <typename T, int kVecs, int kThreads>
struct BwdStages {
  // Bytes of one stage: dy and h as [vector][thread] (consecutive threads,
  // consecutive 16-byte slots), then mean and rstd as [2][thread].
  static constexpr int kDataBytes = 2 * kVecs * kThreads * kVecBytes;
  static constexpr int kStageBytes = kDataBytes + 2 * kThreads * int(sizeof(float));

  char* smem;  // stages * kStageBytes bytes, 16-byte aligned
  int stages;

  __device__ Vec<T>* vec_slot(int stage, int array, int i) const {
    return reinterpret_cast<Vec<T>*>(smem + stage * kStageBytes) + (array * kVecs + i) * kThreads + threadIdx.x;
  }
  __device__ float* stat_slot(int stage, int which) const {
    return reinterpret_cast<float*>(smem + stage * kStageBytes + kDataBytes) + which * kThreads + threadIdx.x;
  }

  // Starts this thread's copies of `row` into `stage` (nothing past the last
  // row) and commits them as one group: every call commits one, so that
  // take()'s wait counts rows.
  template <class Columns>
  __device__ void issue(int stage, int64_t row, const NormBwdParams& p, const Columns& cols) const {
    if (row < p.rows) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (!cols.owns(i)) continue;
        const int64_t off = row * p.cols + cols.col(i);
        cp_async_16(smem_u32(vec_slot(stage, 0, i)), static_cast<const T*>(p.dy) + off);
        cp_async_16(smem_u32(vec_slot(stage, 1, i)), static_cast<const T*>(p.h) + off);
      }
      if (p.mean) cp_async_ca<4>(smem_u32(stat_slot(stage, 0)), p.mean + row);
      cp_async_ca<4>(smem_u32(stat_slot(stage, 1)), p.rstd + row);
    }
    cp_async_commit();
  }

  // Waits for the oldest row in flight (the stages - 1 issued after it may
  // stay in flight) and returns it from `stage`.
  template <class Columns>
  __device__ BwdRow<T, kVecs> take(int stage, const NormBwdParams& p, const Columns& cols) const {
    cp_async_wait(stages - 1);
    BwdRow<T, kVecs> r;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (!cols.owns(i)) continue;
      r.dy[i] = *vec_slot(stage, 0, i);
      r.h[i] = *vec_slot(stage, 1, i);
    }
    if (p.mean) r.mean = *stat_slot(stage, 0);
    r.rstd = *stat_slot(stage, 1);
    return r;
  }
};

}  // namespace norm
}  // namespace jaxcraft
