// Hopper forward (sm_90a), warp-specialized: one producer warpgroup issues
// TMA copies (Q once, then K and V tiles into a kStages ring guarded by
// full/empty mbarriers); kConsumers consumer warpgroups each own 64 query
// rows and run S = Q K^T (wgmma, both operands in shared memory), the online
// softmax in registers, and O += P V (wgmma, P from registers). Consumers
// never wait on each other, so one warpgroup's softmax runs while another's
// GEMMs occupy the tensor cores. O is staged in the warpgroup's own (dead)
// rows of the Q tile and written by a TMA store, which clips partial tiles.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/sm90/entry.h"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/sm90/tensor_map.h"
#include "kernels/attention/softmax.cuh"

namespace jaxcraft {
namespace attn {
namespace sm90 {

// kOverlap: each warpgroup computes tile i + 1's scores and softmax while
// tile i's P V runs (needs a third ring stage, else the K/V load of tile
// i + 2, which can only start once P V of tile i has released its stage, is
// exposed: measured 513 -> 459 TFLOP/s at H128 with two stages, 614 with three).
template <int kHeadDim_, int kConsumers_, int kBlockN_, int kStages_, bool kOverlap_ = false>
struct FwdConfig {
  static constexpr bool kOverlap = kOverlap_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockM = kConsumers * kWgmmaM;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
  static constexpr int kColBlocks = kHeadDim / kSwizzleCols;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one of K or V
  static constexpr int kStageBytes = 2 * kKVBytes;
  // + alignment slack: the swizzled tiles need 1024-byte-aligned addresses.
  static constexpr int kSmemBytes =
      kSwizzleAtomBytes + kQBytes + kStages * kStageBytes + ring_barrier_bytes(kStages);
  // setmaxnreg: the producer only issues copies; the consumers hold S, O and
  // P fragments. Totals stay within the SM's 64K registers.
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(kHeadDim % kSwizzleCols == 0, "head dim is whole 64-column blocks");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared-memory opt-in");
  static_assert(kProducerRegs * kWarpgroupThreads + kConsumerRegs * kConsumers *
                        kWarpgroupThreads <= 64 * 1024, "register file");
};

// Tiles per head-dim bucket (bf16/f16).
template <int kHeadDim>
struct FwdTiles;
template <>
struct FwdTiles<64> { using type = FwdConfig<64, 3, 128, 2>; };
template <>
struct FwdTiles<128> { using type = FwdConfig<128, 2, 128, 3, true>; };
template <>
struct FwdTiles<256> { using type = FwdConfig<256, 2, 64, 2>; };

struct FwdSm90Args {
  CUtensorMap q_map;  // box kBlockM rows
  CUtensorMap k_map;  // box kBlockN rows
  CUtensorMap v_map;  // box kBlockN rows
  CUtensorMap o_map;  // box 64 rows (one consumer warpgroup)
  FwdArgs a;
};

template <DType kDt, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ FwdSm90Args p) {
#ifdef JAXCRAFT_SM90A_ENABLED
  constexpr int kD = Cfg::kHeadDim, kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  constexpr int kStages = Cfg::kStages, kCB = Cfg::kColBlocks;
  const FwdArgs& a = p.a;
  const ShapeArgs& sh = a.shape;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t q_sa = swizzle_aligned(smem_raw);
  const uint32_t kv_sa = q_sa + Cfg::kQBytes;
  const RingBarriers<kStages> ring{kv_sa + kStages * Cfg::kStageBytes};
  auto k_tile = [&](int s) { return kv_sa + s * Cfg::kStageBytes; };
  auto v_tile = [&](int s) { return kv_sa + s * Cfg::kStageBytes + Cfg::kKVBytes; };

  const int tid = threadIdx.x;
  const int wg = tid / kWarpgroupThreads;
  if (tid == 0) ring.init(1, Cfg::kConsumers * 4);  // empty: one arrival per consumer warp
  __syncthreads();

  // Highest query tiles first: under a causal mask they have the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, b = blockIdx.z;
  const int kv_head = head / (sh.num_heads / sh.num_kv_heads);
  const SeqLens lens = seq_lens(a.mask, sh, b);
  const int m0 = m_block * kBM;
  const int rows_valid = min(kBM, lens.q_len - m0);
  int n_lo = 0, n_hi = 0;
  if (rows_valid > 0) key_range(a.mask, m0, m0 + rows_valid - 1, lens.kv_len, &n_lo, &n_hi);
  const int t_begin = max(n_lo, 0) / kBN;
  const int t_end = n_hi > n_lo ? (n_hi + kBN - 1) / kBN : t_begin;

  if (wg == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid == 0) {
      prefetch_tensor_map(&p.q_map);
      prefetch_tensor_map(&p.k_map);
      prefetch_tensor_map(&p.v_map);
      mbar_arrive_expect_tx(ring.once(), Cfg::kQBytes);
#pragma unroll
      for (int cb = 0; cb < kCB; ++cb)
        tma_load_4d(q_sa + cb * col_block_bytes<kBM>(), &p.q_map, ring.once(), cb * kSwizzleCols, head,
                    m0, b);
      for (int nt = t_begin, it = 0; nt < t_end; ++nt, ++it) {
        const int s = ring.stage(it);
        ring.wait_free(it);
        mbar_arrive_expect_tx(ring.full(s), Cfg::kStageBytes);
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb) {
          tma_load_4d(k_tile(s) + cb * col_block_bytes<kBN>(), &p.k_map, ring.full(s),
                      cb * kSwizzleCols, kv_head, nt * kBN, b);
          tma_load_4d(v_tile(s) + cb * col_block_bytes<kBN>(), &p.v_map, ring.full(s),
                      cb * kSwizzleCols, kv_head, nt * kBN, b);
        }
      }
    }
    return;
  }

  setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int c = wg - 1;  // consumer index: query rows [64 c, 64 c + 64) of the tile
  const int ct = tid % kWarpgroupThreads, lane = tid % kWarpSize, w = ct / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int wg_row0 = c * kWgmmaM;            // first tile row of this warpgroup
  const int thread_row0 = wg_row0 + w * 16 + g;  // this thread's rows: + 0 and + 8

  float o[1][kD / 8][4];
  float row_max[1][2] = {{-INFINITY, -INFINITY}}, row_sum[1][2] = {{0.f, 0.f}};
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][j][e] = 0.f;
  const float scale_log2 = a.scale * kLog2e;
  // As in the portable kernel: the exponent folds the scale in and needs it
  // > 0; a zero or negative scale is applied to the raw scores instead.
  const bool prescale = scale_log2 <= 0.f;
  const float softmax_scale = prescale ? 1.f : scale_log2;

  // S = Q K^T for key tile nt (ring step it) into sc, scaled and masked.
  float sc[1][kBN / 8][4];
  auto issue_scores = [&](int it) {
    const int s = ring.stage(it);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kD / kWgmmaK; ++k) {
      const int cb = k / 4, kb = (k % 4) * kWgmmaK * 2;
      const uint64_t qd = smem_desc(q_sa + cb * col_block_bytes<kBM>() + wg_row0 * kSwizzleRowBytes + kb, 0);
      const uint64_t kd = smem_desc(k_tile(s) + cb * col_block_bytes<kBN>() + kb, 0);
      wgmma_ss<kDt, kBN>(sc[0], qd, kd, k > 0);
    }
    wgmma_commit();
  };
  auto mask_scores = [&](int nt) {  // after the product's wgmma_wait
    fence_operands(sc[0]);
    const int n0 = nt * kBN;
    if (prescale) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[0][j][e] *= scale_log2;
    }
    if (tile_is_partial(a.mask, m0 + wg_row0, m0 + wg_row0 + kWgmmaM - 1, n0, n0 + kBN - 1,
                        lens.kv_len))
      mask_slab(sc[0], a.mask, m0 + thread_row0, n0, t, lens.kv_len);
  };
  // O += P V for ring step it, P (16-bit) from registers.
  uint32_t pa[kBN / 16][4];
  auto issue_pv = [&](int it) {
    const int s = ring.stage(it);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / kWgmmaK; ++kk) {
      const uint64_t vd = smem_desc(v_tile(s) + kk * kWgmmaK * kSwizzleRowBytes, col_block_bytes<kBN>());
      wgmma_rs<kDt, kD>(o[0], pa[kk], vd);
    }
    wgmma_commit();
  };
  auto pack_probs = [&] {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) acc_to_a<kDt>(pa[kk], sc[0][2 * kk], sc[0][2 * kk + 1]);
  };

  auto release = [&](int it) {
    if (lane == 0) mbar_arrive(ring.empty(ring.stage(it)));
  };
  mbar_wait(ring.once(), 0);
  const int n_tiles = t_end - t_begin;
  if constexpr (!Cfg::kOverlap) {
    for (int it = 0; it < n_tiles; ++it) {
      ring.wait_full(it);
      issue_scores(it);
      wgmma_wait<0>();
      mask_scores(t_begin + it);
      float corr[1][2];
      if (online_softmax_step(sc, row_max, row_sum, corr, softmax_scale)) rescale_rows(o, corr);
      pack_probs();
      issue_pv(it);
      wgmma_wait<0>();
      fence_operands(o[0]);
      release(it);
    }
  }
  // Software-pipelined within the warpgroup: tile it's scores are computed
  // while tile it - 1's P V runs, and their softmax (the exponentials) runs
  // under that product too; O is rescaled only once P V has landed.
  if (Cfg::kOverlap && n_tiles > 0) {
    ring.wait_full(0);
    issue_scores(0);
    wgmma_wait<0>();
    mask_scores(t_begin);
    float corr[1][2];
    online_softmax_step(sc, row_max, row_sum, corr, softmax_scale);  // O is still 0
    pack_probs();
  }
  for (int it = 1; Cfg::kOverlap && it < n_tiles; ++it) {
    ring.wait_full(it);
    issue_scores(it);
    issue_pv(it - 1);
    wgmma_wait<1>();
    mask_scores(t_begin + it);
    float corr[1][2];
    const bool rescale = online_softmax_step(sc, row_max, row_sum, corr, softmax_scale);
    wgmma_wait<0>();
    fence_operands(o[0]);
    release(it - 1);
    if (rescale) rescale_rows(o, corr);
    pack_probs();
  }
  if (Cfg::kOverlap && n_tiles > 0) {
    issue_pv(n_tiles - 1);
    wgmma_wait<0>();
    fence_operands(o[0]);
    release(n_tiles - 1);
  }

  // Epilogue: normalize, write the logsumexp, stage O (16-bit, swizzled)
  // over this warpgroup's rows of the Q tile, then one thread stores it.
  const int rows_out = min(kBM, sh.seqlen_q - m0);
  float* lse = a.lse + (int64_t(b) * sh.num_heads + head) * sh.seqlen_q + m0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = thread_row0 + 8 * h;
    const float sum = quad_sum(row_sum[0][h]);
    const bool seen = sum > 0.f && r < rows_valid;
    const float inv = seen ? 1.f / sum : 0.f;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      o[0][j][2 * h] *= inv;
      o[0][j][2 * h + 1] *= inv;
    }
    if (t == 0 && r < rows_out)
      lse[r] = seen ? (row_max[0][h] + __log2f(sum)) * kLn2 : -INFINITY;
  }
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
    const int cb = j / 8, chunk = j % 8;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = thread_row0 + 8 * h;
      const uint32_t v = pack2<kDt>(o[0][j][2 * h], o[0][j][2 * h + 1]);
      st_shared_b32(q_sa + cb * col_block_bytes<kBM>() + swizzled_offset(r, chunk) + 4 * t, v);
    }
  }
  fence_proxy_async();
  named_barrier_sync(1 + c, kWarpgroupThreads);
  if (ct == 0 && wg_row0 < rows_out) {
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_store_4d(&p.o_map, q_sa + cb * col_block_bytes<kBM>() + wg_row0 * kSwizzleRowBytes,
                   cb * kSwizzleCols, head, m0 + wg_row0, b);
    tma_store_commit_and_wait();
  }
