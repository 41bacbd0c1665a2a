// Deterministic dQ: one CTA per (query tile, head, batch) walks the visible
// key tiles in a fixed order, recomputing P = exp(scale * Q.K^T - lse) and
// dS = P * (dO.V^T - delta) in registers, and accumulates dQ = scale * dS.K
// without atomics. K/V tiles are double-buffered when shared memory allows.
// Per-element features (score_tile.cuh: FeatLevel) are separate instances
// that recompute the forward's P (segment ids, mask, soft cap, bias) and the
// dK/dV kernel's dS (dropout, soft cap derivative); dbias is left to that
// kernel.
#pragma once
#include <cuda_runtime.h>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_tile.cuh"
#include "kernels/attention/smem_tile.cuh"
#include "kernels/attention/softmax.cuh"
#include "kernels/attention/tile_config.h"

namespace jaxcraft {
namespace attn {

template <int kHeadDim>
struct DqShape {
  static constexpr AttnTiles kTiles = attn_tiles(kHeadDim);
  static constexpr int kWarps = kTiles.dq_warps;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockM = kTiles.dq_block_m;
  static constexpr int kBlockN = kTiles.dq_block_n;
  static constexpr int kStages = kTiles.dq_kv_stages;
  static constexpr int kKeyTiles = kBlockN / kMmaN;
  static constexpr int kHeadTiles = kHeadDim / kMmaN;
  static constexpr int kStride = padded_stride<kHeadDim>();
  static constexpr int kQBytes = tile_bytes<kBlockM, kHeadDim>();
  static constexpr int kKVBytes = tile_bytes<kBlockN, kHeadDim>();
  static constexpr int kSmemBytes = 2 * kQBytes + kStages * 2 * kKVBytes;
  static_assert(kBlockM == kMmaM * kWarps, "one 16-row slab per warp");
  static_assert(kStages == 1 || kStages == 2, "K/V single or double buffered");
};

template <DType kDt, int kHeadDim, int kLevel = kFeatPlain>
__global__ void __launch_bounds__(DqShape<kHeadDim>::kThreads) attn_bwd_dq_kernel(const BwdArgs a) {
  using Sh = DqShape<kHeadDim>;
  using Elem = typename ElemOf<kDt>::type;
  constexpr int kBM = Sh::kBlockM, kBN = Sh::kBlockN, kThreads = Sh::kThreads;
  constexpr int kStride = Sh::kStride;

  extern __shared__ __align__(16) unsigned char smem[];
  Elem* q_tile = reinterpret_cast<Elem*>(smem);
  const uint32_t q_sa = smem_u32(smem), do_sa = q_sa + Sh::kQBytes;
  const uint32_t kv_sa = do_sa + Sh::kQBytes;  // stage s: K at +2s, V at +2s+1 tiles

  const ShapeArgs& sh = a.shape;
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, b = blockIdx.z;
  const int kv_head = head / (sh.num_heads / sh.num_kv_heads);
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const SeqLens lens = seq_lens(a.mask, sh, b);
  const int m0 = m_block * kBM;

  const int64_t q_row_stride = int64_t(sh.num_heads) * sh.head_dim;
  const int64_t kv_row_stride = int64_t(sh.num_kv_heads) * sh.head_dim;
  const int64_t q_off = ((int64_t(b) * sh.seqlen_q + m0) * sh.num_heads + head) * sh.head_dim;
  const int64_t kv_off = (int64_t(b) * sh.seqlen_k * sh.num_kv_heads + kv_head) * sh.head_dim;
  const Elem* k = static_cast<const Elem*>(a.k) + kv_off;
  const Elem* v = static_cast<const Elem*>(a.v) + kv_off;
  const int rows_out = min(kBM, sh.seqlen_q - m0);
  const int rows_valid = min(kBM, lens.q_len - m0);

  int n_lo = 0, n_hi = 0;
  if (rows_valid > 0) {
    key_range(a.mask, m0, m0 + rows_valid - 1, lens.kv_len, &n_lo, &n_hi);
    // Packed documents: only the key tiles that share a segment with these rows.
    if constexpr (kLevel != kFeatPlain)
      segment_key_range(a.mask, sh, b, m0, m0 + rows_valid - 1, &n_lo, &n_hi);
  }
  const int t_begin = max(n_lo, 0) / kBN;
  const int t_end = n_hi > n_lo ? (n_hi + kBN - 1) / kBN : t_begin;

  // Features: the bias and mask blocks of each key tile are staged in shared
  // memory with its K and V (score_tile.cuh), one buffer per K/V stage.
  [[maybe_unused]] ElemStage est{};
  if constexpr (kLevel != kFeatPlain)
    est = elem_stage<kBM, kBN>(Sh::kSmemBytes, a.mask, a.scores, kLevel);

  auto load_kv = [&](int tile, int stage) {
    const int n0 = tile * kBN;
    const uint32_t dst = kv_sa + stage * 2 * Sh::kKVBytes;
    if constexpr (kLevel != kFeatPlain)
      if (est.bytes)
        stage_bias_mask<kBM, kBN, kThreads>(smem + stage * est.bytes, est, a.mask, a.scores, sh,
                                            b, head, m0, n0, rows_valid, lens.kv_len - n0, tid);
    load_tile_async<kBN, kHeadDim, kThreads>(dst, k + n0 * kv_row_stride, kv_row_stride,
                                             lens.kv_len - n0, sh.head_dim, a.k, tid);
    load_tile_async<kBN, kHeadDim, kThreads>(dst + Sh::kKVBytes, v + n0 * kv_row_stride,
                                             kv_row_stride, lens.kv_len - n0, sh.head_dim, a.v,
                                             tid);
  };

  load_tile_async<kBM, kHeadDim, kThreads>(q_sa, static_cast<const Elem*>(a.q) + q_off,
                                           q_row_stride, rows_valid, sh.head_dim, a.q, tid);
  load_tile_async<kBM, kHeadDim, kThreads>(do_sa, static_cast<const Elem*>(a.d_o) + q_off,
                                           q_row_stride, rows_valid, sh.head_dim, a.d_o, tid);
  if (t_begin < t_end) load_kv(t_begin, 0);
  cp_async_commit();

  // Per-row statistics of this lane's two fragment rows (g and g + 8).
  const int warp_row0 = warp * kMmaM;
  float lse2[2], dlt[2];
  const int64_t row_off = (int64_t(b) * sh.num_heads + head) * sh.seqlen_q + m0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp_row0 + g + 8 * h;
    const bool ok = r < rows_valid;
    const float l = ok ? a.lse[row_off + r] : -INFINITY;
    lse2[h] = l == -INFINITY ? INFINITY : l * kLog2e;  // P = 0 for rows that saw no key
    dlt[h] = ok ? a.delta[row_off + r] : 0.f;
  }

