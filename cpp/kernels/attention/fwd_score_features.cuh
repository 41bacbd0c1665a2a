// FwdScoreFeatures: what the portable forward's feature instances (kLevel >
// 0, score_tile.cuh: FeatLevel) do to a score tile: the interval masks and
// rows past q_len, segment ids and the boolean mask per element; at
// kFeatScores also the logit transform (scale, soft cap, bias) and dropout.
// The plain instance calls none of it.
#pragma once
#include <cmath>
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_mods.cuh"
#include "kernels/attention/score_tile.cuh"

namespace jaxcraft {
namespace attn {

template <DType kDt, class Sh, int kLevel>
struct FwdScoreFeatures {
  static constexpr int kMT = Sh::kMTiles, kKeyTiles = Sh::kKeyTiles, kBN = Sh::kBlockN;
  using Scores = float[kMT][kKeyTiles][4];

  // The kernel's values, by reference as a lambda's captures: nvcc optimizes
  // this before inlining it, and copies held in members compiled differently.
  const FwdArgs& a;
  const SeqLens& lens;
  const ElemStage& est;  // where the bias and mask blocks are staged
  unsigned char* smem;
  const int& b;
  const int& head;
  const int& m0;
  const int& warp_row0;
  const int& g;
  const int& t;
  const bool& prescale;  // a non-positive scale, applied to the raw scores
  const float& scale_log2;
  int (&q_seg)[kMT][2];  // segment id of each of this thread's rows
  float& inv_cap;        // 1 / softcap

  // Row segment ids (rows past q_len see no key and never read theirs), 1 / softcap.
  __device__ __forceinline__ void load_rows() const {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = m0 + warp_row0 + mt * kMmaM + g + 8 * h;
        q_seg[mt][h] = a.mask.q_segment_ids != nullptr && i < lens.q_len
                           ? a.mask.q_segment_ids[int64_t(b) * a.shape.seqlen_q + i]
                           : 0;
      }
    if constexpr (kLevel == kFeatScores) {
      inv_cap = a.scores.softcap > 0.f ? 1.f / a.scores.softcap : 0.f;
    }
  }

  // Per-element masking of the tile of keys n0..: at kFeatScores the scores
  // also become logits x = cap(scale * s) + bias (the softmax then runs with
  // scale log2(e)); at kFeatMasks a non-positive scale is applied first, as
  // in the plain path.
  __device__ __forceinline__ void apply(Scores& s, int n0) const {
    const MaskArgs& mk = a.mask;
    const ScoreArgs& sc = a.scores;
    if constexpr (kLevel == kFeatMasks) {
      if (prescale) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][j][e] *= scale_log2;
      }
    }
    // Key segment ids of this thread's columns, read once for all its rows.
    int kv_seg[kKeyTiles][2];
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = n0 + j * kMmaN + 2 * t + e;
        kv_seg[j][e] = mk.q_segment_ids != nullptr && c < lens.kv_len
                           ? mk.kv_segment_ids[int64_t(b) * a.shape.seqlen_k + c]
                           : 0;
      }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = m0 + warp_row0 + mt * kMmaM + g + 8 * h;
        int lo, hi;
        key_range(mk, i, i, lens.kv_len, &lo, &hi);
        if (i >= lens.q_len) hi = lo;
        const int rl = warp_row0 + mt * kMmaM + g + 8 * h;  // row in the tile
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
          const int cl = j * kMmaN + 2 * t, c0 = n0 + cl;
          const uint32_t mbits =
              est.mask_off >= 0 ? staged_mask_pair<kBN>(smem + est.mask_off, rl, cl) : 3u;
          bool vis[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            bool v = c0 + e >= lo && c0 + e < hi && ((mbits >> e) & 1u);
            if (mk.q_segment_ids != nullptr) v = v && kv_seg[j][e] == q_seg[mt][h];
            vis[e] = v;
          }
          float* x = s[mt][j] + 2 * h;
          if constexpr (kLevel == kFeatMasks) {
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (!vis[e]) x[e] = -INFINITY;
          } else {
            float2 bv = make_float2(0.f, 0.f);
            if (est.bias_elem)
              bv = staged_bias_pair<kDt, kBN>(smem + est.bias_off, est.bias_elem == 4, rl, cl);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float v = x[e] * a.scale;
              if (sc.softcap > 0.f) v = soft_cap_fast(v, sc.softcap, inv_cap);
              v += e ? bv.y : bv.x;
              x[e] = vis[e] ? v : -INFINITY;
            }
          }
        }
      }
    }
  }

  // Dropout (kFeatScores) hits P after its row sum: the lse and the
  // normalization are those of the undropped softmax, and 1 / (1 - rate) is
  // applied to O in the epilogue, which keeps 16-bit P in range.
  __device__ __forceinline__ void drop(Scores& s, int n0) const {
    if (a.scores.dropout_key != nullptr) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int r0 = m0 + warp_row0 + mt * kMmaM + g;
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) {
          const uint32_t keep = dropout_bits_rows(a.scores, b, head, r0, r0 + 8,
                                                  n0 + j * kMmaN + 2 * t, t);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!((keep >> e) & 1u)) s[mt][j][e] = 0.f;
        }
      }
    }
  }
};

}  // namespace attn
}  // namespace jaxcraft
