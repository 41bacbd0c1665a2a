// FwdScoreFeatures: what the Hopper forward's feature instances (kFeat,
// features.cuh) add to a consumer's score tile: the logit transform (soft
// cap, bias), the segment-id and boolean masks, and dropout. The plain
// instance compiles none of it.
#pragma once
#include <cmath>
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/fwd_consumer_item.cuh"
#include "kernels/attention/sm90/fwd_smem.cuh"
#include "kernels/attention/softmax.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <DType kDt, class Cfg, int kFeat>
struct FwdScoreFeatures {
  static constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  using Scores = float[1][kBN / 8][4];
  const FwdSm90Args& p;
  const FwdSmem<Cfg>& sm;
  const FwdConsumerThread& th;
  const FwdItem& item;
  // Segment ids of this thread's two rows and the warp's id range
  // (load_row_ids).
  const int (&row_id)[2];
  const int &row_id_lo, &row_id_hi;

  // Segment ids of this thread's two rows (rows past T read row T - 1:
  // their output is dropped) and the warp's id range, held for the work
  // item; the keys' ids come through the ring (ids_vec).
  static __device__ __forceinline__ void load_row_ids(const FwdSm90Args& p, const FwdItem& item, int (&row_id)[2],
                                                      int& row_id_lo, int& row_id_hi) {
    if constexpr (kFeat != kPlain) {
      const FwdArgs& a = p.a;
      const ShapeArgs& sh = a.shape;
      if (a.mask.q_segment_ids != nullptr) {
        const int32_t* q_ids = a.mask.q_segment_ids + int64_t(item.b) * sh.seqlen_q;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          row_id[h] = __ldg(q_ids + min(item.m0 + item.thread_row0 + 8 * h, sh.seqlen_q - 1));
        row_id_lo = warp_min(min(row_id[0], row_id[1]));
        row_id_hi = warp_max(max(row_id[0], row_id[1]));
      }
    }
  }

  // The logit transform (with `transform`: the scores become x log2(e), x
  // the final logit) and the per-element masks of tile nt. Fragment
  // element sc[0][j][2 h + e] is row m0 + thread_row0 + 8 h, key nt * kBN +
  // 8 j + 2 t + e.
  __device__ void apply(Scores& sc, int nt, bool transform) const {
    const FwdArgs& a = p.a;
    const ShapeArgs& sh = a.shape;
    const int m0 = item.m0, head = item.head, b = item.b, thread_row0 = item.thread_row0;
    const int t = th.t;
    const int n0 = nt * kBN;
    const uint32_t ids = sm.ids_vec(sm.ring.stage(item.it0 + nt - item.t_begin));
    int cover = kSegAllVisible;
    if (a.mask.q_segment_ids != nullptr) {
      int2 range;
      asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                   : "=r"(range.x), "=r"(range.y)
                   : "r"(ids + 4 * kBN));
      cover = segment_cover(row_id_lo, row_id_hi, range.x, range.y);
    }
    if (transform) {
      float cap = 0.f, inv_cap = 0.f;
      const void* bias = nullptr;
      bool f32 = false;
      if constexpr (kFeat >= kScores) {
        cap = a.scores.softcap;
        inv_cap = cap > 0.f ? 1.f / cap : 0.f;
        bias = a.scores.bias;
        f32 = a.scores.bias_f32;
      }
      if constexpr (kFeat == kBias) {
        // From the stage's tile: key pairs 8 j + 2 t + {0, 1} in one
        // conflict-free shared load.
        const uint32_t tile = sm.bias_tile(sm.ring.stage(item.it0 + nt - item.t_begin));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = thread_row0 + 8 * h;
#pragma unroll
          for (int j = 0; j < kBN / 8; ++j) {
            const uint32_t at = bias_tile_addr(tile, kBM, f32, r, 8 * j + 2 * t);
            float2 bv;
            if (f32) {
              bv = ld_shared_f2(at);
            } else {
              uint32_t w;
              asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w) : "r"(at));
              bv = unpack2<kDt>(w);
            }
            sc[0][j][2 * h] = (capped_logit(sc[0][j][2 * h], a.scale, cap, inv_cap) + bv.x) * kLog2e;
            sc[0][j][2 * h + 1] =
                (capped_logit(sc[0][j][2 * h + 1], a.scale, cap, inv_cap) + bv.y) * kLog2e;
          }
        }
      } else if (bias != nullptr) {
        // Key pairs 8 j + 2 t + {0, 1} in one load when aligned (keys past
        // S read the last pair: they are hidden by the length mask).
        const bool pairs = bias_pairs_aligned(a.scores, sh.seqlen_k);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = min(m0 + thread_row0 + 8 * h, sh.seqlen_q - 1);
          const long long row_at = b * a.scores.bias_stride_b + head * a.scores.bias_stride_n +
                                   static_cast<long long>(r) * sh.seqlen_k;
#pragma unroll
          for (int j = 0; j < kBN / 8; ++j) {
            const int key = n0 + 8 * j + 2 * t;
            float2 bv;
            if (pairs) {
              bv = bias_pair<kDt>(bias, f32, row_at + min(key, sh.seqlen_k - 2));
            } else {
              bv.x = bias_at<kDt>(bias, f32, row_at + min(key, sh.seqlen_k - 1));
              bv.y = bias_at<kDt>(bias, f32, row_at + min(key + 1, sh.seqlen_k - 1));
            }
            sc[0][j][2 * h] = (capped_logit(sc[0][j][2 * h], a.scale, cap, inv_cap) + bv.x) * kLog2e;
            sc[0][j][2 * h + 1] =
                (capped_logit(sc[0][j][2 * h + 1], a.scale, cap, inv_cap) + bv.y) * kLog2e;
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            sc[0][j][e] = capped_logit(sc[0][j][e], a.scale, cap, inv_cap) * kLog2e;
      }
    }
    // Segment ids and the boolean mask as visibility bits (bit 2 j + e of
    // vis[h]), applied in one pass. A warp whose rows share no segment with
    // the tile (rare: tiles come from segment_key_range) takes the same
    // path with nothing visible: an early-out there costs the overlapped
    // loop spills. The bit loops stay rolled, so the compiler cannot hoist
    // all their loads and shuffles at once.
    const bool has_mask = a.mask.mask != nullptr;
    if (cover != kSegAllVisible || has_mask) {
      uint32_t vis[2] = {0u, 0u};
      if (cover == kSegMixed) {
#pragma unroll 1
        for (int j = 0; j < kBN / 8; ++j) {
          int2 id;
          asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                       : "=r"(id.x), "=r"(id.y)
                       : "r"(ids + 4 * (8 * j + 2 * t)));
#pragma unroll
          for (int h = 0; h < 2; ++h)
            vis[h] |= (uint32_t(id.x == row_id[h]) | uint32_t(id.y == row_id[h]) << 1) << (2 * j);
        }
      } else if (cover == kSegAllVisible) {
        vis[0] = vis[1] = ~0u;
      }
      if (has_mask) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = min(m0 + thread_row0 + 8 * h, sh.seqlen_q - 1);
          const uint8_t* mrow = a.mask.mask + b * a.mask.mask_stride_b +
                                head * a.mask.mask_stride_n + static_cast<long long>(r) * sh.seqlen_k;
          uint32_t bits = 0u;
