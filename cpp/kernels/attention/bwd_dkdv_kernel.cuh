// FlashAttention-2 backward, key-tile major: one CTA per (key tile, KV head,
// batch) accumulates dK and dV in registers over every query tile of every
// query head of its GQA group (so no atomics and no per-head dK/dV buffer).
// Per query tile, with P^T = exp(scale * K.Q^T - lse) recomputed:
//   A: S^T = K.Q^T and dP^T = V.dO^T; P^T and dS^T = P^T * (dP^T - delta)
//      go to shared memory as 16-bit tiles.
//   B: dV += P^T.dO, dK += dS^T.Q (scale applied once in the epilogue).
//   C: (fast path) dQ += dS.K, added to fp32 dq_accum with atomics.
// The three phases partition the warps differently, which is why P^T and
// dS^T go through shared memory rather than staying in registers.
// Per-element features (score_tile.cuh: FeatLevel) are separate instances:
// segment ids and the boolean mask hide elements of P^T; with a soft cap,
// bias or dropout, P^T = exp(x - lse) of the logits x = cap(scale * s) +
// bias, P^T goes to phase B with the dropout mask and 1 / (1 - rate) applied,
// dS^T = P^T * (dP^T * keep / (1 - rate) - delta) is added to dbias, and
// phases B and C take dS^T times the soft cap's derivative.
// The parts: DkdvShape (bwd_dkdv_shape.cuh), DkdvStageLoader
// (bwd_dkdv_stage.cuh), init_dkdv_features and write_dbias
// (bwd_dkdv_features.cuh), phase A's DkdvScores (bwd_dkdv_scores.cuh),
// phase B's accumulate_dkdv (bwd_dkdv_products.cuh), phase C's
// accumulate_dq (bwd_dkdv_dq.cuh) and store_dkdv (bwd_dkdv_epilogue.cuh).
// The query-tile loop stays in the kernel, and the parts take the kernel's
// values as reference arguments or hold references to its variables, as
// lambdas capture them (a struct holding copies of the feature state moved
// a load of a kernel argument). A part's own arrays are allocated ahead
// of the kernel's, which renumbered the dK/dV accumulators and changed the
// SASS; so the loop declares the arrays the parts fill, in their order in
// the unsplit kernel, down to phases B and C's ldmatrix operands and
// write_dbias's four-value rows (phase A's ldmatrix operands made no
// difference and stay in DkdvScores).
#pragma once
#include <cuda_runtime.h>

#include "kernels/attention/bwd_dkdv_dq.cuh"
#include "kernels/attention/bwd_dkdv_epilogue.cuh"
#include "kernels/attention/bwd_dkdv_features.cuh"
#include "kernels/attention/bwd_dkdv_products.cuh"
#include "kernels/attention/bwd_dkdv_scores.cuh"
#include "kernels/attention/bwd_dkdv_shape.cuh"
#include "kernels/attention/bwd_dkdv_stage.cuh"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_tile.cuh"
#include "kernels/attention/smem_tile.cuh"
#include "kernels/attention/softmax.cuh"