#endif  // JAXCRAFT_SM90A_ENABLED
}

template <DType kDt, int kHeadDim>
bool fwd_sm90_available() {
  static const bool yes =
      kernel_runs_sm90a(attn_fwd_sm90_kernel<kDt, typename FwdTiles<kHeadDim>::type>) &&
      encode_tiled_fn() != nullptr;
  return yes;
}

template <DType kDt, class Cfg>
cudaError_t launch_fwd_sm90(const FwdArgs& a, cudaStream_t stream) {
  const ShapeArgs& s = a.shape;
  FwdSm90Args p;
  p.a = a;
  if (!encode_bshd(&p.q_map, a.q, kDt, s.batch, s.seqlen_q, s.num_heads, s.head_dim, Cfg::kBlockM) ||
      !encode_bshd(&p.k_map, a.k, kDt, s.batch, s.seqlen_k, s.num_kv_heads, s.head_dim, Cfg::kBlockN) ||
      !encode_bshd(&p.v_map, a.v, kDt, s.batch, s.seqlen_k, s.num_kv_heads, s.head_dim, Cfg::kBlockN) ||
      !encode_bshd(&p.o_map, a.o, kDt, s.batch, s.seqlen_q, s.num_heads, s.head_dim, kWgmmaM))
    return cudaErrorInvalidValue;
  auto* kernel = attn_fwd_sm90_kernel<kDt, Cfg>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((s.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM, s.num_heads, s.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <DType kDt, int kHeadDim>
cudaError_t run_fwd_sm90(const FwdArgs& a, cudaStream_t stream) {
  return launch_fwd_sm90<kDt, typename FwdTiles<kHeadDim>::type>(a, stream);
}

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
