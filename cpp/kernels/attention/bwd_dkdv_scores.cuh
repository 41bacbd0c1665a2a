// DkdvScores: phase A of the portable dK/dV kernel for one query tile: a
// warp's 16 keys x kQCols queries of S^T = K.Q^T and dP^T = V.dO^T (mma.sync,
// operands from shared memory), P^T recomputed from lse and masked, and
// dS^T = P^T * (dP^T - delta) from the 16-bit P^T (the values phase B
// multiplies); P^T and dS^T go to shared memory as 16-bit tiles. The feature
// instances add the per-element visibility (segment ids, boolean mask), the
// soft cap, bias and dropout, and stage the fp32 dS^T for write_dbias.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/bwd_dkdv_shape.cuh"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_mods.cuh"
#include "kernels/attention/score_tile.cuh"
#include "kernels/attention/softmax.cuh"

namespace jaxcraft {
namespace attn {

template <DType kDt, class Sh, int kLevel>
struct DkdvScores {
  using Elem = typename ElemOf<kDt>::type;
  static constexpr int kHeadDim = Sh::kHeadDim, kBM = Sh::kBlockM, kBN = Sh::kBlockN;
  static constexpr int kStride = Sh::kStride, kPStride = Sh::kPStride;
  // Every member but smem (the dynamic shared memory's base) refers to a
  // variable of the kernel, as a lambda's captures would. key_r0: the warp's
  // first key (the thread's: key_r0 + g, + 8); part: its query-column part.
  unsigned char* smem;
  const BwdArgs& a;
  const SeqLens& lens;
  const ElemStage& est;
  const int& b;
  const int& n0;
  const int& lane;
  const int& g;
  const int& t;
  const int& key_r0;
  const int& part;
  const uint32_t& k_sa;
  const uint32_t& v_sa;
  Elem* const& p_tile;
  Elem* const& ds_tile;
  const float& scale_log2;
  // Features: the thread's keys' segment ids, the dS^T staging tile, 1 / softcap.
  const int (&k_seg)[2];
  float* const& dsf;
  const float& inv_cap;

  // The step loop's arrays (bwd_dkdv_kernel.cuh says why).
  static constexpr int kATiles = Sh::kQCols / kMmaN;
  using Frag = float[kATiles][4];       // S^T or dP^T: kATiles C fragments
  using Packed = uint32_t[kATiles][2];  // P^T: 16-bit pairs (keys g, g + 8)
  // kFeatScores: the soft cap's derivative, packed like P^T.
  using GradPacked = uint32_t[kLevel == kFeatScores ? kATiles : 1][2];

