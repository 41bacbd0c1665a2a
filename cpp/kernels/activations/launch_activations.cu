// Chooses the block shape and the vector or scalar path for the activation
// kernels, and launches them.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/cuda/convert.cuh"
#include "common/cuda/vector_access.h"
#include "kernels/activations/activation_kernels.cuh"
#include "kernels/activations/launch.h"

namespace jaxcraft {
namespace {

using activation::kBlockThreads;
using activation::kVecElems;

// CUDA's limit on gridDim.y; longer row ranges are walked grid-stride.
constexpr int64_t kMaxGridY = 65535;
// Rows per chunk (forward, and backward without a bias gradient): each thread
// handles kChunkRows rows, which amortizes its bias load and index math while
// leaving many blocks (4096 at 16k x 4096 bf16) to balance the SMs. On the
// H200, 8 rather than 4: gelu [16k, 14336] 242 -> 235 us, 4096 columns the
// same; 16 gained nothing more. Where the forward keeps 4 rows in flight,
// its chunks have 4 rows (one round of loads per thread: the combination
// measured; 2-row chunks and a grid looping over them were slower).
constexpr int64_t kChunkRows = 8;

// Threads across a row in the backward with bias partials, whose chunks are
// whole partials (64 rows): at most 64, so that a chunk's rows are split
// over 256 / 64 = 4 thread rows (folded through shared memory) and blocks
// are a quarter as long. With 256 threads across, [16k, 14336] made 1792
// blocks of 64 rows each, 3.4 waves of 528 resident blocks on an H200,
// whose last, 40% full wave ran nearly as long as a full one. H200, bf16
// bias_gelu backward, same build: [16k, 14336] 362.0 -> 345.4 us (93% ->
// 97% of copy; the erf form 362.5 -> 349.1), [16k, 4096] 103.7 -> 103.4;
// 32 threads across gained nothing more (347.4).
constexpr int kPartialMaxTx = 64;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Block shape: tx threads across a row's `vectors` (a power of two, at most
// max_tx, so a warp reads consecutive vectors) and ty = 256 / tx rows side
// by side, so that narrow rows still give each block 8 warps of loads.
dim3 block_shape(int64_t vectors, int max_tx = kBlockThreads) {
  int tx = 1;
  while (tx < max_tx && tx < vectors) tx *= 2;
  return dim3(tx, kBlockThreads / tx);
}

struct Launch {
  dim3 grid, block;
  int64_t rows_per_chunk, num_chunks;
};

// `partials` > 0: one chunk per partial sum (their row split is fixed by
// contract/activations.h); otherwise chunks of `chunk_rows` rows per thread row.
Launch plan(int64_t rows, int64_t vectors, int64_t partials, int64_t chunk_rows = kChunkRows) {
  Launch l;
  l.block = block_shape(vectors, partials > 0 ? kPartialMaxTx : kBlockThreads);
  if (partials > 0) {
    l.rows_per_chunk = std::max<int64_t>(1, partial_rows(rows, partials));
    l.num_chunks = partials;
  } else {
    l.rows_per_chunk = int64_t(l.block.y) * chunk_rows;
    l.num_chunks = ceil_div(rows, l.rows_per_chunk);
  }
  l.grid = dim3(static_cast<unsigned>(ceil_div(vectors, l.block.x)),
                static_cast<unsigned>(std::min(l.num_chunks, kMaxGridY)));
  return l;
}

template <typename T, Activation kAct, bool kGated, int kN>
cudaError_t fwd_launch(const ActivationFwdParams& p, cudaStream_t stream) {
  constexpr int kRows = activation::kFwdRowsInFlight<kGated>;
  const Launch l = plan(p.rows, p.cols / kN, 0, kRows == 4 ? kRows : kChunkRows);
  activation::activation_fwd_kernel<T, kAct, kGated, kN>
      <<<l.grid, l.block, 0, stream>>>(p, l.rows_per_chunk, l.num_chunks);
  return cudaGetLastError();
}

template <typename T, Activation kAct, bool kGated, int kN>
cudaError_t bwd_launch(const ActivationBwdParams& p, cudaStream_t stream) {
  const Launch l = plan(p.rows, p.cols / kN, p.dbias_partial ? p.num_partials : 0);
  activation::activation_bwd_kernel<T, kAct, kGated, kN>
      <<<l.grid, l.block, 0, stream>>>(p, l.rows_per_chunk, l.num_chunks);
  return cudaGetLastError();
}

// dtype -> (activation, gated) -> vector or scalar path: runtime values become
// template arguments here, once.
// The API has no ungated SiLU: that combination is folded away.
template <template <typename, Activation, bool, int> class Fn, typename T, typename Params>
cudaError_t with_activation(const Params& p, bool vec, cudaStream_t stream) {
  constexpr int kV = kVecElems<T>;
#define JAXCRAFT_ACT_CASE(kAct, kGated)                                        \
  if (p.activation == kAct && p.gated == kGated)                               \
    return vec ? Fn<T, kAct, kGated, kV>::run(p, stream) : Fn<T, kAct, kGated, 1>::run(p, stream);
  JAXCRAFT_ACT_CASE(Activation::kGeluTanh, false)
  JAXCRAFT_ACT_CASE(Activation::kGeluErf, false)
  JAXCRAFT_ACT_CASE(Activation::kGeluTanh, true)
  JAXCRAFT_ACT_CASE(Activation::kGeluErf, true)
  JAXCRAFT_ACT_CASE(Activation::kSilu, true)
#undef JAXCRAFT_ACT_CASE
  return cudaErrorInvalidValue;
}

template <typename T, Activation kAct, bool kGated, int kN>
struct Fwd {
  static cudaError_t run(const ActivationFwdParams& p, cudaStream_t s) {
    return fwd_launch<T, kAct, kGated, kN>(p, s);
  }
};
template <typename T, Activation kAct, bool kGated, int kN>
struct Bwd {
  static cudaError_t run(const ActivationBwdParams& p, cudaStream_t s) {
    return bwd_launch<T, kAct, kGated, kN>(p, s);
  }
};

template <typename T>
cudaError_t fwd_typed(const ActivationFwdParams& p, cudaStream_t stream) {
  // cols is the output width: a gated input row is two rows of whole vectors.
  return with_activation<Fwd, T>(p, can_vectorize<T>(p.cols, {p.x, p.y, p.bias}), stream);
}

template <typename T>
cudaError_t bwd_typed(const ActivationBwdParams& p, cudaStream_t stream) {
  const bool vec = can_vectorize<T>(p.cols, {p.dy, p.x, p.dx, p.bias, p.dbias_partial});
  return with_activation<Bwd, T>(p, vec, stream);
}

}  // namespace

cudaError_t launch_activation_fwd(const ActivationFwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_cuda_dtype(p.dtype, [&](auto x) { return fwd_typed<decltype(x)>(p, stream); });
}

cudaError_t launch_activation_bwd(const ActivationBwdParams& p, cudaStream_t stream) {
  if (p.dbias_partial && p.num_partials < 1) return cudaErrorInvalidValue;
  if (p.cols == 0) return cudaSuccess;
  if (p.rows == 0) {
    // Nothing to differentiate, but the partial rows are outputs: they must be zeros.
    if (p.dbias_partial)
      cudaMemsetAsync(p.dbias_partial, 0, sizeof(float) * p.num_partials * p.cols, stream);
    return cudaGetLastError();
  }
  return dispatch_cuda_dtype(p.dtype, [&](auto x) { return bwd_typed<decltype(x)>(p, stream); });
}

}  // namespace jaxcraft
