// FlashAttention-2 forward: one CTA per (query tile, head, batch). Q stays in
// shared memory (or registers); K and V tiles stream through one buffer each,
// with the next K load in flight during softmax and P.V, and the V load in
// flight during Q.K^T. Per-element features (segment ids, boolean mask,
// soft cap, bias, dropout) live in separate instances (score_tile.cuh:
// FeatLevel), so the plain one compiles as if they did not exist. Parts:
// fwd_score_features.cuh (those features on a score tile) and
// fwd_epilogue.cuh (normalize, logsumexp, O store).
#pragma once
#include <cuda_runtime.h>

#include "kernels/attention/fwd_epilogue.cuh"
#include "kernels/attention/fwd_score_features.cuh"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_tile.cuh"
#include "kernels/attention/smem_tile.cuh"
#include "kernels/attention/softmax.cuh"
#include "kernels/attention/tile_config.h"

namespace jaxcraft {
namespace attn {

// Tile sizes default to tile_config.h; the explicit form exists for tuning.
template <int kHeadDim_, int kWarps_ = attn_tiles(kHeadDim_).fwd_warps,
          int kBlockM_ = attn_tiles(kHeadDim_).fwd_block_m,
          int kBlockN_ = attn_tiles(kHeadDim_).fwd_block_n>
struct FwdShape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kMTiles = kBlockM / (kMmaM * kWarps);  // 16-row slabs per warp
  static constexpr int kKeyTiles = kBlockN / kMmaN;
  static constexpr int kHeadTiles = kHeadDim / kMmaN;
  static constexpr int kKSteps = kHeadDim / kMmaK;
  static constexpr int kStride = padded_stride<kHeadDim>();
  static constexpr int kQBytes = tile_bytes<kBlockM, kHeadDim>();
  static constexpr int kKVBytes = tile_bytes<kBlockN, kHeadDim>();
  static constexpr int kSmemBytes = kQBytes + 2 * kKVBytes;
  // Holding Q fragments in registers saves an ldmatrix per k-step; worth it
  // only while they fit next to the accumulators (32 regs per thread).
  static constexpr int kQFragRegsBudget = 32;
  static constexpr bool kQInRegs = kMTiles * kKSteps * 4 <= kQFragRegsBudget;
  static_assert(kBlockM % (kMmaM * kWarps) == 0, "query rows split into 16-row slabs per warp");
  static_assert(kBlockN % (2 * kMmaN) == 0, "key tiles are loaded in pairs");
};

// The feature instances' tile shapes: at H64 (Q fragments in registers)
// and H96 (wide O accumulators) a 64-key score tile leaves no room for the
// per-element state (it spilled); 32-key tiles fit.
template <int kHeadDim, int kLevel>
struct FwdLevelShape {
  using type = std::conditional_t<kLevel != kFeatPlain && (kHeadDim == 64 || kHeadDim == 96),
                                  FwdShape<kHeadDim, 4, 128, 32>, FwdShape<kHeadDim>>;
};

template <DType kDt, class Sh, int kLevel = kFeatPlain>
__global__ void __launch_bounds__(Sh::kThreads) attn_fwd_kernel(const FwdArgs a) {
  constexpr int kHeadDim = Sh::kHeadDim;
  using Elem = typename ElemOf<kDt>::type;
  constexpr int kBM = Sh::kBlockM, kBN = Sh::kBlockN, kMT = Sh::kMTiles;
  constexpr int kStride = Sh::kStride, kThreads = Sh::kThreads;

  extern __shared__ __align__(16) unsigned char smem[];
  Elem* q_tile = reinterpret_cast<Elem*>(smem);
  const uint32_t q_sa = smem_u32(smem);
  const uint32_t k_sa = q_sa + Sh::kQBytes;
  const uint32_t v_sa = k_sa + Sh::kKVBytes;

  const ShapeArgs& sh = a.shape;
  // Highest query tiles first: under a causal mask they have the most keys,
  // and starting them early shortens the tail of the grid.
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
  const Elem* q = static_cast<const Elem*>(a.q) + q_off;
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

  auto load_kv = [&](uint32_t dst, const Elem* base, const void* fallback, int tile) {
    const int n0 = tile * kBN;
    load_tile_async<kBN, kHeadDim, kThreads>(dst, base + n0 * kv_row_stride, kv_row_stride,
                                             lens.kv_len - n0, sh.head_dim, fallback, tid);
  };

  // Features: the bias and mask blocks of a key tile are staged in shared
  // memory behind K and V (score_tile.cuh), one tile ahead of their use.
  [[maybe_unused]] ElemStage est{};
  if constexpr (kLevel != kFeatPlain)
    est = elem_stage<kBM, kBN>(Sh::kSmemBytes, a.mask, a.scores, kLevel);
  [[maybe_unused]] auto stage_tile = [&](int tile) {
    const int c0 = tile * kBN;
    stage_bias_mask<kBM, kBN, kThreads>(smem, est, a.mask, a.scores, sh, b, head, m0, c0,
                                        rows_valid, lens.kv_len - c0, tid);
  };

  load_tile_async<kBM, kHeadDim, kThreads>(q_sa, q, q_row_stride, rows_valid, sh.head_dim, a.q,
                                           tid);
  if (t_begin < t_end) load_kv(k_sa, k, a.k, t_begin);
  if constexpr (kLevel != kFeatPlain)
    if (est.bytes && t_begin < t_end) stage_tile(t_begin);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int warp_row0 = warp * kMT * kMmaM;
  uint32_t q_frag[Sh::kQInRegs ? kMT : 1][Sh::kQInRegs ? Sh::kKSteps : 1][4];
  if constexpr (Sh::kQInRegs) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int ks = 0; ks < Sh::kKSteps; ++ks)
        load_a(q_frag[mt][ks], q_sa, kStride, warp_row0 + mt * kMmaM, ks * kMmaK, lane);
  }

  float acc[kMT][Sh::kHeadTiles][4];
  float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int j = 0; j < Sh::kHeadTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  const float scale_log2 = a.scale * kLog2e;
  // The softmax folds the scale into its exponent and needs it > 0 (a masked
  // -inf times 0 would be NaN); a zero or negative scale (legal, never seen
  // in practice) is applied to the raw scores before masking instead.
  const bool prescale = scale_log2 <= 0.f;
  const float softmax_scale = prescale ? 1.f : scale_log2;

  // Feature instances: this thread's row segment ids and 1 / softcap, which
  // FwdScoreFeatures fills and reads (it holds references, as the loop's own parts do).
  [[maybe_unused]] int q_seg[kMT][2];
  [[maybe_unused]] float inv_cap = 0.f;
  [[maybe_unused]] const FwdScoreFeatures<kDt, Sh, kLevel> features{
      a, lens, est, smem, b, head, m0, warp_row0, g, t, prescale, scale_log2, q_seg, inv_cap};
  if constexpr (kLevel != kFeatPlain) features.load_rows();

  for (int nt = t_begin; nt < t_end; ++nt) {
    const int n0 = nt * kBN;
    __syncthreads();  // every warp is done reading V of the previous tile
    load_kv(v_sa, v, a.v, nt);
    cp_async_commit();
    cp_async_wait<1>();  // K of this tile has landed
    __syncthreads();

    float s[kMT][Sh::kKeyTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int j = 0; j < Sh::kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < Sh::kKSteps; ++ks) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (Sh::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mt][e] = q_frag[mt][ks][e];
        } else {
          load_a(qa[mt], q_sa, kStride, warp_row0 + mt * kMmaM, ks * kMmaK, lane);
        }
      }
