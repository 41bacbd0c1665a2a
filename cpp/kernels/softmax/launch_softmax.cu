// Chooses a softmax kernel for (dtype, cols, alignment) and launches it.
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
#include "kernels/softmax/launch.h"
#include "kernels/softmax/softmax_rows_kernels.cuh"
#include "kernels/softmax/softmax_stream_kernels.cuh"
#include "kernels/softmax/softmax_warp_kernel.cuh"

namespace jaxcraft {
namespace {

using softmax::block_threads;
using softmax::Vec;

// kGroup threads per row holding kVecs 16-byte vectors each (rows kernel),
// the row split over a cluster of `split` such blocks, or group = 0: the
// stream kernel.
struct Config {
  int group = 0;
  int vecs = 0;
  int split = 1;
};

// Thread-block clusters of up to 8 CTAs are portable; 16 need an opt-in
// (resident_walkers), which sm_90 grants. The widest backward rows use 16.
constexpr int kMaxSplit = 8;

// Forward rows kernels. Register budget (64K registers per SM; 1024-thread
// blocks leave 64 per thread): kVecs <= 4 vectors of x (16 registers; 8
// vectors, 32 registers, for float32 rows of 64K-128K columns) plus their
// mask bits.
// Groups grow before vectors so that narrow rows still spread over a warp
// and wide ones over a block; one warp per row up to 32 x 4 vectors (1024
// bf16 / 512 f32 columns), one block per row up to 1024 x 4 vectors (32K
// bf16 / 16K f32 columns), then a cluster of up to 8 such blocks per row
// (256K bf16 / 128K f32 columns; sm_90+, else launch_rows declines; float32
// rows of 64K-128K columns take clusters of four blocks of eight vectors).
// Wider rows stream from global memory twice.
// (Unmasked rows of up to 256K 16-bit / 16K f32 columns take the warp
// kernels instead, 16-bit rows past 32K columns in clusters:
// launch_fwd_warp.)
Config pick_fwd_config(int64_t vectors, bool f32, bool masked) {
  if (vectors <= 32) return {32, 1};
  if (vectors <= 64) return {32, 2};
  const int vecs = 4;
  if (vectors <= 128) return {32, vecs};
  for (int group = 64; group <= 1024; group *= 2)
    if (vectors <= int64_t{group} * vecs) return {group, vecs};
  const int64_t ctas = (vectors + 1024 * vecs - 1) / (1024 * vecs);
  // Rows over more than two 1024-thread CTAs (256 KiB rows) take eight
  // 512-thread CTAs instead, so two clusters share each SM and one runs
  // while the other waits at its barrier. H100, bf16 [4k, 128k]: 906 ->
  // 858 us; at two CTAs (f32 [16k, 32k]) four 512-thread CTAs lost 3.5%
  // (1611 -> 1670 us).
  // Float32 rows of 64K-128K columns: clusters of four 1024-thread CTAs
  // holding eight vectors per thread in registers (a 128 KB one-stage
  // ring, refilled once x is read; half the CTAs per cluster barrier) where
  // eight CTAs of four vectors ran (both grids hold 120 CTAs on the H100):
  // f32 [4k, 128k] 1683 -> 1591 us (85% -> 89.5% of copy). 16-bit rows
  // would spill.
  if (f32 && ctas > kMaxSplit / 2 && ctas <= kMaxSplit) return {1024, 2 * vecs, kMaxSplit / 2};
  // Unmasked float32 rows of 16K-32K columns: clusters of two 512-thread
  // CTAs of eight vectors per thread (the one-stage ring above), two CTAs
  // per SM, where two 1024-thread CTAs of four ran one per SM. H200: f32
  // [16k, 32k] 1196.3 -> 1116.4 us (84.5% -> 90.6% of copy). With a mask
  // the kernel takes 76 registers, and only one CTA fits; at 64K-128K
  // columns eight such CTAs lost 5% (1121 -> 1178 us).
  if (f32 && !masked && ctas == 2) return {512, 2 * vecs, 2};
  if (ctas > 2 && (vectors + 512 * vecs - 1) / (512 * vecs) <= kMaxSplit) return {512, vecs, kMaxSplit};
  // Left here: two CTAs, or five to eight (16-bit rows only).
  if (ctas <= kMaxSplit) return {1024, vecs, ctas <= 2 ? 2 : kMaxSplit};
  return {};
}

// Backward rows kernels, for the rows the warp kernels do not take
// (launch_bwd_warp): y and dy, 2 x 2 vectors per thread (16 registers),
// up to 128 vectors on a warp or two; rows of 16K-32K vectors (f32
// 64K-128K, bf16 128K-256K columns: up to 512 KiB of y) on sixteen
// 512-thread CTAs of four vectors (a non-portable cluster size, sm_90+),
// two per SM, where eight 1024-thread CTAs of four vectors ran one per SM.
// H100, same build: bf16 [2k, 256k] 1187-1212 -> 1085 us (88-90% -> 98% of
// copy), f32 [4k, 128k] 2207-2231 -> 2205-2208 (the same). Wider rows, and
// rows of 2K-16K vectors where clusters cannot run, stream.
Config pick_bwd_config(int64_t vectors) {
  if (vectors <= 32) return {32, 1};
  if (vectors <= 64) return {32, 2};
  if (vectors <= 128) return {64, 2};
  if (vectors > 512 * 4 * kMaxSplit && vectors <= 512 * 4 * 2 * kMaxSplit) return {512, 4, 2 * kMaxSplit};
  return {};
}

// Stream kernel threads per row: a warp for short rows (unaligned widths),
// 256 up to 8K columns, 1024 beyond (a 128K-column row: 16 vectors per
// thread per pass).
constexpr int64_t kStreamWarpCols = 1024;
constexpr int64_t kStreamMidCols = 8192;

constexpr int config_key(int group, int vecs, int split) { return (group * 16 + vecs) * 32 + split; }

// Stream kernels: enough resident rows for the whole GPU without a giant
// grid; grid-stride loops cover the rest.
constexpr int64_t kMaxGrid = 1 << 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <int kGroup, typename Params>
void launch_stream(void (*kernel)(Params), const Params& p, cudaStream_t stream) {
  constexpr int kRowsPerBlock = block_threads<kGroup>() / kGroup;
  const auto grid = static_cast<unsigned>(std::min(kMaxGrid, ceil_div(p.rows, kRowsPerBlock)));
  kernel<<<grid, block_threads<kGroup>(), 0, stream>>>(p);
}

template <typename T, bool kVec>
void fwd_stream(const SoftmaxFwdParams& p, cudaStream_t stream) {
  using softmax::softmax_fwd_stream_kernel;
  if (p.cols <= kStreamWarpCols) launch_stream<32>(softmax_fwd_stream_kernel<T, 32, kVec>, p, stream);
  else if (p.cols <= kStreamMidCols) launch_stream<256>(softmax_fwd_stream_kernel<T, 256, kVec>, p, stream);
  else launch_stream<1024>(softmax_fwd_stream_kernel<T, 1024, kVec>, p, stream);
}

template <typename T, bool kVec>
void bwd_stream(const SoftmaxBwdParams& p, cudaStream_t stream) {
  using softmax::softmax_bwd_stream_kernel;
  if (p.cols <= kStreamWarpCols) launch_stream<32>(softmax_bwd_stream_kernel<T, 32, kVec>, p, stream);
  else if (p.cols <= kStreamMidCols) launch_stream<256>(softmax_bwd_stream_kernel<T, 256, kVec>, p, stream);
  else launch_stream<1024>(softmax_bwd_stream_kernel<T, 1024, kVec>, p, stream);
}

// Rows kernels: the deepest ring (up to kRingStages rows in flight per
// thread group) that fits a block's shared memory, and a grid of the blocks
// (clusters) that are resident at once, each walking its rows through its
// ring.
constexpr int kRingStages = 3;
constexpr int kStaticSmemMargin = 1024;  // the kernels' own reduction slots

// How many of kKernel's row walkers fit on the device at once with `smem`
// bytes of ring: blocks (kSplit = 1), or clusters of kSplit blocks, 0 where
// clusters cannot run (a device before sm_90, or an image the runtime
// loaded without sm_90 code, whose cluster kernels are empty). Asked once
// per device and ring size (a forward kernel has two: with and without a
// mask): the queries and the shared-memory opt-in cost host time.
template <auto kKernel, int kSplit>
cudaError_t resident_walkers(int device, int threads, int smem, int smem_limit, int* out) {
  static std::atomic<int64_t> cache[kMaxCachedDevices][2];  // smem << 32 | walkers + 1; 0: empty
  const int64_t key = int64_t{smem} << 32;
  if (device < kMaxCachedDevices) {
    for (auto& slot : cache[device]) {
      const int64_t v = slot.load(std::memory_order_relaxed);
      if (v != 0 && (v & ~int64_t{0xffffffff}) == key) {
        *out = static_cast<int>(v & 0xffffffff) - 1;
        return cudaSuccess;
      }
    }
  }
  cudaError_t err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_limit);
  if (err != cudaSuccess) return err;
  bool runs = kSplit == 1;  // whether the kernel can run at all
  if constexpr (kSplit > 1) {
    if ((err = runs_sm90_code(kKernel, device, &runs)) != cudaSuccess) return err;
    if constexpr (kSplit > kMaxSplit) {
      // Where the GPU refuses the non-portable size, no cluster runs: the
      // caller streams instead.
      if (runs &&
          cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        cudaGetLastError();  // clear the refusal
        runs = false;
      }
    }
  }
  int walkers = 0;
  if (runs && (err = resident_groups(kKernel, kSplit, threads, smem, &walkers)) != cudaSuccess) return err;
  if (kSplit == 1) walkers = std::max(walkers, 1);
  *out = walkers;
  if (device < kMaxCachedDevices) {
    for (auto& slot : cache[device]) {
      int64_t empty = 0;
      if (slot.compare_exchange_strong(empty, key | (walkers + 1))) break;
    }
  }
  return cudaSuccess;
}

// Launches kKernel (kGroup threads per row, kSplit blocks per cluster,
// stage_bytes of ring per row in flight). False, launching nothing, when
// not even one stage fits or clusters cannot run (the caller streams
// instead).
template <int kGroup, int kSplit, auto kKernel, typename Params>
bool launch_rows(int stage_bytes, const Params& p, cudaStream_t stream, cudaError_t* err) {
  constexpr int kThreads = block_threads<kGroup>();
  int device = 0, optin = 0, walkers = 0;
  if ((*err = cudaGetDevice(&device)) != cudaSuccess ||
      (*err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) !=
          cudaSuccess)
    return true;
  const int smem_limit = optin - kStaticSmemMargin;
  // 512-thread CTAs in clusters run two per SM (pick_fwd_config,
  // pick_bwd_config): each ring gets half the shared memory.
  constexpr bool kTwoPerSm = kSplit > 1 && kThreads == 512;
  const int ring_limit = kTwoPerSm ? optin / 2 - kStaticSmemMargin : smem_limit;
  const int stages = std::min(kRingStages, ring_limit / stage_bytes);
  if (stages < 1) return false;
  const int smem = stages * stage_bytes;
  if ((*err = resident_walkers<kKernel, kSplit>(device, kThreads, smem, smem_limit, &walkers)) !=
      cudaSuccess)
    return true;
  if (walkers < 1) return false;
  constexpr int kRowsPerBlock = kThreads / kGroup;
  const int64_t blocks = std::min(ceil_div(p.rows, kRowsPerBlock), int64_t{walkers}) * kSplit;
  *err = ClusterLaunch(kSplit, blocks, kThreads, smem, stream).launch(kKernel, p, stages);
  return true;
}

// Ring bytes per row in flight: the forward's x vectors and mask bytes, the
// backward's y and dy vectors.
template <typename T>
int fwd_stage_bytes(int threads, int vecs, bool mask) {
  return threads * vecs * (int(sizeof(Vec<T>)) + (mask ? Vec<T>::kN : 0));
}
template <typename T>
int bwd_stage_bytes(int threads, int vecs) {
  return 2 * threads * vecs * int(sizeof(Vec<T>));
}

// kMasked (whether the forward has a mask) is a template argument: without
// one the per-element selects go away.
template <typename T, int kGroup, int kVecs, int kSplit, bool kMasked>
bool launch_fwd_rows_masked(const SoftmaxFwdParams& p, cudaStream_t stream, cudaError_t* err) {
  return launch_rows<kGroup, kSplit, softmax::softmax_fwd_rows_kernel<T, kGroup, kVecs, kMasked, kSplit>>(
      fwd_stage_bytes<T>(block_threads<kGroup>(), kVecs, kMasked), p, stream, err);
}
// Unmasked rows of kFwdWarpMinVectors<T> to 4096 vectors take the warp
// kernels (launch_fwd_warp). A one-block rows configuration gets rows of more
// than half its capacity (pick_fwd_config), so one whose rows all fall in
// that range is compiled with a mask only.
template <typename T>
constexpr int64_t kFwdWarpMinVectors = sizeof(T) == sizeof(float) ? 513 : 129;
template <typename T, int kGroup, int kVecs, int kSplit>
bool launch_fwd_rows(const SoftmaxFwdParams& p, cudaStream_t stream, cudaError_t* err) {
  constexpr bool kWarpKernelRows = kSplit == 1 && kGroup * kVecs / 2 + 1 >= kFwdWarpMinVectors<T>;
  if (p.mask) return launch_fwd_rows_masked<T, kGroup, kVecs, kSplit, true>(p, stream, err);
  if constexpr (kWarpKernelRows) return false;
  else return launch_fwd_rows_masked<T, kGroup, kVecs, kSplit, false>(p, stream, err);
}
#define JAXCRAFT_FWD_ROWS_CASE(G, V, S)                            \
  case config_key(G, V, S):                                        \
    ran = launch_fwd_rows<T, G, V, S>(p, stream, &err);            \
    break;
#define JAXCRAFT_BWD_ROWS_CASE(G, V, S)                                               \
  case config_key(G, V, S):                                                           \
    ran = launch_rows<G, S, softmax::softmax_bwd_rows_kernel<T, G, V, S>>(            \
        bwd_stage_bytes<T>(block_threads<G>(), V), p, stream, &err);                  \
    break;

// Warp-per-row kernels: blocks of kBlock threads, kWarps warps per row.
template <int kBlock, int kWarps = 1>
unsigned warp_row_grid(int64_t rows) {
  return static_cast<unsigned>(ceil_div(rows, kBlock / (kWarps * softmax::kWarp)));
}

// Unmasked rows of up to 32K 16-bit / 16K float32 columns take the
// warp-per-row kernel (softmax_warp_kernel.cuh): 16-bit rows of 129..4096
// vectors (1032..32768 columns) on one to eight warps of 8 vectors per lane
// (16 past 2048 vectors); float32 rows of 513..4096 vectors (2052..16384
// columns) on one, two or four warps of 32 (at 2048 columns, 16 per lane
// spilled and tied the rows kernel). Against the rows kernels in the same
// process: H200 bf16 [16k, 4096] 80.6 -> 72.1 us, f16 85.5 -> 75.5, bf16
// [16k, 2048] 42.3 -> 39.3; H100 f32 [16k, 4096] 224.0 -> 214.1, bf16 [16k,
// 8192] 199.5-201.7 -> 187.5 (one warp of 32 vectors per lane). Rows over
// several warps: H200 f32 [16k,
// 8192] 290-293 -> 263 us (86% -> 95.5% of copy), bf16 [16k, 32768] 553-555
// -> 522.5; fewer vectors per lane on more warps helps 16-bit rows (bf16
// [16k, 4096] 16 -> 8 vectors, one warp -> two: H200 69.6 -> 68.2, H100 94.3
// -> 92.8) and costs float32 ones 3-5%. False, launching nothing, for any
// other row.
template <typename T, int kVecs, int kWarps>
void launch_fwd_warp_vecs(const SoftmaxFwdParams& p, cudaStream_t stream) {
  constexpr int kBlock = softmax::kFwdWarpBlock<kVecs>;
  softmax::softmax_fwd_warp_kernel<T, kVecs, kWarps><<<warp_row_grid<kBlock, kWarps>(p.rows), kBlock, 0, stream>>>(p);
}

// Launches kKernel, a warp kernel of kBlock-thread one-row blocks, in
// clusters of kSplit: one cluster per row. False, launching nothing, where
// clusters cannot run.
template <auto kKernel, int kSplit, int kBlock, typename Params>
bool launch_warp_cluster(const Params& p, cudaStream_t stream, cudaError_t* err) {
  int device = 0, clusters = 0;
  if ((*err = cudaGetDevice(&device)) != cudaSuccess ||
      (*err = resident_walkers<kKernel, kSplit>(device, kBlock, 0, 0, &clusters)) != cudaSuccess)
    return true;
  if (clusters < 1) return false;
  *err = ClusterLaunch(kSplit, p.rows * kSplit, kBlock, 0, stream).launch(kKernel, p);
  return true;
}

// Unmasked 16-bit rows of 4K-32K vectors (bf16 32K-256K columns): the
// warp kernel's one-row blocks of eight warps (16 vectors per lane) in
// clusters of 2, 4 or 8, the CTAs' (max, sum) pairs merged through
// distributed shared memory; no ring, so a cluster's CTAs need no shared
// memory and pack onto the SMs, several per SM, where the rows kernels' 512-
// and 1024-thread CTAs fit clusters of eight on 120 of 132 SMs. Against the
// rows kernels, same process: bf16 [4k, 128k] H200 626 -> 539 us (80% -> 93%
// of copy), H100 834 -> 716 (85% -> 99%); [2k, 256k] H200 656 -> 557, H100
// 847 -> 729; [8k, 64k] H100 846 -> 719. (float32 rows of 8K-32K vectors on
// clusters of 128-thread blocks, H200: 32K columns the same, 128K 10%
// slower.)
template <typename T, int kSplit>
bool launch_fwd_warp_cluster(const SoftmaxFwdParams& p, cudaStream_t stream, cudaError_t* err) {
  return launch_warp_cluster<softmax::softmax_fwd_warp_kernel<T, 16, 8, kSplit>, kSplit,
                             softmax::kFwdWarpBlock<16>>(p, stream, err);
}

template <typename T>
bool launch_fwd_warp(const SoftmaxFwdParams& p, cudaStream_t stream, cudaError_t* err) {
  constexpr bool kF32 = sizeof(T) == sizeof(float);
  const int64_t vectors = p.cols / Vec<T>::kN;
  if constexpr (!kF32) {
    if (!p.mask && vectors > 4096 && vectors <= 32768) {
      if (vectors <= 8192) return launch_fwd_warp_cluster<T, 2>(p, stream, err);
      if (vectors <= 16384) return launch_fwd_warp_cluster<T, 4>(p, stream, err);
      return launch_fwd_warp_cluster<T, 8>(p, stream, err);
    }
  }
  if (p.mask || vectors < kFwdWarpMinVectors<T> || vectors > 4096) return false;
  if constexpr (!kF32) {
    if (vectors <= 256) launch_fwd_warp_vecs<T, 8, 1>(p, stream);
    else if (vectors <= 512) launch_fwd_warp_vecs<T, 8, 2>(p, stream);
    else if (vectors <= 1024) launch_fwd_warp_vecs<T, 8, 4>(p, stream);
    else if (vectors <= 2048) launch_fwd_warp_vecs<T, 8, 8>(p, stream);
    else launch_fwd_warp_vecs<T, 16, 8>(p, stream);
  } else {  // 32 vectors per lane: 128 registers of row
    if (vectors <= 1024) launch_fwd_warp_vecs<T, 32, 1>(p, stream);
    else if (vectors <= 2048) launch_fwd_warp_vecs<T, 32, 2>(p, stream);
    else launch_fwd_warp_vecs<T, 32, 4>(p, stream);
  }
  return true;
}

template <typename T>
cudaError_t fwd_typed(const SoftmaxFwdParams& p, cudaStream_t stream) {
  const bool vec = all_aligned16({p.x, p.y});
  const bool whole_vectors = vec && p.cols % Vec<T>::kN == 0;
  cudaError_t err = cudaSuccess;
  if (whole_vectors && launch_fwd_warp<T>(p, stream, &err)) return err != cudaSuccess ? err : cudaGetLastError();
  constexpr bool kF32 = sizeof(T) == sizeof(float);
  const Config cfg =
      whole_vectors && all_aligned16({p.mask}) ? pick_fwd_config(p.cols / Vec<T>::kN, kF32, p.mask != nullptr)
                                             : Config{};
  bool ran = false;
  switch (config_key(cfg.group, cfg.vecs, cfg.split)) {
    JAXCRAFT_FWD_ROWS_CASE(32, 1, 1)
    JAXCRAFT_FWD_ROWS_CASE(32, 2, 1)
    JAXCRAFT_FWD_ROWS_CASE(32, 4, 1)
    JAXCRAFT_FWD_ROWS_CASE(64, 4, 1)
    JAXCRAFT_FWD_ROWS_CASE(128, 4, 1)
    JAXCRAFT_FWD_ROWS_CASE(256, 4, 1)
    JAXCRAFT_FWD_ROWS_CASE(512, 4, 1)
    JAXCRAFT_FWD_ROWS_CASE(1024, 4, 1)
    JAXCRAFT_FWD_ROWS_CASE(512, 4, 8)
    JAXCRAFT_FWD_ROWS_CASE(1024, 4, 2)
    case config_key(1024, 4, 8):  // 16-bit only (pick_fwd_config: float32 takes 1024 x 8 x 4)
      if constexpr (!kF32) ran = launch_fwd_rows<T, 1024, 4, 8>(p, stream, &err);
      break;
    case config_key(1024, 8, 4):  // float32 only (pick_fwd_config): 16-bit rows would spill
      if constexpr (kF32) ran = launch_fwd_rows<T, 1024, 8, 4>(p, stream, &err);
      break;
    case config_key(512, 8, 2):  // float32, unmasked only (pick_fwd_config)
      if constexpr (kF32) ran = !p.mask && launch_fwd_rows_masked<T, 512, 8, 2, false>(p, stream, &err);
      break;
    default: break;
  }
  if (ran) return err;
  if (vec) fwd_stream<T, true>(p, stream);
  else fwd_stream<T, false>(p, stream);
  return cudaGetLastError();
}

// The backward's warp kernels: rows of 129..16384 vectors (16-bit 1032..
// 131072 columns, float32 516..65536), y and dy in registers, 8 vectors of
// each per lane: one to eight warps per row, past 2048 vectors clusters of
// 2, 4 or 8 one-row blocks of eight warps. Against the rows kernels (and,
// at 16-bit 512 vectors, one warp of 16 vectors per lane), same process,
// H200: bf16 [4k, 128k] 860 -> 762
// us (88% -> 99.6% of copy), [16k, 32k] 811 -> 734, [16k, 8k] 206 -> 187;
// f32 [16k, 8k] 394 -> 371, [16k, 32k] 1551 -> 1462; bf16 [16k, 4k] 96.0
// -> 95.7. False, launching nothing, for any other row and where clusters
// cannot run.
template <typename T, int kWarps>
void launch_bwd_warp_vecs(const SoftmaxBwdParams& p, cudaStream_t stream) {
  constexpr int kBlock = softmax::kBwdWarpBlock;
  softmax::softmax_bwd_warp_kernel<T, kWarps><<<warp_row_grid<kBlock, kWarps>(p.rows), kBlock, 0, stream>>>(p);
}
template <typename T, int kSplit>
bool launch_bwd_warp_cluster(const SoftmaxBwdParams& p, cudaStream_t stream, cudaError_t* err) {
  return launch_warp_cluster<softmax::softmax_bwd_warp_kernel<T, 8, kSplit>, kSplit, softmax::kBwdWarpBlock>(
      p, stream, err);
}

template <typename T>
bool launch_bwd_warp(const SoftmaxBwdParams& p, cudaStream_t stream, cudaError_t* err) {
  const int64_t vectors = p.cols / Vec<T>::kN;
  if (vectors < 129 || vectors > 16384) return false;
  if (vectors <= 256) launch_bwd_warp_vecs<T, 1>(p, stream);
  else if (vectors <= 512) launch_bwd_warp_vecs<T, 2>(p, stream);
  else if (vectors <= 1024) launch_bwd_warp_vecs<T, 4>(p, stream);
  else if (vectors <= 2048) launch_bwd_warp_vecs<T, 8>(p, stream);
  else if (vectors <= 4096) return launch_bwd_warp_cluster<T, 2>(p, stream, err);
  else if (vectors <= 8192) return launch_bwd_warp_cluster<T, 4>(p, stream, err);
  else return launch_bwd_warp_cluster<T, 8>(p, stream, err);
  return true;
}

template <typename T>
cudaError_t bwd_typed(const SoftmaxBwdParams& p, cudaStream_t stream) {
  const bool vec = all_aligned16({p.y, p.dy, p.dx});
  const bool whole_vectors = vec && p.cols % Vec<T>::kN == 0;
  cudaError_t err = cudaSuccess;
  if (whole_vectors && launch_bwd_warp<T>(p, stream, &err)) return err != cudaSuccess ? err : cudaGetLastError();
  const Config cfg = whole_vectors ? pick_bwd_config(p.cols / Vec<T>::kN) : Config{};
  bool ran = false;
  switch (config_key(cfg.group, cfg.vecs, cfg.split)) {
    JAXCRAFT_BWD_ROWS_CASE(32, 1, 1)
    JAXCRAFT_BWD_ROWS_CASE(32, 2, 1)
    JAXCRAFT_BWD_ROWS_CASE(64, 2, 1)
    JAXCRAFT_BWD_ROWS_CASE(512, 4, 16)
    default: break;
  }
  if (ran) return err;
  if (vec) bwd_stream<T, true>(p, stream);
  else bwd_stream<T, false>(p, stream);
  return cudaGetLastError();
}

#undef JAXCRAFT_FWD_ROWS_CASE
#undef JAXCRAFT_BWD_ROWS_CASE

}  // namespace

cudaError_t launch_softmax_fwd(const SoftmaxFwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_cuda_dtype(p.dtype, [&](auto x) { return fwd_typed<decltype(x)>(p, stream); });
}

cudaError_t launch_softmax_bwd(const SoftmaxBwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  return dispatch_cuda_dtype(p.dtype, [&](auto x) { return bwd_typed<decltype(x)>(p, stream); });
}

}  // namespace jaxcraft
