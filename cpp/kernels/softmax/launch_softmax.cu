// Chooses a softmax kernel for (dtype, cols, alignment) and launches it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kernels/softmax/launch.h"
#include "kernels/softmax/softmax_kernels.cuh"

namespace jaxcraft {
namespace {

using softmax::block_threads;
using softmax::Vec;

// kGroup threads per row holding kVecs 16-byte vectors each (rows kernel),
// or group = 0: the stream kernel.
struct Config {
  int group = 0;
  int vecs = 0;
};

// Register budget (64K registers per SM; 1024-thread blocks leave 64 per
// thread): the forward holds kVecs <= 4 vectors of x (16 registers) plus
// their mask bits; the backward y and dy (2 x 2 vectors, 16 registers).
// Groups grow before vectors so that narrow rows still spread over a warp
// and wide ones over a block; one warp per row up to 32 x 4 vectors (1024
// bf16 / 512 f32 columns), one block per row beyond. Past 1024 x 4 vectors
// (32K bf16 / 16K f32 columns; the backward half that) a row no longer fits
// in a block's registers and streams from global memory twice.
Config pick_config(int64_t vectors, bool backward) {
  if (vectors <= 32) return {32, 1};
  if (vectors <= 64) return {32, 2};
  if (backward) {
    if (vectors <= 128) return {64, 2};
    if (vectors <= 256) return {128, 2};
    if (vectors <= 512) return {256, 2};
    if (vectors <= 1024) return {512, 2};
    if (vectors <= 2048) return {1024, 2};
    return {};
  }
  if (vectors <= 128) return {32, 4};
  if (vectors <= 256) return {64, 4};
  if (vectors <= 512) return {128, 4};
  if (vectors <= 1024) return {256, 4};
  if (vectors <= 2048) return {512, 4};
  if (vectors <= 4096) return {1024, 4};
  return {};
}

// Stream kernel threads per row: a warp for short rows (unaligned widths),
// 256 up to 8K columns, 1024 beyond (a 128K-column row: 16 vectors per
// thread per pass).
constexpr int64_t kStreamWarpCols = 1024;
constexpr int64_t kStreamMidCols = 8192;

constexpr int config_key(int group, int vecs) { return group * 8 + vecs; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

// Enough resident rows for the whole GPU without a giant grid: grid-stride
// loops cover the rest.
constexpr int64_t kMaxGrid = 1 << 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <int kGroup>
unsigned grid_for(int64_t rows) {
  constexpr int kRowsPerBlock = block_threads<kGroup>() / kGroup;
  return static_cast<unsigned>(std::min(kMaxGrid, ceil_div(rows, kRowsPerBlock)));
}

template <typename Kernel, int kGroup, typename Params>
void launch(Kernel kernel, const Params& p, cudaStream_t stream) {
  kernel<<<grid_for<kGroup>(p.rows), block_threads<kGroup>(), 0, stream>>>(p);
}

#define JAXCRAFT_ROWS_CASE(kernel, G, V) \
  case config_key(G, V): launch<decltype(&kernel<T, G, V>), G>(kernel<T, G, V>, p, stream); break;

template <typename T, bool kVec>
void fwd_stream(const SoftmaxFwdParams& p, cudaStream_t stream) {
  using softmax::softmax_fwd_stream_kernel;
  if (p.cols <= kStreamWarpCols)
    launch<decltype(&softmax_fwd_stream_kernel<T, 32, kVec>), 32>(softmax_fwd_stream_kernel<T, 32, kVec>, p, stream);
  else if (p.cols <= kStreamMidCols)
    launch<decltype(&softmax_fwd_stream_kernel<T, 256, kVec>), 256>(softmax_fwd_stream_kernel<T, 256, kVec>, p, stream);
  else
    launch<decltype(&softmax_fwd_stream_kernel<T, 1024, kVec>), 1024>(softmax_fwd_stream_kernel<T, 1024, kVec>, p, stream);
}

template <typename T, bool kVec>
void bwd_stream(const SoftmaxBwdParams& p, cudaStream_t stream) {
  using softmax::softmax_bwd_stream_kernel;
  if (p.cols <= kStreamWarpCols)
    launch<decltype(&softmax_bwd_stream_kernel<T, 32, kVec>), 32>(softmax_bwd_stream_kernel<T, 32, kVec>, p, stream);
  else if (p.cols <= kStreamMidCols)
    launch<decltype(&softmax_bwd_stream_kernel<T, 256, kVec>), 256>(softmax_bwd_stream_kernel<T, 256, kVec>, p, stream);
  else
    launch<decltype(&softmax_bwd_stream_kernel<T, 1024, kVec>), 1024>(softmax_bwd_stream_kernel<T, 1024, kVec>, p, stream);
}

template <typename T>
cudaError_t fwd_typed(const SoftmaxFwdParams& p, cudaStream_t stream) {
  using softmax::softmax_fwd_rows_kernel;
  const bool vec = all_aligned({p.x, p.y});
  const Config cfg = vec && all_aligned({p.mask}) && p.cols % Vec<T>::kN == 0
                         ? pick_config(p.cols / Vec<T>::kN, false)
                         : Config{};
  switch (config_key(cfg.group, cfg.vecs)) {
    JAXCRAFT_ROWS_CASE(softmax_fwd_rows_kernel, 32, 1)
    JAXCRAFT_ROWS_CASE(softmax_fwd_rows_kernel, 32, 2)
    JAXCRAFT_ROWS_CASE(softmax_fwd_rows_kernel, 32, 4)
    JAXCRAFT_ROWS_CASE(softmax_fwd_rows_kernel, 64, 4)
    JAXCRAFT_ROWS_CASE(softmax_fwd_rows_kernel, 128, 4)
    JAXCRAFT_ROWS_CASE(softmax_fwd_rows_kernel, 256, 4)
    JAXCRAFT_ROWS_CASE(softmax_fwd_rows_kernel, 512, 4)
    JAXCRAFT_ROWS_CASE(softmax_fwd_rows_kernel, 1024, 4)
    default:
      if (vec) fwd_stream<T, true>(p, stream);
      else fwd_stream<T, false>(p, stream);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t bwd_typed(const SoftmaxBwdParams& p, cudaStream_t stream) {
  using softmax::softmax_bwd_rows_kernel;
  const bool vec = all_aligned({p.y, p.dy, p.dx});
  const Config cfg = vec && p.cols % Vec<T>::kN == 0 ? pick_config(p.cols / Vec<T>::kN, true) : Config{};
  switch (config_key(cfg.group, cfg.vecs)) {
    JAXCRAFT_ROWS_CASE(softmax_bwd_rows_kernel, 32, 1)
    JAXCRAFT_ROWS_CASE(softmax_bwd_rows_kernel, 32, 2)
    JAXCRAFT_ROWS_CASE(softmax_bwd_rows_kernel, 64, 2)
    JAXCRAFT_ROWS_CASE(softmax_bwd_rows_kernel, 128, 2)
    JAXCRAFT_ROWS_CASE(softmax_bwd_rows_kernel, 256, 2)
    JAXCRAFT_ROWS_CASE(softmax_bwd_rows_kernel, 512, 2)
    JAXCRAFT_ROWS_CASE(softmax_bwd_rows_kernel, 1024, 2)
    default:
      if (vec) bwd_stream<T, true>(p, stream);
      else bwd_stream<T, false>(p, stream);
  }
  return cudaGetLastError();
}

#undef JAXCRAFT_ROWS_CASE

}  // namespace

cudaError_t launch_softmax_fwd(const SoftmaxFwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kF32: return fwd_typed<float>(p, stream);
    case DType::kBF16: return fwd_typed<__nv_bfloat16>(p, stream);
    case DType::kF16: return fwd_typed<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_softmax_bwd(const SoftmaxBwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kF32: return bwd_typed<float>(p, stream);
    case DType::kBF16: return bwd_typed<__nv_bfloat16>(p, stream);
    case DType::kF16: return bwd_typed<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jaxcraft