namespace jaxcraft {
namespace attn {

// The feature instances keep the plain launch bounds: at H32/H64 two CTAs
// per SM with some spilling measured faster than one CTA without (H100,
// packed documents 0.50 vs 0.72 ms; soft cap 2.1 vs 2.8 ms).
template <DType kDt, class Sh, int kLevel = kFeatPlain>
__global__ void __launch_bounds__(Sh::kThreads, Sh::kMinBlocksPerSm)
    attn_bwd_dkdv_kernel(const BwdArgs a) {
  constexpr int kHeadDim = Sh::kHeadDim;
  using Elem = typename ElemOf<kDt>::type;
  using Scores = DkdvScores<kDt, Sh, kLevel>;
  constexpr int kBM = Sh::kBlockM, kBN = Sh::kBlockN, kThreads = Sh::kThreads;

  extern __shared__ __align__(16) unsigned char smem[];
  Elem* k_tile = reinterpret_cast<Elem*>(smem);
  Elem* v_tile = reinterpret_cast<Elem*>(smem + Sh::kKVBytes);
  unsigned char* stage_base = smem + 2 * Sh::kKVBytes;
  Elem* p_tile = reinterpret_cast<Elem*>(stage_base + Sh::kStages * Sh::kStageBytes);
  Elem* ds_tile = reinterpret_cast<Elem*>(stage_base + Sh::kStages * Sh::kStageBytes + Sh::kPBytes);
  const uint32_t k_sa = smem_u32(k_tile), v_sa = smem_u32(v_tile);
  const uint32_t p_sa = smem_u32(p_tile), ds_sa = smem_u32(ds_tile);

  const ShapeArgs& sh = a.shape;
  const int n_block = blockIdx.x, kv_head = blockIdx.y, b = blockIdx.z;
  const int group = sh.num_heads / sh.num_kv_heads;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const SeqLens lens = seq_lens(a.mask, sh, b);
  const int n0 = n_block * kBN;
  const int keys_out = min(kBN, sh.seqlen_k - n0);
  const int keys_valid = min(kBN, lens.kv_len - n0);

  const int64_t q_row_stride = int64_t(sh.num_heads) * sh.head_dim;
  const int64_t kv_row_stride = int64_t(sh.num_kv_heads) * sh.head_dim;
  const int64_t kv_off =
      ((int64_t(b) * sh.seqlen_k + n0) * sh.num_kv_heads + kv_head) * sh.head_dim;

  int q_lo = 0, q_hi = 0;
  if (keys_valid > 0) {
    query_range(a.mask, n0, n0 + keys_valid - 1, lens.q_len, &q_lo, &q_hi);
    // Packed documents: only the query tiles that share a segment with these keys.
    if constexpr (kLevel != kFeatPlain)
      segment_query_range(a.mask, sh, b, n0, n0 + keys_valid - 1, &q_lo, &q_hi);
  }
  const int qt_begin = max(q_lo, 0) / kBM;
  const int q_tiles = q_hi > q_lo ? (q_hi + kBM - 1) / kBM - qt_begin : 0;
  const int total = group * q_tiles;

  auto stage_ptr = [&](int stage) { return stage_base + stage * Sh::kStageBytes; };
  // Iteration `it` covers query head kv_head * group + it / q_tiles.
  auto tile_head = [&](int it) { return kv_head * group + it / q_tiles; };
  auto tile_m0 = [&](int it) { return (qt_begin + it % q_tiles) * kBM; };
  // Features: the bias and mask blocks of each (head, query tile) are staged
  // in shared memory with its Q and dO (score_tile.cuh), one per stage.
  [[maybe_unused]] ElemStage est{};
  if constexpr (kLevel != kFeatPlain)
    est = elem_stage<kBM, kBN>(dkdv_smem_bytes<Sh, kLevel>(), a.mask, a.scores, kLevel);
  const DkdvStageLoader<kDt, Sh, kLevel> stage_loader{smem, stage_base, a,   lens,        est,
                                                      b,    n0,         tid, q_row_stride};
  auto load_q_stage = [&](int it, int stage) {
    stage_loader.load(tile_head(it), tile_m0(it), stage);
  };

  load_tile_async<kBN, kHeadDim, kThreads>(k_sa, static_cast<const Elem*>(a.k) + kv_off,
                                           kv_row_stride, keys_valid, sh.head_dim, a.k, tid);
  load_tile_async<kBN, kHeadDim, kThreads>(v_sa, static_cast<const Elem*>(a.v) + kv_off,
                                           kv_row_stride, keys_valid, sh.head_dim, a.v, tid);
  if (total > 0) load_q_stage(0, 0);
  cp_async_commit();

  // Phase A/B warp coordinates: 16 keys each.
  const int key_r0 = (warp % Sh::kKeySlabs) * kMmaM;
  const int part = warp / Sh::kKeySlabs;
  constexpr int kBTiles = Sh::kHCols / kMmaN;
  float dk[kBTiles][4], dv[kBTiles][4];
#pragma unroll
  for (int j = 0; j < kBTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;
  const float scale_log2 = a.scale * kLog2e;

  // Features (kLevel > 0): segment ids of this thread's two keys (phase A
  // rows), the dS^T staging tile and how dbias is written, 1 / softcap.
  [[maybe_unused]] int k_seg[2] = {0, 0};
  [[maybe_unused]] float* dsf = reinterpret_cast<float*>(smem + Sh::kSmemBytes);
  [[maybe_unused]] bool dbias_atomic = false, dbias_vec = false;
  [[maybe_unused]] float inv_cap = 0.f;
  init_dkdv_features<kLevel>(a, lens, b, n0, key_r0, g, k_seg, dbias_atomic, dbias_vec, inv_cap);

  const Scores scores{smem, a,    lens, est,    b,       n0,         lane,  g,   t,      key_r0,
                      part, k_sa, v_sa, p_tile, ds_tile, scale_log2, k_seg, dsf, inv_cap};

  for (int it = 0; it < total; ++it) {
    int stage = 0;
    if constexpr (Sh::kStages == 2) {
      stage = it % 2;
      if (it + 1 < total) load_q_stage(it + 1, (it + 1) % 2);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      if (it > 0) {
        load_q_stage(it, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
    }
    __syncthreads();
    const int head = tile_head(it), m0 = tile_m0(it);
    unsigned char* st = stage_ptr(stage);
    const uint32_t q_sa = smem_u32(st), do_sa = q_sa + Sh::kQBytes;
    const float* lse2 = reinterpret_cast<const float*>(st + 2 * Sh::kQBytes);
    const float* dlt = lse2 + kBM;

    // Phase A: P^T and dS^T of this warp's 16 keys x kQCols query columns
    // into shared memory.
    typename Scores::Frag s, dp;
    int q_lo[2] = {0, 0}, q_hi[2] = {kBM, kBM};
    typename Scores::Packed p_pk;
    [[maybe_unused]] typename Scores::GradPacked g_pk;
    float p[4], gr[4];
    uint32_t pv[2];
    scores.compute(head, m0, stage, q_sa, do_sa, lse2, dlt, s, dp, q_lo, q_hi, p_pk, g_pk, p, gr,
                   pv);
    __syncthreads();

    // Phase B: dV and dK of this warp's 16 keys x kHCols head columns.
    uint32_t pa[4], dsa[4], ob[4], qb[4];
    accumulate_dkdv<kDt, Sh>(dk, dv, p_sa, ds_sa, q_sa, do_sa, key_r0, part, lane, pa, dsa, ob, qb);

    // kFeatScores: the tile's dS (staged in phase A) into dbias.
    if constexpr (kLevel == kFeatScores) {
      if (a.dbias != nullptr) {
        float w16[4], w32[4];
        write_dbias<kDt, Sh>(a, lens, dsf, dbias_atomic, dbias_vec, b, head, m0, n0, tid, w16,
                             w32);
      }
    }

    // Phase C (fast path): dQ of 16 query rows x kCCols head columns.
    if (a.dq_accum != nullptr) {
      float dq[Sh::kCCols / kMmaN][4];
      uint32_t ds_at[4], kb[4];
      accumulate_dq<kDt, Sh>(a, lens, dq, ds_sa, k_sa, warp, lane, g, t, b, head, m0,
                             q_row_stride, ds_at, kb);
    }
    __syncthreads();  // stage and P/dS tiles are free for the next iteration
  }
  store_dkdv<kDt, Sh>(a, dk, dv, k_tile, v_tile, key_r0, part, lane, tid, kv_off, kv_row_stride,
                      keys_out, keys_valid);
}

template <DType kDt, class Sh, int kLevel = kFeatPlain>
cudaError_t launch_dkdv_shape(const BwdArgs& a, cudaStream_t stream) {
  auto* kernel = attn_bwd_dkdv_kernel<kDt, Sh, kLevel>;
  static_assert(dkdv_smem_max_bytes<Sh, kLevel>() <= 163 * 1024, "fits sm_80 shared memory");
  const int smem_bytes =
      dkdv_smem_bytes<Sh, kLevel>() +
      Sh::kStages * elem_stage<Sh::kBlockM, Sh::kBlockN>(0, a.mask, a.scores, kLevel).bytes;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((a.shape.seqlen_k + Sh::kBlockN - 1) / Sh::kBlockN, a.shape.num_kv_heads,
                  a.shape.batch);
  kernel<<<grid, Sh::kThreads, smem_bytes, stream>>>(a);
  return cudaGetLastError();
}

template <DType kDt, int kHeadDim>
cudaError_t run_bwd_dkdv(const BwdArgs& a, cudaStream_t stream) {
  return dispatch_feat_level(a.mask, a.scores, [&](auto level) {
    constexpr int kLevel = decltype(level)::value;
    return launch_dkdv_shape<kDt, typename DkdvLevelShape<kHeadDim, kLevel>::type, kLevel>(a,
                                                                                          stream);
  });
}

}  // namespace attn
}  // namespace jaxcraft