  // Query tile m0 of head, from stage `stage` (Q and dO at q_sa and do_sa,
  // lse * log2(e) and delta at lse2 and dlt). q_lo and q_hi come in as
  // {0, 0} and {kBM, kBM}; p, gr and pv hold one key tile's four elements
  // of P^T and of the soft cap's derivative, and its P^T for dV.
  __device__ __forceinline__ void compute(const int& head, const int& m0, const int& stage,
                                          const uint32_t& q_sa, const uint32_t& do_sa,
                                          const float* const& lse2, const float* const& dlt,
                                          Frag& s, Frag& dp, int (&q_lo)[2], int (&q_hi)[2],
                                          Packed& p_pk, GradPacked& g_pk, float (&p)[4],
                                          float (&gr)[4], uint32_t (&pv)[2]) const {
    const ShapeArgs& sh = a.shape;
    const int qc0 = part * Sh::kQCols;
#pragma unroll
    for (int j = 0; j < kATiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
    // dP^T += V.dO^T over the whole head dim (or, fused, one k-step).
    auto dp_step = [&](int ks) {
      uint32_t va[4];
      load_a(va, v_sa, kStride, key_r0, ks * kMmaK, lane);
#pragma unroll
      for (int np = 0; np < kATiles / 2; ++np) {
        uint32_t ob[4];
        load_b_nk(ob, do_sa, kStride, qc0 + np * 2 * kMmaN, ks * kMmaK, lane);
        mma_16816<kDt>(dp[2 * np], va, ob[0], ob[1]);
        mma_16816<kDt>(dp[2 * np + 1], va, ob[2], ob[3]);
      }
    };
#pragma unroll
    for (int ks = 0; ks < kHeadDim / kMmaK; ++ks) {
      uint32_t ka[4];
      load_a(ka, k_sa, kStride, key_r0, ks * kMmaK, lane);
#pragma unroll
      for (int np = 0; np < kATiles / 2; ++np) {
        uint32_t qb[4];
        load_b_nk(qb, q_sa, kStride, qc0 + np * 2 * kMmaN, ks * kMmaK, lane);
        mma_16816<kDt>(s[2 * np], ka, qb[0], qb[1]);
        mma_16816<kDt>(s[2 * np + 1], ka, qb[2], qb[3]);
      }
      if constexpr (!Sh::kSplitScores) dp_step(ks);
    }
    // With per-element features every tile is masked per element, so
    // the intervals also keep the loads below inside [0, q_len).
    const bool partial =
        kLevel != kFeatPlain ||
        tile_is_partial(a.mask, m0, m0 + kBM - 1, n0, n0 + kBN - 1, lens.kv_len);
    // Each of the thread's two keys is seen by one interval of query rows
    // (tile-local here: q_lo, q_hi), so masking is two compares per score.
    if (partial) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = n0 + key_r0 + g + 8 * h;
        query_range(a.mask, key, key, lens.q_len, &q_lo[h], &q_hi[h]);
        if (key >= lens.kv_len) q_hi[h] = q_lo[h];
        q_lo[h] -= m0;
        q_hi[h] -= m0;
      }
    }
    // This stage's staged bias and mask ([query][key] blocks).
    [[maybe_unused]] const unsigned char* staged = smem + stage * est.bytes;
    // Whether element e of key tile j (key half e / 2, query qc + e % 2) is
    // visible: interval, segment ids, mask.
    auto element_vis = [&](int j, int e) {
      const int q_local = qc0 + j * kMmaN + 2 * t + (e % 2);
      bool v = q_local >= q_lo[e / 2] && q_local < q_hi[e / 2];
      if constexpr (kLevel != kFeatPlain) {
        if (est.mask_off >= 0)
          v = v && staged_mask<kBN>(staged + est.mask_off, q_local, key_r0 + g + 8 * (e / 2));
        if (a.mask.q_segment_ids != nullptr && v)
          v = a.mask.q_segment_ids[int64_t(b) * sh.seqlen_q + m0 + q_local] == k_seg[e / 2];
      }
      return v;
    };
    // kFeatScores: the dropout keep bits (4 per key tile) carried from P^T
    // to dS^T, as g_pk carries the soft cap's derivative.
    [[maybe_unused]] uint32_t keep_bits = 0xffffffffu;
    static_assert(kATiles * 4 <= 32, "keep bits fit one register");
    // dS^T = P^T * (dP^T - delta) for key tile j, from the 16-bit P^T.
    auto store_ds = [&](int j) {
      const int qc = qc0 + j * kMmaN + 2 * t;
      const float d0 = dlt[qc], d1 = dlt[qc + 1];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 p2 = unpack2<kDt>(p_pk[j][h]);
        float ds0, ds1;
        if constexpr (kLevel == kFeatScores) {
          const ScoreArgs& sc = a.scores;
          float dp0 = dp[j][2 * h], dp1 = dp[j][2 * h + 1];
          if (sc.dropout_key != nullptr) {
            const uint32_t keep = keep_bits >> (4 * j + 2 * h);
            dp0 = keep & 1u ? dp0 * sc.dropout_keep_scale : 0.f;
            dp1 = keep & 2u ? dp1 * sc.dropout_keep_scale : 0.f;
          }
          ds0 = p2.x * (dp0 - d0);
          ds1 = p2.y * (dp1 - d1);
          if (a.dbias != nullptr) {
            // Staged for write_dbias (hidden elements: P = 0, dS = 0).
            float* d = dsf + qc * dbias_stride<Sh>() + key_r0 + g + 8 * h;
            d[0] = ds0;
            d[dbias_stride<Sh>()] = ds1;
          }
          if (sc.softcap > 0.f) {
            const float2 gr2 = unpack2<kDt>(g_pk[j][h]);
            ds0 *= gr2.x;
            ds1 *= gr2.y;
          }
        } else {
          ds0 = p2.x * (dp[j][2 * h] - d0);
          ds1 = p2.y * (dp[j][2 * h + 1] - d1);
        }
        *reinterpret_cast<uint32_t*>(ds_tile + (key_r0 + g + 8 * h) * kPStride + qc) =
            pack2<kDt>(ds0, ds1);
      }
    };
#pragma unroll
    for (int j = 0; j < kATiles; ++j) {
      const int qc = qc0 + j * kMmaN + 2 * t;
      if constexpr (kLevel == kFeatScores) {
        const ScoreArgs& sc = a.scores;
        if (sc.dropout_key != nullptr) {
          const uint32_t keep = dropout_bits_keys(sc, b, head, m0 + qc, n0 + key_r0, g);
          keep_bits = (keep_bits & ~(0xfu << (4 * j))) | keep << (4 * j);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q_local = qc + (e % 2);
          const bool vis = element_vis(j, e);
          float x = s[j][e] * a.scale;
          gr[e] = 1.f;
          if (sc.softcap > 0.f) {
            x = soft_cap_fast(x, sc.softcap, inv_cap);
            gr[e] = soft_cap_grad(x, sc.softcap);
          }
          if (est.bias_elem && vis)
            x += staged_bias<kDt, kBN>(staged + est.bias_off, est.bias_elem == 4, q_local,
                                       key_r0 + g + 8 * (e / 2));
          p[e] = vis ? fast_exp2(fmaf(x, kLog2e, -lse2[q_local])) : 0.f;
        }
        p_pk[j][0] = pack2<kDt>(p[0], p[1]);
        p_pk[j][1] = pack2<kDt>(p[2], p[3]);
        g_pk[j][0] = pack2<kDt>(gr[0], gr[1]);
        g_pk[j][1] = pack2<kDt>(gr[2], gr[3]);
        pv[0] = p_pk[j][0];
        pv[1] = p_pk[j][1];
        if (sc.dropout_key != nullptr) {
          // P^T for dV: the dropout mask and 1 / (1 - rate) applied.
          const uint32_t keep = keep_bits >> (4 * j);
          const float ks = sc.dropout_keep_scale;
#pragma unroll
          for (int e = 0; e < 4; ++e) p[e] = (keep >> e) & 1u ? p[e] * ks : 0.f;
          pv[0] = pack2<kDt>(p[0], p[1]);
          pv[1] = pack2<kDt>(p[2], p[3]);
        }
        *reinterpret_cast<uint32_t*>(p_tile + (key_r0 + g) * kPStride + qc) = pv[0];
        *reinterpret_cast<uint32_t*>(p_tile + (key_r0 + g + 8) * kPStride + qc) = pv[1];
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q_local = qc + (e % 2);
          float x = s[j][e] * scale_log2;
          if (!element_vis(j, e)) x = -INFINITY;
          p[e] = fast_exp2(x - lse2[q_local]);
        }
        p_pk[j][0] = pack2<kDt>(p[0], p[1]);
        p_pk[j][1] = pack2<kDt>(p[2], p[3]);
        *reinterpret_cast<uint32_t*>(p_tile + (key_r0 + g) * kPStride + qc) = p_pk[j][0];
        *reinterpret_cast<uint32_t*>(p_tile + (key_r0 + g + 8) * kPStride + qc) = p_pk[j][1];
      }
      if constexpr (!Sh::kSplitScores) store_ds(j);
    }
    if constexpr (Sh::kSplitScores) {
#pragma unroll
      for (int ks = 0; ks < kHeadDim / kMmaK; ++ks) dp_step(ks);
#pragma unroll
      for (int j = 0; j < kATiles; ++j) store_ds(j);
    }
  }
};

}  // namespace attn
}  // namespace jaxcraft