  float dq[Sh::kHeadTiles][4];
#pragma unroll
  for (int j = 0; j < Sh::kHeadTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[j][e] = 0.f;
  const float scale_log2 = a.scale * kLog2e;

  // Features (kLevel > 0): the segment id of each row (h) (rows past q_len
  // see no key and read nothing), 1 / softcap.
  [[maybe_unused]] int q_seg[2] = {0, 0};
  [[maybe_unused]] float inv_cap = 0.f;
  if constexpr (kLevel != kFeatPlain) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = m0 + warp_row0 + g + 8 * h;
      if (a.mask.q_segment_ids != nullptr && i < lens.q_len)
        q_seg[h] = a.mask.q_segment_ids[int64_t(b) * sh.seqlen_q + i];
    }
  }
  if constexpr (kLevel == kFeatScores) {
    inv_cap = a.scores.softcap > 0.f ? 1.f / a.scores.softcap : 0.f;
  }

  for (int nt = t_begin; nt < t_end; ++nt) {
    const int n0 = nt * kBN;
    int stage = 0;
    if constexpr (Sh::kStages == 2) {
      stage = (nt - t_begin) % 2;
      if (nt + 1 < t_end) load_kv(nt + 1, 1 - stage);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      if (nt > t_begin) {
        load_kv(nt, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint32_t k_sa = kv_sa + stage * 2 * Sh::kKVBytes, v_sa = k_sa + Sh::kKVBytes;

    float s[Sh::kKeyTiles][4], dp[Sh::kKeyTiles][4];
#pragma unroll
    for (int j = 0; j < Sh::kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / kMmaK; ++ks) {
      uint32_t qa[4], oa[4];
      load_a(qa, q_sa, kStride, warp_row0, ks * kMmaK, lane);
      load_a(oa, do_sa, kStride, warp_row0, ks * kMmaK, lane);
#pragma unroll
      for (int np = 0; np < Sh::kKeyTiles / 2; ++np) {
        uint32_t kb[4], vb[4];
        load_b_nk(kb, k_sa, kStride, np * 2 * kMmaN, ks * kMmaK, lane);
        load_b_nk(vb, v_sa, kStride, np * 2 * kMmaN, ks * kMmaK, lane);
        mma_16816<kDt>(s[2 * np], qa, kb[0], kb[1]);
        mma_16816<kDt>(s[2 * np + 1], qa, kb[2], kb[3]);
        mma_16816<kDt>(dp[2 * np], oa, vb[0], vb[1]);
        mma_16816<kDt>(dp[2 * np + 1], oa, vb[2], vb[3]);
      }
    }

    if constexpr (kLevel == kFeatPlain) {
      const bool partial =
          tile_is_partial(a.mask, m0, m0 + kBM - 1, n0, n0 + kBN - 1, lens.kv_len);
#pragma unroll
      for (int j = 0; j < Sh::kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          float x = s[j][e] * scale_log2;
          if (partial && !key_visible(a.mask, m0 + warp_row0 + g + 8 * h,
                                      n0 + j * kMmaN + 2 * t + (e % 2), lens.kv_len))
            x = -INFINITY;
          const float p = fast_exp2(x - lse2[h]);
          s[j][e] = p * (dp[j][e] - dlt[h]);  // s now holds dS
        }
    } else {
      // Every tile is masked per element: the interval masks, rows past
      // q_len, segment ids and the boolean mask; at kFeatScores the logits
      // x = cap(scale * s) + bias, dropout on dP and the soft cap's
      // derivative on dS.
      const MaskArgs& mk = a.mask;
      const ScoreArgs& sc = a.scores;
      const unsigned char* staged = smem + stage * est.bytes;
#pragma unroll
      for (int j = 0; j < Sh::kKeyTiles; ++j) {
        const int cl = j * kMmaN + 2 * t, c0 = n0 + cl;
        int kv_seg[2] = {0, 0};
        if (mk.q_segment_ids != nullptr) {
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (c0 + e < lens.kv_len) kv_seg[e] = mk.kv_segment_ids[int64_t(b) * sh.seqlen_k + c0 + e];
        }
        [[maybe_unused]] uint32_t keep = 0xfu;
        if constexpr (kLevel == kFeatScores)
          if (sc.dropout_key != nullptr) {
            const int r0 = m0 + warp_row0 + g;
            keep = dropout_bits_rows(sc, b, head, r0, r0 + 8, c0, t);
          }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int rl = warp_row0 + g + 8 * h, i = m0 + rl;
          const uint32_t mbits =
              est.mask_off >= 0 ? staged_mask_pair<kBN>(staged + est.mask_off, rl, cl) : 3u;
          bool vis[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            bool v = i < lens.q_len && key_visible(mk, i, c0 + e, lens.kv_len) &&
                     ((mbits >> e) & 1u);
            if (mk.q_segment_ids != nullptr) v = v && kv_seg[e] == q_seg[h];
            vis[e] = v;
          }
          if constexpr (kLevel == kFeatMasks) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float x = s[j][2 * h + e] * scale_log2;
              if (!vis[e]) x = -INFINITY;
              const float p = fast_exp2(x - lse2[h]);
              s[j][2 * h + e] = p * (dp[j][2 * h + e] - dlt[h]);
            }
          } else {
            float2 bv = make_float2(0.f, 0.f);
            if (est.bias_elem)
              bv = staged_bias_pair<kDt, kBN>(staged + est.bias_off, est.bias_elem == 4, rl, cl);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float x = s[j][2 * h + e] * a.scale;
              float grad = 1.f;
              if (sc.softcap > 0.f) {
                x = soft_cap_fast(x, sc.softcap, inv_cap);
                grad = soft_cap_grad(x, sc.softcap);
              }
              x += e ? bv.y : bv.x;
              const float p = vis[e] ? fast_exp2(fmaf(x, kLog2e, -lse2[h])) : 0.f;
              float dpv = dp[j][2 * h + e];
              if (sc.dropout_key != nullptr)
                dpv = (keep >> (2 * h + e)) & 1u ? dpv * sc.dropout_keep_scale : 0.f;
              s[j][2 * h + e] = p * (dpv - dlt[h]) * grad;
            }
          }
        }
      }
    }

#pragma unroll
    for (int kk = 0; kk < Sh::kKeyTiles / 2; ++kk) {
      uint32_t dsa[4];
      acc_to_a<kDt>(dsa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int hp = 0; hp < Sh::kHeadTiles / 2; ++hp) {
        uint32_t kb[4];
        load_b_kn(kb, k_sa, kStride, hp * 2 * kMmaN, kk * kMmaK, lane);
        mma_16816<kDt>(dq[2 * hp], dsa, kb[0], kb[1]);
        mma_16816<kDt>(dq[2 * hp + 1], dsa, kb[2], kb[3]);
      }
    }
    __syncthreads();  // this stage is refilled two tiles from now
  }
  cp_async_wait<0>();
  __syncthreads();

  store_acc_slab<kDt>(q_tile, kStride, warp_row0, 0, dq, a.scale, lane);
  __syncthreads();
  store_tile<kBM, kHeadDim, kThreads>(static_cast<Elem*>(a.dq) + q_off, q_row_stride, q_tile,
                                      rows_out, rows_valid, sh.head_dim, tid);
}