#pragma unroll 1
          for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = min(n0 + 8 * j + 2 * t + e, sh.seqlen_k - 1);
              bits |= uint32_t(__ldg(mrow + key) != 0) << (2 * j + e);
            }
          vis[h] &= bits;
        }
      }
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (!((vis[h] >> (2 * j + e)) & 1u)) sc[0][j][2 * h + e] = -INFINITY;
    }
  }

  // kDropout: zero the dropped probabilities of tile nt (after the row sums
  // took them: the softmax is that of all keys); the epilogue scales by
  // 1 / (1 - rate). Keys 4 j4 .. + 3 of a row share a Philox block; this
  // thread's pair 8 j + 2 t + {0, 1} of row h is words 2 (t % 2) + {0, 1}
  // of block (row h, (nt kBN + 8 j) / 4 + t / 2). The quad needs four
  // blocks per j: lane t computes the one of row t % 2 and swaps halves
  // with lane t ^ 1, which needs the same block's other words.
  __device__ void drop(Scores& sc, int nt) const {
    if constexpr (kFeat == kDropout) {
      const FwdArgs& a = p.a;
      const int m0 = item.m0, head = item.head, b = item.b, thread_row0 = item.thread_row0;
      const int t = th.t;
      const uint32_t key[2] = {a.scores.dropout_key[0], a.scores.dropout_key[1]};
      const uint32_t rb = a.scores.dropout_broadcast ? 0 : b;
      const uint32_t rn = a.scores.dropout_broadcast ? 0 : head;
      const uint32_t thr = a.scores.dropout_threshold;
      const bool odd = t & 1;
      const uint32_t i = m0 + thread_row0 + 8 * odd;  // this lane's block row
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        const Philox4 w = dropout_block(key, rb, rn, i, (nt * kBN + 8 * j) / 4 + (t >> 1));
        // Own words 2 (t % 2) + {0, 1} serve row t % 2; the partner's
        // block, same words, serves the other row.
        const uint32_t own0 = odd ? w.x[2] : w.x[0], own1 = odd ? w.x[3] : w.x[1];
        const uint32_t give0 = odd ? w.x[0] : w.x[2], give1 = odd ? w.x[1] : w.x[3];
        const uint32_t got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
        const uint32_t got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool mine = h == int(odd);
          if ((mine ? own0 : got0) < thr) sc[0][j][2 * h] = 0.f;
          if ((mine ? own1 : got1) < thr) sc[0][j][2 * h + 1] = 0.f;
        }
      }
    }
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
