// Chooses a norm kernel for (dtype, cols) and launches it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>

#include "common/cuda/cluster_launch.h"
#include "common/cuda/convert.cuh"
#include "common/cuda/device_cache.h"
#include "common/cuda/vector_access.h"
#include "kernels/norm/launch.h"
#include "kernels/norm/norm_rows_kernel.cuh"
#include "kernels/norm/norm_stream_kernel.cuh"
#include "kernels/norm/norm_warp_kernel.cuh"

namespace jaxcraft {
namespace {

using norm::block_threads;
using norm::kMaxSplit;
using norm::Vec;

// The backward's register-resident configuration: kGroup threads per row,
// kVecs vectors each, the row split over kSplit CTAs (a thread-block cluster
// when > 1).
struct RowsConfig {
  int group = 0;  // 0: use the streaming kernel
  int vecs = 0;
  int split = 1;
};

// Register budget: 64K registers per SM. The backward holds dy, xhat, dscale
// and dbias per element, so it stops at 16 elements per thread and at 512
// threads (at most 107 regs/thread * 512 fit). Wider rows split over a
// thread-block cluster where the device has clusters (sm_90+): the same
// registers per thread, kSplit times the row, at the cost of one cluster
// barrier per row statistic. Row widths past these limits, or not a
// multiple of the vector width, take the streaming kernel.
RowsConfig pick_bwd_config(int64_t vectors, bool clusters) {
  if (vectors <= 32) return {32, 1};
  if (vectors <= 64) return {32, 2};
  if (vectors <= 128) return {64, 2};
  if (vectors <= 256) return {128, 2};
  if (vectors <= 512) return {256, 2};
  if (vectors <= 1024) return {512, 2};
  // 512 x 2 vectors per CTA, 2-8 CTAs per row: the fewest CTAs per cluster
  // barrier. On H100 at 4096 x 32768 bf16: 58% of copy bandwidth, as fast
  // as 8 x 256 x 2 (two CTAs per SM); the streaming kernel reached 10-13%.
  for (int split = 2; clusters && split <= kMaxSplit; split *= 2)
    if (vectors <= int64_t(split) * 512 * 2) return {512, 2, split};
  return {};
}

// One switch case per configuration (vecs < 8, split < 16).
constexpr int config_key(int group, int vecs, int split) { return (group * 8 + vecs) * 16 + split; }
constexpr int config_key(const RowsConfig& c) { return config_key(c.group, c.vecs, c.split); }

// Whether the current device runs cluster kernels (asked of one of them).
cudaError_t has_clusters(bool* result) {
  static std::atomic<int> cache[kMaxCachedDevices];  // 1: no, 2: yes
  int answer = 0;
  const cudaError_t err = per_device(cache, [](int device, int* v) {
    bool yes = false;
    const cudaError_t e = runs_sm90_code(norm::norm_bwd_rows_kernel<float, 512, 2, kMaxSplit>, device, &yes);
    *v = yes ? 2 : 1;
    return e;
  }, &answer);
  *result = answer == 2;
  return err;
}

// Enough resident rows for the whole GPU without a giant grid: grid-stride
// loops cover the rest.
constexpr int64_t kMaxGrid = 1 << 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The forward's warp kernel: kLanes lanes per row, kVecs vectors each; with
// kSplit > 1 one cluster of kSplit one-row blocks per row.
template <typename T, int kLanes, int kVecs = 8, int kSplit = 1>
cudaError_t launch_fwd_warp(const NormFwdParams& p, cudaStream_t stream) {
  const int64_t blocks = kSplit > 1 ? p.rows * kSplit : ceil_div(p.rows, norm::kWarpBlock / kLanes);
  return ClusterLaunch(kSplit, blocks, norm::kWarpBlock, 0, stream)
      .launch(norm::norm_fwd_warp_kernel<T, kLanes, kVecs, kSplit>, p);
}

// Eight vectors per lane (128 bytes of loads in flight per lane) on as many
// lanes as the row needs, up to eight warps; past that (sm_90+) clusters of
// 2, 4 or 8 such blocks, then sixteen vectors per lane. Without clusters,
// one block of sixteen. False, launching nothing, for wider rows. H200, bf16,
// 64 MB, % of copy across layer/RMS with and without the residual, in one
// process: 32768 columns 63-73% on two CTAs of 8 vectors against 48-67% on
// one of 16 and 51-64% on four of 4; 65536 columns 58-69% on four of 8
// against 47-59% on two of 16 and 48-63% on eight of 4.
template <typename T>
bool launch_fwd_warp_for(const NormFwdParams& p, bool clusters, cudaStream_t stream, cudaError_t* err) {
  const int64_t lanes = ceil_div(p.cols / Vec<T>::kN, 8);
  if (lanes <= 1) *err = launch_fwd_warp<T, 1>(p, stream);
  else if (lanes <= 2) *err = launch_fwd_warp<T, 2>(p, stream);
  else if (lanes <= 4) *err = launch_fwd_warp<T, 4>(p, stream);
  else if (lanes <= 8) *err = launch_fwd_warp<T, 8>(p, stream);
  else if (lanes <= 16) *err = launch_fwd_warp<T, 16>(p, stream);
  else if (lanes <= 32) *err = launch_fwd_warp<T, 32>(p, stream);
  else if (lanes <= 64) *err = launch_fwd_warp<T, 64>(p, stream);
  else if (lanes <= 128) *err = launch_fwd_warp<T, 128>(p, stream);
  else if (lanes <= 256) *err = launch_fwd_warp<T, 256>(p, stream);
  else if (!clusters) {
    if (lanes > 512) return false;
    *err = launch_fwd_warp<T, 256, 16>(p, stream);
  } else if (lanes <= 2 * 256) *err = launch_fwd_warp<T, 256, 8, 2>(p, stream);
  else if (lanes <= 4 * 256) *err = launch_fwd_warp<T, 256, 8, 4>(p, stream);
  else if (lanes <= 8 * 256) *err = launch_fwd_warp<T, 256, 8, 8>(p, stream);
  else if (lanes <= 8 * 512) *err = launch_fwd_warp<T, 256, 16, 8>(p, stream);
  else return false;
  return true;
}

// Rows in the backward's shared-memory ring (one-row blocks): as many as fit
// the device's per-block limit, up to norm::kBwdMaxStages; the kernel's
// attribute is raised to match, once per device.
template <typename Kernel>
cudaError_t bwd_stage_count(Kernel* kernel, int stage_bytes, std::atomic<int> (&cache)[kMaxCachedDevices],
                            int* stages) {
  return per_device(cache, [&](int device, int* v) {
    // Room left for the kernel's static shared memory (RowSum's few hundred bytes).
    constexpr int kStaticMargin = 2048;
    int optin = 0;
    cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    *v = std::max(2, std::min(norm::kBwdMaxStages, (optin - kStaticMargin) / stage_bytes));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *v * stage_bytes);
    return e;
  }, stages);
}

// One cluster (a block when kSplit == 1) per partial row of dscale/dbias, but
// no more than fit on the device at once: the clusters walk the rows, and a
// second wave of them would double the time (4- and 8-CTA clusters of
// 512-thread CTAs do not all fit in one wave of the H200's GPCs).
template <typename T, int kGroup, int kVecs, int kSplit>
cudaError_t launch_bwd_rows(const NormBwdParams& p, cudaStream_t stream) {
  constexpr auto kKernel = norm::norm_bwd_rows_kernel<T, kGroup, kVecs, kSplit>;
  constexpr int kThreads = block_threads<kGroup>();
  constexpr int kRowsPerBlock = kThreads / kGroup;
  static std::atomic<int> stage_cache[kMaxCachedDevices], resident[kMaxCachedDevices];
  // Several rows per block: their dscale/dbias fold through shared memory;
  // one: the row ring.
  size_t smem = sizeof(float) * kRowsPerBlock * kGroup * kVecs * Vec<T>::kN;
  int stages = 0;
  if constexpr (kRowsPerBlock == 1) {
    constexpr int kStageBytes = norm::BwdStages<T, kVecs, kGroup>::kStageBytes;
    const cudaError_t e = bwd_stage_count(kKernel, kStageBytes, stage_cache, &stages);
    if (e != cudaSuccess) return e;
    smem = size_t(stages) * kStageBytes;
  }
  int fit = 0;
  const cudaError_t err = per_device(resident, [&](int, int* v) {
    return resident_groups(kKernel, kSplit, kThreads, smem, v);
  }, &fit);
  if (err != cudaSuccess) return err;
  const int64_t clusters = std::min<int64_t>(p.num_partials, fit);
  return ClusterLaunch(kSplit, clusters * kSplit, kThreads, smem, stream).launch(kKernel, p, stages);
}

template <typename T>
cudaError_t fwd_typed(const NormFwdParams& p, cudaStream_t stream) {
  bool clusters = false;
  cudaError_t err = has_clusters(&clusters);
  if (err != cudaSuccess) return err;
  if (!(can_vectorize<T>(p.cols, {p.x, p.residual, p.y, p.h_out, p.scale, p.bias}) &&
        launch_fwd_warp_for<T>(p, clusters, stream, &err)))
    norm::norm_fwd_stream_kernel<T><<<std::min(kMaxGrid, p.rows), norm::kStreamBlock, 0, stream>>>(p);
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <typename T>
cudaError_t bwd_typed(const NormBwdParams& p, cudaStream_t stream) {
  bool clusters = false;
  cudaError_t err = has_clusters(&clusters);
  if (err != cudaSuccess) return err;
  const RowsConfig cfg =
      can_vectorize<T>(p.cols, {p.dy, p.h, p.dh_extra, p.dh, p.scale, p.dscale_partial,
                                p.dbias_partial})
          ? pick_bwd_config(p.cols / Vec<T>::kN, clusters)
          : RowsConfig{};
  switch (config_key(cfg)) {
    case config_key(32, 1, 1): err = launch_bwd_rows<T, 32, 1, 1>(p, stream); break;
    case config_key(32, 2, 1): err = launch_bwd_rows<T, 32, 2, 1>(p, stream); break;
    case config_key(64, 2, 1): err = launch_bwd_rows<T, 64, 2, 1>(p, stream); break;
    case config_key(128, 2, 1): err = launch_bwd_rows<T, 128, 2, 1>(p, stream); break;
    case config_key(256, 2, 1): err = launch_bwd_rows<T, 256, 2, 1>(p, stream); break;
    case config_key(512, 2, 1): err = launch_bwd_rows<T, 512, 2, 1>(p, stream); break;
    case config_key(512, 2, 2): err = launch_bwd_rows<T, 512, 2, 2>(p, stream); break;
    case config_key(512, 2, 4): err = launch_bwd_rows<T, 512, 2, 4>(p, stream); break;
    case config_key(512, 2, 8): err = launch_bwd_rows<T, 512, 2, 8>(p, stream); break;
    default:
      norm::norm_bwd_stream_kernel<T><<<p.num_partials, norm::kStreamBlock, 0, stream>>>(p);
  }
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace

cudaError_t launch_norm_fwd(const NormFwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_cuda_dtype(p.dtype, [&](auto x) { return fwd_typed<decltype(x)>(p, stream); });
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
  return dispatch_cuda_dtype(p.dtype, [&](auto x) { return bwd_typed<decltype(x)>(p, stream); });
}

}  // namespace jaxcraft