template <DType kDt, int kHeadDim, int kLevel>
cudaError_t launch_dq_level(const BwdArgs& a, cudaStream_t stream) {
  using Sh = DqShape<kHeadDim>;
  auto* kernel = attn_bwd_dq_kernel<kDt, kHeadDim, kLevel>;
  static_assert(Sh::kSmemBytes +
                        Sh::kStages * elem_stage_max_bytes<Sh::kBlockM, Sh::kBlockN>(kLevel) <=
                    163 * 1024,
                "fits sm_80 shared memory");
  const int smem_bytes =
      Sh::kSmemBytes +
      Sh::kStages *
          elem_stage<Sh::kBlockM, Sh::kBlockN>(Sh::kSmemBytes, a.mask, a.scores, kLevel).bytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.shape.seqlen_q + Sh::kBlockM - 1) / Sh::kBlockM, a.shape.num_heads,
                  a.shape.batch);
  kernel<<<grid, Sh::kThreads, smem_bytes, stream>>>(a);
  return cudaGetLastError();
}

template <DType kDt, int kHeadDim>
cudaError_t run_bwd_dq(const BwdArgs& a, cudaStream_t stream) {
  return dispatch_feat_level(a.mask, a.scores, [&](auto level) {
    return launch_dq_level<kDt, kHeadDim, decltype(level)::value>(a, stream);
  });
}

}  // namespace attn
}  // namespace jaxcraft
