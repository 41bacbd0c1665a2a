// Chooses the kernel (dtype -> head-dim bucket) and the number of splits,
// and launches the split kernel and, with more than one split, the combine.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "common/cuda/convert.cuh"
#include "common/cuda/device_cache.h"
#include "kernels/decode/combine_kernel.cuh"
#include "kernels/decode/launch.h"
#include "kernels/decode/split_mma_kernel.cuh"
#include "kernels/decode/split_simt_kernel.cuh"

namespace jaxcraft {
namespace {

using decode::DecodeArgs;

constexpr size_t kDefaultSmemLimit = 48 * 1024;  // above this a kernel must opt in

// A split shorter than this many keys spends more on its pipeline fill and
// its partial write + combine than the extra parallelism saves, unless even
// splits of this length leave the grid under one wave (short caches at small
// batches): there the call is one round of loads, and its time is the
// longest CTA's, so splits go down to one key tile.
constexpr int64_t kMinKeysPerSplit = 256;
// Accept the fewest splits whose last wave is at least this full, relative to
// the best split count: more splits only add partials to write and combine.
constexpr double kWaveEfficiency = 0.95;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Splits per (b, kv head, row chunk), from the shape and the GPU alone (no
// lengths: they live on the device). One wave of `resident` CTAs streams at
// full bandwidth; a partly filled last wave idles SMs. So: among 1..most
// splits, the fewest whose wave fill (waves / ceil(waves)) is within
// kWaveEfficiency of the best; then, where that grid is a single wave, as
// many as the wave holds: the extra splits add no wave and shorten every
// CTA's stream (1 x 128k: 32 -> 33 splits, 0.9% faster on the H200, 0.5% on
// the H100; docs/design.md). E.g. H100 (132 SMs x 2 CTAs), 32/8 heads, D128:
// 1 x 128k -> 33 splits, 1 x 1k -> 16 (one tile each), 8 x 32k -> 4, 64 x 4k
// and 256 x 1k -> 1.
int choose_splits(int64_t ctas, int64_t keys, int64_t resident, int64_t max_splits,
                  int64_t tile_keys) {
  int64_t most = std::min(max_splits, keys / kMinKeysPerSplit);
  if (ctas * std::max<int64_t>(most, 1) < resident)
    most = std::min(max_splits, ceil_div(keys, tile_keys));
  if (most <= 1 || ctas <= 0) return 1;
  auto fill = [&](int64_t splits) {
    const double waves = static_cast<double>(ctas * splits) / static_cast<double>(resident);
    return waves / std::ceil(waves);
  };
  double best = 0.0;
  for (int64_t s = 1; s <= most; ++s) best = std::max(best, fill(s));
  int64_t splits = 1;
  while (splits < most && fill(splits) < kWaveEfficiency * best) ++splits;
  if (ctas * splits <= resident) splits = std::max(splits, std::min(most, resident / ctas));
  return static_cast<int>(splits);
}

// Launches split kernel `kernel` (Cfg: its tile constants; kVariant tells
// apart kernels of one Cfg, whose occupancy is cached separately: the
// cache layout) and the combine.
template <typename T, typename Cfg, int kVariant = 0>
cudaError_t run(const DecodeParams& p, void (*kernel)(DecodeArgs), size_t smem,
                cudaStream_t stream) {
  static std::atomic<int> resident_cache[kMaxCachedDevices];  // CTAs per SM, per device
  cudaError_t err = cudaSuccess;
  if (smem > kDefaultSmemLimit &&
      (err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem))) != cudaSuccess)
    return err;
  int sms = 0, per_sm = 0;
  if ((err = multiprocessor_count(&sms)) != cudaSuccess) return err;
  err = per_device(resident_cache, [&](int, int* v) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(v, kernel, Cfg::kThreads, smem);
  }, &per_sm);
  if (err != cudaSuccess) return err;

  DecodeArgs a;
  a.p = p;
  a.group = FastDivmod::make(static_cast<uint32_t>(p.group()));
  a.page_size = FastDivmod::make(static_cast<uint32_t>(std::max<int64_t>(p.page_size, 1)));
  while ((int64_t{2} << a.page_shift) <= p.page_size) ++a.page_shift;  // floor(log2)
  a.row_chunks = static_cast<int>(ceil_div(p.rows_per_kv_head(), Cfg::kRows));
  const int64_t ctas = p.batch * p.num_kv_heads * a.row_chunks;
  int64_t keys = p.capacity();  // the longest key span a query group can see
  if (p.window_left >= 0) keys = std::min(keys, p.seqlen_q + p.window_left);
  const bool have_scratch = p.partial_o != nullptr && p.partial_lse != nullptr;
  a.num_splits = choose_splits(ctas, keys, sms * per_sm, have_scratch ? p.max_splits : 1,
                               Cfg::kBlockN);