#pragma unroll
      for (int np = 0; np < Sh::kKeyTiles / 2; ++np) {
        uint32_t kb[4];
        load_b_nk(kb, k_sa, kStride, np * 2 * kMmaN, ks * kMmaK, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<kDt>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_16816<kDt>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done reading K: prefetch the next one
    if (nt + 1 < t_end) load_kv(k_sa, k, a.k, nt + 1);
    cp_async_commit();

    if constexpr (kLevel == kFeatPlain) {
      const bool partial =
          tile_is_partial(a.mask, m0, m0 + kBM - 1, n0, n0 + kBN - 1, lens.kv_len);
      if (prescale) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int j = 0; j < Sh::kKeyTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][j][e] *= scale_log2;
      }
      if (partial) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          mask_slab(s[mt], a.mask, m0 + warp_row0 + mt * kMmaM + g, n0, t, lens.kv_len);
      }
    } else {
      features.apply(s, n0);
    }
    online_softmax(s, acc, row_max, row_sum,
                   kLevel == kFeatScores ? kLog2e : softmax_scale);
    if constexpr (kLevel == kFeatScores) features.drop(s, n0);
    // P goes to 16-bit A fragments right away: half the registers of the
    // fp32 scores, which is what lets two 16-row slabs per warp fit.
    uint32_t pa[kMT][Sh::kKeyTiles / 2][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int kk = 0; kk < Sh::kKeyTiles / 2; ++kk)
        acc_to_a<kDt>(pa[mt][kk], s[mt][2 * kk], s[mt][2 * kk + 1]);

    cp_async_wait<1>();  // V of this tile has landed
    __syncthreads();
    if constexpr (kLevel != kFeatPlain) {
      // Every warp is done with this tile's bias and mask: stage the next's.
      if (est.bytes && nt + 1 < t_end) stage_tile(nt + 1);
      cp_async_commit();
    }
#pragma unroll
    for (int kk = 0; kk < Sh::kKeyTiles / 2; ++kk) {
#pragma unroll
      for (int hp = 0; hp < Sh::kHeadTiles / 2; ++hp) {
        uint32_t vb[4];
        load_b_kn(vb, v_sa, kStride, hp * 2 * kMmaN, kk * kMmaK, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<kDt>(acc[mt][2 * hp], pa[mt][kk], vb[0], vb[1]);
          mma_16816<kDt>(acc[mt][2 * hp + 1], pa[mt][kk], vb[2], vb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  const FwdTileRows rows{a, head, b, m0, rows_out, rows_valid, tid, lane, g, t, warp_row0};
  fwd_epilogue<kDt, Sh, kLevel>(rows, q_tile, q_off, q_row_stride, acc, row_max, row_sum);
}

template <DType kDt, class Sh, int kLevel = kFeatPlain>
cudaError_t launch_fwd_shape(const FwdArgs& a, cudaStream_t stream) {
  auto* kernel = attn_fwd_kernel<kDt, Sh, kLevel>;
  static_assert(Sh::kSmemBytes + elem_stage_max_bytes<Sh::kBlockM, Sh::kBlockN>(kLevel) <=
                    163 * 1024,
                "fits sm_80 shared memory");
  const int smem_bytes =
      Sh::kSmemBytes +
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
cudaError_t run_fwd(const FwdArgs& a, cudaStream_t stream) {
  return dispatch_feat_level(a.mask, a.scores, [&](auto level) {
    constexpr int kLevel = decltype(level)::value;
    return launch_fwd_shape<kDt, typename FwdLevelShape<kHeadDim, kLevel>::type, kLevel>(a, stream);
  });
}

}  // namespace attn
}  // namespace jaxcraft
