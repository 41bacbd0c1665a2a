// Chooses the pack width and thread layout of the embedding kernels and
// launches them (kernels: embedding_kernels.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/cuda/convert.cuh"
#include "common/cuda/vector_access.h"
#include "kernels/embedding/embedding_kernels.cuh"
#include "kernels/embedding/launch.h"

namespace jaxcraft {
namespace {

using embedding::kBlockThreads;
using embedding::kLookupPacksPerThread;
using embedding::kPacksPerThread;
using embedding::kVecN;
using embedding::Layout;

// Enough resident groups for any current GPU without a giant grid:
// grid-stride loops cover the rest.
constexpr int64_t kMaxGrid = 1 << 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads per row: the fewest (a power of two) that cover the row with
// `per_thread` packs each, at most a block. Narrow rows (D = 64 bf16: 8
// packs -> 4 threads at 2 packs each) share a warp instead of idling most of
// its lanes.
Layout layout_for(int64_t packs, int per_thread = kPacksPerThread) {
  int shift = 0;
  while ((int64_t(1) << shift) * per_thread < packs && (1 << shift) < kBlockThreads) ++shift;
  return Layout{shift};
}

int64_t grid_for(int64_t rows, const Layout& l) {
  return std::max<int64_t>(1, std::min(kMaxGrid, ceil_div(rows, kBlockThreads >> l.shift)));
}

// The backward's table pass (TablePhases): blocks for the ids' rows first,
// then blocks for the zero rows.
template <class Kernel>
cudaError_t launch_table_pass(Kernel kernel, const EmbeddingBwdParams& p, const Layout& l,
                              cudaStream_t stream) {
  const int64_t ids = embedding::kTouchedIds;
  const embedding::TablePhases phases{std::min(kMaxGrid, ceil_div(p.num_ids, ids))};
  kernel<<<phases.touched_blocks + grid_for(p.rows, l), kBlockThreads, 0, stream>>>(p, l, phases);
  return cudaGetLastError();
}

int64_t grid_for_threads(int64_t n) {
  return std::max<int64_t>(1, std::min(kMaxGrid, ceil_div(n, kBlockThreads)));
}

template <typename T, int kN>
cudaError_t fwd_packed(const EmbeddingFwdParams& p, cudaStream_t stream) {
  const Layout l = layout_for(p.dim / kN, kLookupPacksPerThread);
  embedding::lookup_kernel<T, kN><<<grid_for(p.num_ids, l), kBlockThreads, 0, stream>>>(p, l);
  return cudaGetLastError();
}

template <typename T>
cudaError_t fwd_typed(const EmbeddingFwdParams& p, cudaStream_t stream) {
  if (can_vectorize<T>(p.dim, {p.table, p.out})) return fwd_packed<T, kVecN<T>>(p, stream);
  return fwd_packed<T, 1>(p, stream);
}

// Deterministic: bounds of each table row's run, then one pass over the table.
template <typename T, int kN>
cudaError_t bwd_sorted(const EmbeddingBwdParams& p, cudaStream_t stream) {
  embedding::segment_bounds_kernel<<<grid_for_threads(p.rows + 1), kBlockThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return launch_table_pass(embedding::segment_sum_kernel<T, kN>, p, layout_for(p.dim / kN), stream);
}

// Fast: count and chain each row's ids, sum the hot rows in float32
// (hot_sums), then one pass over the table (zeros, copies, sums).
template <typename T, int kN>
cudaError_t bwd_chained(const EmbeddingBwdParams& p, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(p.row_index + p.rows + 1, 0, sizeof(int32_t) * p.rows, stream);
  if (err != cudaSuccess) return err;
  const Layout l = layout_for(p.dim / kN);
  embedding::claim_rows_kernel<T, kN><<<grid_for_threads(p.num_ids), kBlockThreads, 0, stream>>>(p);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  const int64_t id_blocks = std::min(kMaxGrid, ceil_div(p.num_ids, embedding::kAccumulateIds));
  embedding::accumulate_kernel<T, kN><<<id_blocks, kBlockThreads, 0, stream>>>(p, l);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  return launch_table_pass(embedding::finalize_kernel<T, kN>, p, l, stream);
}

template <typename T>
cudaError_t bwd_typed(const EmbeddingBwdParams& p, cudaStream_t stream) {
  const bool vec = can_vectorize<T>(p.dim, {p.dout, p.dtable});
  if (p.sorted_rows) return vec ? bwd_sorted<T, kVecN<T>>(p, stream) : bwd_sorted<T, 1>(p, stream);
  // The 16-bit tables' scratch rows are float32: 16-byte aligned whenever
  // the 16-bit rows are.
  const bool f32 = sizeof(T) == sizeof(float);
  if (!p.row_index || (!f32 && !p.scratch)) return cudaErrorInvalidValue;
  return vec && (f32 || aligned16(p.scratch)) ? bwd_chained<T, kVecN<T>>(p, stream)
                                               : bwd_chained<T, 1>(p, stream);
}

}  // namespace

cudaError_t launch_embedding_fwd(const EmbeddingFwdParams& p, cudaStream_t stream) {
  if (p.num_ids == 0 || p.dim == 0) return cudaSuccess;
  if (p.rows < 1) return cudaErrorInvalidValue;
  return dispatch_cuda_dtype(p.dtype, [&](auto x) { return fwd_typed<decltype(x)>(p, stream); });
}

cudaError_t launch_embedding_bwd(const EmbeddingBwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.dim == 0) return cudaSuccess;
  if (p.num_ids == 0) {
    // No ids: the gradient is all zeros (0 bits in every dtype).
    const size_t bytes = size_t(p.rows) * p.dim * (p.dtype == DType::kF32 ? 4 : 2);
    cudaMemsetAsync(p.dtable, 0, bytes, stream);
    return cudaGetLastError();
  }
  if (p.sorted_rows && (!p.order || !p.row_index)) return cudaErrorInvalidValue;
  return dispatch_cuda_dtype(p.dtype, [&](auto x) { return bwd_typed<decltype(x)>(p, stream); });
}

}  // namespace jaxcraft
