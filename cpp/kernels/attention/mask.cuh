// Which (query row, key) pairs are visible, at element and tile granularity.
// Launchers bound every size and offset by 2^28 and windows by 2^29, so the
// sums below stay inside int32.
#pragma once
#include <cmath>

#include "contract/attention.h"
#include "kernels/attention/kernel_args.h"

namespace jaxcraft {
namespace attn {

struct SeqLens {
  int q_len;
  int kv_len;
};

__device__ __forceinline__ SeqLens seq_lens(const MaskArgs& m, const ShapeArgs& s, int b) {
  SeqLens r{s.seqlen_q, s.seqlen_k};
  if (m.q_lengths) r.q_len = min(max(m.q_lengths[b], 0), s.seqlen_q);
  if (m.kv_lengths) r.kv_len = min(max(m.kv_lengths[b], 0), s.seqlen_k);
  return r;
}

__device__ __forceinline__ bool key_visible(const MaskArgs& m, int i, int j, int kv_len) {
  const int d = i + m.offset;
  return j < kv_len && !(m.causal && j > d) && !(m.window_left >= 0 && j < d - m.window_left) &&
         !(m.window_right >= 0 && j > d + m.window_right);
}

// Keys [*lo, *hi) that some row in [r0, r1] may see.
__device__ __forceinline__ void key_range(const MaskArgs& m, int r0, int r1, int kv_len, int* lo,
                                          int* hi) {
  int h = kv_len, l = 0;
  if (m.causal) h = min(h, r1 + m.offset + 1);
  if (m.window_right >= 0) h = min(h, r1 + m.offset + m.window_right + 1);
  if (m.window_left >= 0) l = max(l, r0 + m.offset - m.window_left);
  *lo = l;
  *hi = h;
}

// Query rows [*lo, *hi) that may see some key in [c0, c1].
__device__ __forceinline__ void query_range(const MaskArgs& m, int c0, int c1, int q_len, int* lo,
                                            int* hi) {
  int l = 0, h = q_len;
  if (m.causal) l = max(l, c0 - m.offset);
  if (m.window_right >= 0) l = max(l, c0 - m.offset - m.window_right);
  if (m.window_left >= 0) h = min(h, c1 - m.offset + m.window_left + 1);
  *lo = l;
  *hi = h;
}

// True when some pair in rows [r0, r1] x keys [c0, c1] is hidden, so the
// tile needs per-element masking; interior tiles skip it.
__device__ __forceinline__ bool tile_is_partial(const MaskArgs& m, int r0, int r1, int c0, int c1,
                                                int kv_len) {
  return c1 >= kv_len || (m.causal && c1 > r0 + m.offset) ||
         (m.window_right >= 0 && c1 > r0 + m.offset + m.window_right) ||
         (m.window_left >= 0 && c0 < r1 + m.offset - m.window_left);
}

// --- Segment ids and the boolean mask (contract/attention.h: AttentionMask) -------------
// These hide single elements, so a tile they touch always needs per-element
// masking; segment ranges also narrow which tiles are visited at all.

// Narrows keys [*lo, *hi) to those sharing a segment with rows [r0, r1] of
// batch b (a no-op without segment ids). *lo >= *hi afterwards: no key.
__device__ __forceinline__ void segment_key_range(const MaskArgs& m, const ShapeArgs& s, int b,
                                                  int r0, int r1, int* lo, int* hi) {
  if (m.segment_key_range == nullptr) return;
  const int blocks = (s.seqlen_q + kSegmentBlock - 1) / kSegmentBlock;
  const int* r = m.segment_key_range + 2 * (static_cast<long long>(b) * blocks);
  int l = s.seqlen_k, h = 0;
  for (int blk = r0 / kSegmentBlock; blk <= r1 / kSegmentBlock; ++blk) {
    l = min(l, r[2 * blk]);
    h = max(h, r[2 * blk + 1]);
  }
  *lo = max(*lo, l);
  *hi = min(*hi, h);
}

// Narrows rows [*lo, *hi) to those sharing a segment with keys [c0, c1].
__device__ __forceinline__ void segment_query_range(const MaskArgs& m, const ShapeArgs& s, int b,
                                                    int c0, int c1, int* lo, int* hi) {
  if (m.segment_query_range == nullptr) return;
  const int blocks = (s.seqlen_k + kSegmentBlock - 1) / kSegmentBlock;
  const int* r = m.segment_query_range + 2 * (static_cast<long long>(b) * blocks);
  int l = s.seqlen_q, h = 0;
  for (int blk = c0 / kSegmentBlock; blk <= c1 / kSegmentBlock; ++blk) {
    l = min(l, r[2 * blk]);
    h = max(h, r[2 * blk + 1]);
  }
  *lo = max(*lo, l);
  *hi = min(*hi, h);
}

// Sets the hidden scores of a thread's C-layout fragment slab to -inf: its
// rows are `row` (g) and row + 8, its columns n0 + 8 j + 2 t + {0, 1}. Each
// row sees one key interval, so the mask is two compares per score.
template <int kKeyTiles>
__device__ __forceinline__ void mask_slab(float (&s)[kKeyTiles][4], const MaskArgs& m, int row,
                                          int n0, int t, int kv_len) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int lo, hi;
    key_range(m, row + 8 * h, row + 8 * h, kv_len, &lo, &hi);
    lo -= n0 + 2 * t;
    hi -= n0 + 2 * t;
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = j * 8 + e;
        if (col < lo || col >= hi) s[j][2 * h + e] = -INFINITY;
      }
  }
}

}  // namespace attn
}  // namespace jaxcraft
