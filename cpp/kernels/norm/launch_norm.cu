// Chooses a norm kernel for (dtype, cols) and launches it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/norm/launch.h"
#include "kernels/norm/norm_rows_kernel.cuh"
#include "kernels/norm/norm_stream_kernel.cuh"

namespace jaxcraft {
namespace {

using norm::block_threads;
using norm::Vec;

// A register-resident configuration: kGroup threads per row, kVecs vectors each.
struct RowsConfig {
  int group = 0;  // 0: use the streaming kernel
  int vecs = 0;
};

// Register budget: 64K registers per SM. The forward holds one float per
// element (kVecs * kN <= 32 at 1024 threads fits in 64 regs/thread). The
// backward holds dy, xhat, dscale and dbias per element, so it stops at 16
// elements per thread and at 512 threads (96 regs/thread * 512 fits).
// Row widths past these limits, or not a multiple of the vector width, take
// the streaming kernel.
RowsConfig pick_rows_config(int64_t vectors, bool backward) {
  if (vectors <= 32) return {32, 1};
  if (vectors <= 64) return {32, 2};
  if (backward) {
    if (vectors <= 128) return {64, 2};
    if (vectors <= 256) return {128, 2};
    if (vectors <= 512) return {256, 2};
    if (vectors <= 1024) return {512, 2};
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

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
bool can_vectorize(int64_t cols, std::initializer_list<const void*> ptrs) {
  if (cols % Vec<T>::kN != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

// Enough resident rows for the whole GPU without a giant grid: grid-stride
// loops cover the rest.
constexpr int64_t kMaxGrid = 1 << 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T, int kGroup, int kVecs>
void launch_fwd_rows(const NormFwdParams& p, cudaStream_t stream) {
  constexpr int kThreads = block_threads<kGroup>();
  const int64_t grid = std::min(kMaxGrid, ceil_div(p.rows, kThreads / kGroup));
  norm::norm_fwd_rows_kernel<T, kGroup, kVecs><<<grid, kThreads, 0, stream>>>(p);
}

template <typename T, int kGroup, int kVecs>
cudaError_t launch_bwd_rows(const NormBwdParams& p, cudaStream_t stream) {
  constexpr int kThreads = block_threads<kGroup>();
  constexpr int kRowsPerBlock = kThreads / kGroup;
  constexpr size_t kFoldBytes =
      kRowsPerBlock > 1 ? sizeof(float) * kRowsPerBlock * kGroup * kVecs * Vec<T>::kN : 0;
  norm::norm_bwd_rows_kernel<T, kGroup, kVecs><<<p.num_partials, kThreads, kFoldBytes, stream>>>(p);
  return cudaSuccess;
}

template <typename T>
cudaError_t fwd_typed(const NormFwdParams& p, cudaStream_t stream) {
  const RowsConfig cfg = can_vectorize<T>(p.cols, {p.x, p.residual, p.y, p.h_out, p.scale, p.bias})
                             ? pick_rows_config(p.cols / Vec<T>::kN, false)
                             : RowsConfig{};
  switch (cfg.group * 8 + cfg.vecs) {
    case 32 * 8 + 1: launch_fwd_rows<T, 32, 1>(p, stream); break;
    case 32 * 8 + 2: launch_fwd_rows<T, 32, 2>(p, stream); break;
    case 32 * 8 + 4: launch_fwd_rows<T, 32, 4>(p, stream); break;
    case 64 * 8 + 4: launch_fwd_rows<T, 64, 4>(p, stream); break;
    case 128 * 8 + 4: launch_fwd_rows<T, 128, 4>(p, stream); break;
    case 256 * 8 + 4: launch_fwd_rows<T, 256, 4>(p, stream); break;
    case 512 * 8 + 4: launch_fwd_rows<T, 512, 4>(p, stream); break;
    case 1024 * 8 + 4: launch_fwd_rows<T, 1024, 4>(p, stream); break;
    default:
      norm::norm_fwd_stream_kernel<T>
          <<<std::min(kMaxGrid, p.rows), norm::kStreamBlock, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t bwd_typed(const NormBwdParams& p, cudaStream_t stream) {
  const RowsConfig cfg =
      can_vectorize<T>(p.cols, {p.dy, p.h, p.dh_extra, p.dh, p.scale, p.dscale_partial,
                                p.dbias_partial})
          ? pick_rows_config(p.cols / Vec<T>::kN, true)
          : RowsConfig{};
  switch (cfg.group * 8 + cfg.vecs) {
    case 32 * 8 + 1: launch_bwd_rows<T, 32, 1>(p, stream); break;
    case 32 * 8 + 2: launch_bwd_rows<T, 32, 2>(p, stream); break;
    case 64 * 8 + 2: launch_bwd_rows<T, 64, 2>(p, stream); break;
    case 128 * 8 + 2: launch_bwd_rows<T, 128, 2>(p, stream); break;
    case 256 * 8 + 2: launch_bwd_rows<T, 256, 2>(p, stream); break;
    case 512 * 8 + 2: launch_bwd_rows<T, 512, 2>(p, stream); break;
    default:
      norm::norm_bwd_stream_kernel<T><<<p.num_partials, norm::kStreamBlock, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_norm_fwd(const NormFwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kF32: return fwd_typed<float>(p, stream);
    case DType::kBF16: return fwd_typed<__nv_bfloat16>(p, stream);
    case DType::kF16: return fwd_typed<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_norm_bwd(const NormBwdParams& p, cudaStream_t stream) {
  if (p.num_partials < 1) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) {
    // Nothing to normalize, but the partial rows are outputs: they must be zeros.
    const size_t bytes = sizeof(float) * p.num_partials * p.cols;
    if (p.dscale_partial) cudaMemsetAsync(p.dscale_partial, 0, bytes, stream);
    if (p.dbias_partial) cudaMemsetAsync(p.dbias_partial, 0, bytes, stream);
    return cudaGetLastError();
  }
  switch (p.dtype) {
    case DType::kF32: return bwd_typed<float>(p, stream);
    case DType::kBF16: return bwd_typed<__nv_bfloat16>(p, stream);
    case DType::kF16: return bwd_typed<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jaxcraft
