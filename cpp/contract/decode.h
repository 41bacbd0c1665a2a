// The host <-> kernel contract for decode attention (split-K flash decoding),
// read by the handler, the CPU kernel and the CUDA launcher, and what the
// CUDA kernels take. No XLA, CUDA or nanobind types.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "contract/dtype.h"

namespace jaxcraft {

// Shapes (row-major):
//   q, o        : [B, Tq, N, H]                    (dtype)
//   k, v        : contiguous [B, S, K, H], or paged [P, page_size, K, H] (dtype)
//   kv_lengths  : [B] int32
//   block_tables: [B, max_pages] int32 (paged only)
//   partial_o   : [max_splits, B, Tq, N, H] float32 scratch (split-K partials)
//   partial_lse : [max_splits, B, Tq, N]    float32 scratch
// N % K == 0; query head n reads KV head n / (N / K).
//
// A contiguous cache is the paged layout with one page per sequence:
// num_pages = B, page_size = S, max_pages = 1 and the implicit table
// block_tables[b] = {b}. Every kernel addresses keys through that view.
//
// Semantics, per sequence b (both kernels and the Python reference):
//   capacity = max_pages * page_size
//   L        = clamp(kv_lengths[b], 0, capacity)       (longer lengths are clamped)
//   query token t sits at position pos = L - Tq + t and sees key j iff
//     j <= pos, j < L, j >= pos - window_left (when window_left >= 0),
//     and key j's page block_tables[b][j / page_size] lies in [0, num_pages).
//   An out-of-range page entry masks its keys: it is never dereferenced.
//   logits = scale * q.k; with soft_cap > 0, logits = soft_cap * tanh(logits / soft_cap);
//   softmax in float32; a row that sees no key gives o = 0.
struct DecodeParams {
  DType dtype = DType::kBF16;
  int64_t batch = 0, seqlen_q = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;

  bool paged = false;
  int64_t num_pages = 0, page_size = 0, max_pages = 0;

  float scale = 1.f;
  float soft_cap = 0.f;       // <= 0: no soft cap
  int64_t window_left = -1;   // < 0: unbounded

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int32_t* kv_lengths = nullptr;
  const int32_t* block_tables = nullptr;  // null when !paged
  void* o = nullptr;

  // Scratch from extra XLA outputs, never allocated by the launcher. The
  // launcher picks at most max_splits splits (max_splits = 0: one split,
  // which needs no scratch).
  float* partial_o = nullptr;
  float* partial_lse = nullptr;
  int64_t max_splits = 0;

  int64_t group() const { return num_kv_heads > 0 ? num_heads / num_kv_heads : 1; }
  int64_t capacity() const { return max_pages * page_size; }
  // Query rows that share one KV head: G query heads x Tq tokens.
  int64_t rows_per_kv_head() const { return group() * seqlen_q; }
};

// The valid cache length of sequence b (see above); `len` is kv_lengths[b].
inline int64_t clamp_kv_length(int64_t len, int64_t capacity) {
  return std::min<int64_t>(std::max<int64_t>(len, 0), capacity);
}

// What the CUDA decode kernels take: head dims up to 256 in multiples of 8,
// cache rows addressed with int32. Python asks this
// (jaxcraft._jaxcraft.decode_attention_cuda_unsupported) before it picks the
// kernels, and the handler before it launches them.
constexpr int kDecodeCudaMaxHeadDim = 256;
constexpr int kDecodeCudaHeadDimMultiple = 8;
constexpr int64_t kDecodeCudaMaxCacheRows = std::numeric_limits<int32_t>::max();

// Why the CUDA decode kernels cannot take this input, or null: `cache_rows`
// rows in the cache buffers, `capacity` positions a sequence can address.
inline const char* decode_attention_cuda_unsupported(int64_t head_dim, int64_t cache_rows,
                                                     int64_t capacity) {
  thread_local char why[128];
  if (head_dim % kDecodeCudaHeadDimMultiple != 0 || head_dim > kDecodeCudaMaxHeadDim) {
    std::snprintf(why, sizeof why,
                  "the CUDA decode kernels need a head dim <= %d and a multiple of %d; got %lld",
                  kDecodeCudaMaxHeadDim, kDecodeCudaHeadDimMultiple, static_cast<long long>(head_dim));
    return why;
  }
  if (std::max(cache_rows, capacity) > kDecodeCudaMaxCacheRows)
    return "the CUDA decode kernels index cache rows with 32-bit integers; this cache is larger";
  return nullptr;
}

inline const char* decode_attention_cuda_unsupported(const DecodeParams& p) {
  return decode_attention_cuda_unsupported(p.head_dim, p.num_pages * p.page_size, p.capacity());
}

}  // namespace jaxcraft
