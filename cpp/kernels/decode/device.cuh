// Device code shared by the decode kernels: the launch-time arguments, the
// paged-cache addressing, the per-row masks, and sm_80 PTX wrappers
// (ldmatrix, mma.sync m16n8k16; cp.async: common/cp_async.cuh).
//
// mma.m16n8k16 fragments (PTX ISA), lane = 4 * g + t, g in [0, 8), t in [0, 4):
//   A (16x16 rows x k): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8  k x cols): b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..2t+9, col g)
//   C (16x8):           c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/cp_async.cuh"
#include "kernels/decode/fast_divmod.h"
#include "kernels/decode/params.h"

namespace jaxcraft {
namespace decode {

constexpr int kWarpSize = 32;
constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))
constexpr float kNegInf = -__builtin_huge_valf();

// DecodeParams plus what the launcher decided: the kernels read everything
// from this one struct (by value, in constant memory).
struct DecodeArgs {
  DecodeParams p;
  int num_splits = 1;
  int row_chunks = 1;          // CTAs that share one (b, kv head, split), kRows rows each
  FastDivmod page_size;        // key position -> (logical page, row in page)
  FastDivmod group;            // query row r -> (token t, head in group g), r = t * G + g
};

__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The clamped length of sequence b and the key span its queries see
// (params.h): [span_begin, length).
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

// Logit (natural units) -> the log2-domain value the softmax uses.
__device__ __forceinline__ float scaled_logit(const DecodeParams& p, float dot) {
  float x = dot * p.scale;
  if (p.soft_cap > 0.f) x = p.soft_cap * tanhf(x / p.soft_cap);
  return x * kLog2e;
}

// ---------------------------------------------------------------- conversions
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

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

// ---------------------------------------------------------------- sm_80 PTX
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b for one 16x8x16 tile, 16-bit inputs, float32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two float32 values as one register of two 16-bit elements (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

}  // namespace decode
}  // namespace jaxcraft
