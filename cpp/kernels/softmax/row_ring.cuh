// A shared-memory ring that keeps a block's next rows in flight while it
// reduces the current one (the forward: advance(); the backward, which
// holds its row in registers: wait_row() and refill()). Each block walks
// rows first, first + stride, ... (a grid sized to the resident blocks);
// thread t copies its own kVecs 16-byte vectors of a row into its own slots
// with cp.async and later reads only those, so a wait on its own copies is
// all the synchronization the ring needs. The rows kernels held their row in registers from load to
// store, which bounded the bytes in flight per SM by the register file and
// left each block idle across its reduction barriers (docs/design.md).
#pragma once
#include <cstdint>

#include "common/cuda/cp_async.cuh"
#include "kernels/norm/norm_common.cuh"

namespace jaxcraft {
namespace softmax {

template <typename T, int kThreads, int kVecs>
struct RowRing {
  using V = norm::Vec<T>;
  static constexpr int kStageBytes = kThreads * kVecs * int(sizeof(V));

  V* base;
  __device__ explicit RowRing(unsigned char* smem) : base(reinterpret_cast<V*>(smem)) {}

  // Slot of this thread's vector i in `stage`: consecutive threads hold
  // consecutive 16-byte slots (no bank conflicts).
  __device__ static int index(int stage, int i) { return (stage * kVecs + i) * kThreads + threadIdx.x; }
  __device__ V* slot(int stage, int i) const { return base + index(stage, i); }

  // fetch(row, stage) issues this thread's copies of `row` (nothing past the
  // last row); every call below commits one group, fetched or not, so the
  // waits count the same groups in every thread.
  // prologue: the first `rows` rows into stages 0 .. rows - 1 (stages - 1
  // rows for advance(), `stages` for wait_row() and refill()).
  template <class Fetch>
  __device__ static void prologue(Fetch& fetch, int64_t first, int64_t stride, int rows) {
    for (int s = 0; s < rows; ++s) {
      fetch(first + s * stride, s);
      cp_async_commit();
    }
  }

  // At `row` (in `stage`): fetches the row stages - 1 ahead into the stage
  // the previous row used (its values were consumed before this call), then
  // waits for `row`'s copies.
  template <class Fetch>
  __device__ static void advance(Fetch& fetch, int64_t row, int64_t stride, int stages, int stage) {
    const int ahead = stages - 1;
    fetch(row + ahead * stride, stage == 0 ? ahead : stage - 1);
    cp_async_commit();
    cp_async_wait(ahead);
  }

  // The other protocol, for kernels that take their row into registers:
  // `stages` rows in flight, and a stage refilled with the row `stages`
  // ahead as soon as its values are in registers, so that even a one-stage
  // ring (the widest rows) keeps a row loading while the block reduces and
  // stores the current one. wait_row: `row`'s copies (the oldest group) have
  // landed.
  __device__ static void wait_row(int stages) { cp_async_wait(stages - 1); }
  template <class Fetch>
  __device__ static void refill(Fetch& fetch, int64_t row, int64_t stride, int stages, int stage) {
    fetch(row + stages * stride, stage);
    cp_async_commit();
  }
};

}  // namespace softmax
}  // namespace jaxcraft
