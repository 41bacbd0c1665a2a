// Device code shared by the decode kernels: the launch-time arguments, the
// paged-cache addressing, the per-row masks, the logits, conversions
// (cp.async: common/cuda/cp_async.cuh; the tensor-core wrappers the split kernel
// uses are the attention kernels', attention/mma_sm80.cuh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/convert.cuh"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/dependent_launch.cuh"
#include "common/cuda/fast_divmod.h"
#include "contract/decode.h"
#include "math/fast_math.h"

namespace jaxcraft {
namespace decode {

constexpr int kWarpSize = 32;
constexpr float kNegInf = -__builtin_huge_valf();

// DecodeParams plus what the launcher decided: the kernels read everything
// from this one struct (by value, in constant memory).
struct DecodeArgs {
  DecodeParams p;
  int num_splits = 1;
  int row_chunks = 1;          // CTAs that share one (b, kv head, split), kRows rows each
  FastDivmod page_size;        // key position -> (logical page, row in page)
  int page_shift = 0;          // log2(page_size) where it is a power of two
  FastDivmod group;            // query row r -> (token t, head in group g), r = t * G + g
};

__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The clamped length of sequence b and the key span its queries see
// (contract/decode.h): [span_begin, length).
struct SeqSpan {
  int length;
  int span_begin;
};

__device__ __forceinline__ SeqSpan seq_span(const DecodeParams& p, int b) {
  const int64_t capacity = p.max_pages * p.page_size;
  int64_t len = p.kv_lengths[b];
  len = len < 0 ? 0 : (len > capacity ? capacity : len);
  int64_t begin = 0;
  if (p.window_left >= 0) {
    begin = len - p.seqlen_q - p.window_left;
    begin = begin < 0 ? 0 : begin;
  }
  return {static_cast<int>(len), static_cast<int>(begin)};
}

// Tiles [begin, end) of kBlockN keys that split `split` of num_splits owns:
// the tiles overlapping the span, divided evenly. Tile boundaries are split
// boundaries, so no key belongs to two splits.
template <int kBlockN>
__device__ __forceinline__ void split_tiles(const SeqSpan& s, int split, int num_splits,
                                            int& begin, int& end) {
  const int first = s.span_begin / kBlockN;
  const int last = (s.length + kBlockN - 1) / kBlockN;
  const int count = last > first ? last - first : 0;
  const int per_split = (count + num_splits - 1) / num_splits;
  begin = first + split * per_split;
  end = min(last, begin + per_split);
  if (end < begin) end = begin;
}

// Row of the KV cache holding key j of sequence b: page * page_size + row in
// page, or -1 when the block table names a page outside the cache (the key
// is masked and never read). `page` is block_tables[b][j / page_size] for a
// paged cache (looked up ahead of time by the caller), b for a contiguous one.
__device__ __forceinline__ int cache_row(const DecodeArgs& a, int page, int j) {
  uint32_t logical, offset;
  a.page_size.divmod(static_cast<uint32_t>(j), logical, offset);
  if (page < 0 || page >= a.p.num_pages) return -1;
  return page * static_cast<int>(a.p.page_size) + static_cast<int>(offset);
}

// The page entry for key j of sequence b (an ordinary load: the callers
// issue it a tile ahead of its use, so its latency hides behind the math).
__device__ __forceinline__ int page_of(const DecodeArgs& a, int b, int j) {
  if (!a.p.paged) return b;
  const uint32_t logical = a.page_size.div(static_cast<uint32_t>(j));
  return __ldg(a.p.block_tables + static_cast<int64_t>(b) * a.p.max_pages + logical);
}

// Which keys query row r (within the KV head's group) sees: [lo, hi]; an
// empty interval (hi < lo) for rows past the group or before the cache.
struct RowWindow {
  int lo = 0;
  int hi = -1;
};

__device__ __forceinline__ RowWindow row_window(const DecodeArgs& a, const SeqSpan& s, int r) {
  RowWindow w;
  if (r >= a.p.seqlen_q * a.group.divisor) return w;
  const int t = static_cast<int>(a.group.div(static_cast<uint32_t>(r)));
  const int pos = s.length - static_cast<int>(a.p.seqlen_q) + t;
  w.hi = pos;  // <= length - 1 always
  w.lo = a.p.window_left >= 0 ? pos - static_cast<int>(a.p.window_left) : 0;
  return w;
}

// Element offset of query/output row r of KV head kh in sequence b.
__device__ __forceinline__ int64_t q_offset(const DecodeArgs& a, int b, int kh, int r) {
  uint32_t t, g;
  a.group.divmod(static_cast<uint32_t>(r), t, g);
  const int64_t n = static_cast<int64_t>(kh) * a.group.divisor + g;
  return ((static_cast<int64_t>(b) * a.p.seqlen_q + t) * a.p.num_heads + n) * a.p.head_dim;
}

// Index of row (b, t, n) of split `split` in partial_lse (times head_dim: partial_o).
__device__ __forceinline__ int64_t partial_row(const DecodeArgs& a, int split, int b, int kh,
                                               int r) {
  uint32_t t, g;
  a.group.divmod(static_cast<uint32_t>(r), t, g);
  const int64_t n = static_cast<int64_t>(kh) * a.group.divisor + g;
  return ((static_cast<int64_t>(split) * a.p.batch + b) * a.p.seqlen_q + t) * a.p.num_heads + n;
}

// The logit of a query-key dot product, in natural units: scale, then the soft cap.
__device__ __forceinline__ float logit(const DecodeParams& p, float dot) {
  float x = dot * p.scale;
  if (p.soft_cap > 0.f) x = p.soft_cap * tanhf(x / p.soft_cap);
  return x;
}

// The logit in the log2 units the softmax uses.
__device__ __forceinline__ float scaled_logit(const DecodeParams& p, float dot) {
  return logit(p, dot) * kLog2e;
}

// Four consecutive output elements from float32.
template <typename T>
__device__ __forceinline__ void store4(T* dst, float4 v) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(dst) = v;
  } else {
    struct alignas(8) Four { T x[4]; } out;
    out.x[0] = from_f32<T>(v.x);
    out.x[1] = from_f32<T>(v.y);
    out.x[2] = from_f32<T>(v.z);
    out.x[3] = from_f32<T>(v.w);
    *reinterpret_cast<Four*>(dst) = out;
  }
}

}  // namespace decode
}  // namespace jaxcraft