  const int64_t grid = ctas * a.num_splits;
  if (grid <= 0) return cudaSuccess;
  if (grid > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidConfiguration;
  // Both kernels launch as dependents (common/cuda/dependent_launch.cuh): each
  // one's launch overlaps the tail of the kernel before it in the stream.
  static std::atomic<int> split_early[kMaxCachedDevices], combine_early[kMaxCachedDevices];
  err = launch_dependent(split_early, kernel, static_cast<unsigned>(grid), Cfg::kThreads, smem,
                         stream, a);
  if (err != cudaSuccess || a.num_splits == 1) return err;
  const int64_t rows = p.batch * p.seqlen_q * p.num_heads;  // one combine CTA each
  if (rows > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidConfiguration;
  return launch_dependent(combine_early, decode::decode_combine_kernel<T>,
                          static_cast<unsigned>(rows), decode::kCombineThreads, 0, stream, a);
}

// Head dims are padded up to a bucket (zeros in shared memory, no global reads).
int head_dim_bucket(int64_t head_dim) { return head_dim <= 64 ? 64 : (head_dim <= 128 ? 128 : 256); }

// The split kernel for one cache layout; the layout also keys run's caches.
template <typename T, int kHeadDim, decode::KvLayout kLayout>
cudaError_t run_layout(const DecodeParams& p, cudaStream_t stream) {
  using Cfg = decode::MmaConfig<T, kHeadDim>;
  return run<T, Cfg, static_cast<int>(kLayout)>(
      p, decode::decode_split_mma_kernel<T, kHeadDim, kLayout>, Cfg::kSmemBytes, stream);
}

template <typename T, int kHeadDim>
cudaError_t run_mma_head_dim(const DecodeParams& p, cudaStream_t stream) {
  using decode::KvLayout;
  switch (decode::MmaConfig<T, kHeadDim>::kv_layout(p)) {
    case KvLayout::kContiguous: return run_layout<T, kHeadDim, KvLayout::kContiguous>(p, stream);
    case KvLayout::kTilePages: return run_layout<T, kHeadDim, KvLayout::kTilePages>(p, stream);
    case KvLayout::kPassPages: return run_layout<T, kHeadDim, KvLayout::kPassPages>(p, stream);
    default: return run_layout<T, kHeadDim, KvLayout::kRowPages>(p, stream);
  }
}

template <typename T>
cudaError_t run_mma(const DecodeParams& p, cudaStream_t stream) {
  switch (head_dim_bucket(p.head_dim)) {
    case 64: return run_mma_head_dim<T, 64>(p, stream);
    case 128: return run_mma_head_dim<T, 128>(p, stream);
    default: return run_mma_head_dim<T, 256>(p, stream);
  }
}

cudaError_t run_simt(const DecodeParams& p, cudaStream_t stream) {
  using decode::SimtConfig;
  switch (head_dim_bucket(p.head_dim)) {
    case 64:
      return run<float, SimtConfig<64>>(p, decode::decode_split_simt_kernel<64>, 0, stream);
    case 128:
      return run<float, SimtConfig<128>>(p, decode::decode_split_simt_kernel<128>, 0, stream);
    default:
      return run<float, SimtConfig<256>>(p, decode::decode_split_simt_kernel<256>, 0, stream);
  }
}

}  // namespace

cudaError_t launch_decode_attention(const DecodeParams& p, cudaStream_t stream) {
  if (decode_attention_cuda_unsupported(p) != nullptr) return cudaErrorInvalidValue;
  if (p.batch * p.seqlen_q * p.num_heads * p.head_dim == 0) return cudaSuccess;
  return dispatch_cuda_dtype(p.dtype, [&](auto x) {
    if constexpr (std::is_same_v<decltype(x), float>) return run_simt(p, stream);
    else return run_mma<decltype(x)>(p, stream);
  });
}

}  // namespace jaxcraft
