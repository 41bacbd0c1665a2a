// Hopper backward (sm_90a), dK/dV with atomic dQ. One CTA per 128-key tile
// of one KV head: K and V stay in shared memory, the two consumer warpgroups
// own 64 keys each and keep their dK and dV in registers while the producer
// warp streams (query head of the group, 64-query tile) steps through a ring
// of Q, dO, logsumexp and delta (head dim 256: see kSplitD). Per step and
// warpgroup (wgmma throughout):
//   S^T = K Q^T, dP^T = V dO^T            (both operands in shared memory)
//   P^T = exp2(S^T * scale log2 e - lse log2 e), masked
//   dV += P^T dO, dS^T = P^T (dP^T - delta), dK += dS^T Q   (P, dS from registers;
//                                                            kSplitD: shared memory)
//   dQ += dS K  (dS^T staged in shared memory; fp32 into dq_accum by TMA
//                bulk reduce-add, kDqTma, or red.add; kDqWarp: the
//                reductions issued by warp 1 of the producer warpgroup)
// The deterministic path stays on the portable kernels. Segment ids, the
// boolean mask, soft cap, bias and dropout run in separate instances of the
// same kernel (kFeat, features.cuh); with soft cap or dropout, or a bias
// TMA cannot load (kScores, kDropout) a step waits for both S^T and dP^T
// and forms P^T and dS^T in one pass, which needs no registers for the
// soft-cap gradient or the keep mask between the two. kBias (bias tiles by
// TMA, no soft cap) keeps the plain overlap: P^T while dP^T runs.
// The parts: BwdConfig (bwd_config.cuh), BwdSm90Args (bwd_args.h), BwdSmem
// (bwd_smem.cuh), BwdWork (bwd_scheduler.cuh), BwdProducer
// (bwd_producer.cuh), the consumers' BwdConsumerThread and BwdStep
// (bwd_consumer_thread.cuh), BwdScoreFeatures (bwd_score_features.cuh),
// BwdQueryTile (bwd_query_tile.cuh), BwdDq (bwd_dq.cuh) and bwd_epilogue
// (bwd_epilogue.cuh). The consumers' step loop stays in the kernel, and the
// parts take the kernel's values as reference arguments or hold references
// to its variables and the loop's, as lambdas capture them. nvcc simplifies
// each part on its own before inlining it, and where it rematerializes
// addresses and how it numbers registers follow the order in which the
// inlined code defines values and arrays; so the step loop keeps the
// definitions that the parts share where they stand in the step: the dS^T
// buffer address before form_ds (after it, 4250 lines of the head-dim-128
// bias instance's PTX differed), the address of the other dS^T buffer, and
// the arrays the parts fill (the partial pass's query ranges, the dQ
// accumulator: a part's own arrays are allocated ahead of the kernel's,
// which renumbered the dK/dV accumulators).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/sm90/bwd_args.h"
#include "kernels/attention/sm90/bwd_config.cuh"
#include "kernels/attention/sm90/bwd_consumer_thread.cuh"
#include "kernels/attention/sm90/bwd_dq.cuh"
#include "kernels/attention/sm90/bwd_epilogue.cuh"
#include "kernels/attention/sm90/bwd_producer.cuh"
#include "kernels/attention/sm90/bwd_query_tile.cuh"
#include "kernels/attention/sm90/bwd_scheduler.cuh"
#include "kernels/attention/sm90/bwd_score_features.cuh"
#include "kernels/attention/sm90/bwd_smem.cuh"
#include "kernels/attention/sm90/entry.h"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/sm90/tensor_map.h"
#include "kernels/attention/sm90/tile_order.h"
#include "kernels/attention/sm90/tiles.h"
#include "kernels/attention/softmax.cuh"

namespace jaxcraft {
namespace attn {
namespace sm90 {

// kFeat (features.cuh): kPlain, or the instances that add segment ids and
// the boolean mask (kMasks), also soft cap and bias (kScores, kBias), and
// also dropout (kDropout), each a run-time branch inside them. The plain
// instance compiles none of that.
template <DType kDt, class Cfg, int kFeat = kPlain>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attn_bwd_sm90_kernel(const __grid_constant__ BwdSm90Args p) {
#ifdef JAXCRAFT_SM90A_ENABLED
  constexpr int kD = Cfg::kHeadDim, kBM = Cfg::kBlockM, kSN = Cfg::kSN, kAcc = Cfg::kAccCols;
  static_assert(kFeat == kPlain || kBM == 64, "the feature instances' bitmasks hold 64 queries");
  using Features = BwdScoreFeatures<kDt, Cfg, kFeat>;
  using Tile = BwdQueryTile<kDt, Cfg, kFeat>;
  using Dq = BwdDq<kDt, Cfg, kFeat>;
  const BwdArgs& a = p.a;

  extern __shared__ unsigned char smem_raw[];
  const BwdSmem<Cfg, kFeat> sm(smem_raw, a.scores.bias_f32);
  const int tid = threadIdx.x;
  // wg broadcast from lane 0 so that ptxas knows it is warp-uniform, as in
  // the forward (SASS, head dim 128 plain: 3525 -> 3397 instructions); not
  // at head dim 64, whose plain instance then ran short of registers (the
  // wgmmas serialized, C7512, and its spills grew from 28 to 60 bytes).
  const int wg = kD == 64 ? tid / kWarpgroupThreads
                          : __shfl_sync(0xffffffffu, tid / kWarpgroupThreads, 0);
  const int lane = tid % kWarpSize;
  sm.init(tid);
  __syncthreads();

  const BwdWork wk = bwd_work<Cfg, kFeat>(p);
  if (BwdProducer<Cfg, kFeat>::run(p, sm, wk, wg, tid, lane)) return;

  setmaxnreg_inc<Cfg::consumer_regs(kFeat)>();
  const BwdConsumerThread<Cfg, kFeat> th(tid, wg, lane);
  const float scale_log2 = a.scale * kLog2e;

  float dk[kAcc / 8][4], dv[kAcc / 8][4];
#pragma unroll
  for (int j = 0; j < kAcc / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;

  [[maybe_unused]] int kid[2] = {0, 0};
  [[maybe_unused]] int key_id_lo = 0, key_id_hi = 0;
  Features::load_key_ids(p, th, wk, kid, key_id_lo, key_id_hi);
  [[maybe_unused]] uint32_t bias_off[2][2] = {};
  Features::bias_offsets(p, th, bias_off);
  [[maybe_unused]] const bool dbias_storer = kFeat == kBias && p.dbias_tma && th.ct == 0;
  const Features features{p, sm, th, wk, kid, key_id_lo, key_id_hi, bias_off, dbias_storer};
  const Dq dq{p, sm, th, wk};

  mbar_wait(sm.ring.once(), 0);
  int it = 0;
  for (int h = wk.kv_head * wk.group; h < (wk.kv_head + 1) * wk.group; ++h) {
    for (int mt = wk.mt_begin; mt < wk.mt_end; ++mt, ++it) {
      const BwdStep step{it, sm.ring.stage(it), h, mt, mt * kBM};
      sm.ring.wait_full(it);

      float st[kSN / 8][4], dpt[kSN / 8][4];
      [[maybe_unused]] uint32_t pa[kSN / 16][4], dsa[kSN / 16][4];
      Tile tile{p, sm, th, wk, features, scale_log2, dk, dv, st, dpt, pa, dsa};
      tile.issue_products(step.s);
      dq.release_last_stage(it);
      tile.wait_products();
      int q_lo[2], q_hi[2];  // these arrays and addresses here: the top of this file says why
      tile.form_probs(step, q_lo, q_hi);
      const uint32_t ds_buf = sm.ds_buf(it);
      tile.form_ds(step);
      if constexpr (Cfg::kSplitD) {
        tile.issue_split_d_products(step, ds_buf);
      } else {
        tile.issue_dk(step.s);
        tile.store_ds(step, ds_buf);
      }
      typename Dq::Frag dq_acc;
      const uint32_t ds_prev = ds_buf + ((it & 1) ? -Cfg::kDsBytes : Cfg::kDsBytes);
      tile.finish(step, dq, ds_buf, ds_prev, dq_acc);
      if constexpr (Cfg::dq_warp(kFeat))
        named_barrier_arrive(Cfg::kDqFullBarrier + th.c, Cfg::kDqBarrierThreads);
    }
  }

  if constexpr (Cfg::kDqByRows) {  // the last step's dQ
    if (it > 0)
      dq.late(it - 1, sm.ds_buf(it - 1), (wk.kv_head + 1) * wk.group - 1, (wk.mt_end - 1) * kBM);
  }
  bwd_epilogue<kDt>(p, sm, th, wk, features, dk, dv);
#endif  // JAXCRAFT_SM90A_ENABLED
}

template <DType kDt, int kHeadDim>
bool bwd_sm90_available() {
  static const bool yes =
      kernel_runs_sm90a(attn_bwd_sm90_kernel<kDt, typename BwdTiles<kHeadDim>::type>) &&
      encode_tiled_fn() != nullptr;
  return yes;
}

template <DType kDt, class Cfg, int kFeat = kPlain>
cudaError_t launch_bwd_sm90(const BwdArgs& a, cudaStream_t stream,
                            const CUtensorMap* bias_map = nullptr) {
  const ShapeArgs& s = a.shape;
  BwdSm90Args p;
  p.a = a;
  if (!encode_bshd(&p.q_map, a.q, kDt, s.batch, s.seqlen_q, s.num_heads, s.head_dim, Cfg::kBlockM) ||
      !encode_bshd(&p.do_map, a.d_o, kDt, s.batch, s.seqlen_q, s.num_heads, s.head_dim, Cfg::kBlockM) ||
      !encode_bshd(&p.k_map, a.k, kDt, s.batch, s.seqlen_k, s.num_kv_heads, s.head_dim, Cfg::kBlockN) ||
      !encode_bshd(&p.v_map, a.v, kDt, s.batch, s.seqlen_k, s.num_kv_heads, s.head_dim, Cfg::kBlockN) ||
      !encode_bshd(&p.dk_map, a.dk, kDt, s.batch, s.seqlen_k, s.num_kv_heads, s.head_dim, kWgmmaM) ||
      !encode_bshd(&p.dv_map, a.dv, kDt, s.batch, s.seqlen_k, s.num_kv_heads, s.head_dim, kWgmmaM))
    return cudaErrorInvalidValue;
  if (Cfg::kDqTma && !encode_bshd_f32(&p.dq_map, a.dq_accum, s.batch, s.seqlen_q, s.num_heads,
                                      s.head_dim, Cfg::kDqRows))
    return cudaErrorInvalidValue;
  auto* kernel = attn_bwd_sm90_kernel<kDt, Cfg, kFeat>;
  const int smem = kFeat == kBias ? Cfg::bias_smem_bytes(a.scores.bias_f32) : Cfg::kSmemBytes;
  p.dbias_tma = 0;
  if (kFeat == kBias) {
    if (bias_map == nullptr || smem > 227 * 1024) return cudaErrorInvalidValue;
    p.bias_map = *bias_map;
    // dS leaves through the bias tiles when dbias has the bias's layout and
    // dtype and one writer per element.
    if (a.dbias != nullptr && !dbias_needs_atomics(a.scores, s) &&
        (a.dbias_f32 != 0) == (a.scores.bias_f32 != 0)) {
      ScoreArgs d = a.scores;
      d.bias = a.dbias;
      p.dbias_tma = encode_bias_map(&p.dbias_map, d, s, kDt, Cfg::kBlockM);
    }
  }
  cudaError_t err = p.dbias_tma ? cudaSuccess : zero_dbias(a, stream);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid((s.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN, s.num_kv_heads, s.batch);
  // Each KV head's tiles stream Q and dO of the query heads of its group.
  if (int64_t(grid.x) * grid.y * grid.z > INT32_MAX) return cudaErrorInvalidValue;
  // Causal groups of at most 16 heads, and of 4 where a head has at most 4
  // key tiles, where the L2 bound alone allowed up to 256 at short rows:
  // kernel alone, S512 causal 0.90 of the time at head dim 64, 0.95 at 128,
  // 0.96 at 256 (H100; H200 0.99, 0.96, 0.96); head dim 64 S1024 0.97
  // (H100). Groups of 4 at S1024 were mixed (H100 0.98-1.00, H200
  // 1.00-1.03; docs/design.md).
  const int64_t bytes_per_head = int64_t(s.seqlen_q) * s.head_dim * 4 * (s.num_heads / s.num_kv_heads);
  const int64_t pairs = int64_t(s.num_kv_heads) * s.batch;
  int group = tile_group(a.mask.causal, bytes_per_head, pairs);
  // A causal group of fewer tiles than the SMs leaves SMs idle while its
  // largest tiles run: grouped KV heads, whose L2 bound counts the Q/dO of
  // every query head of the group, got groups of 1-4 (KV head, batch) pairs,
  // 64 tiles at 16/4 heads, S 2048-8192: 81-82% of the SMs busy in
  // bench/tile_balance.py, 97-99% when a group covers 15/16 of the SMs.
  const int64_t sms = multiprocessor_count();
  while (a.mask.causal && int64_t(group) * grid.x * 16 < sms * 15 && group < pairs) group *= 2;
  p.order = tile_order(grid.x, s.num_kv_heads, s.batch,
                       int(std::min<int64_t>({group, pairs, grid.x <= 4 ? 4 : 16})));
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <DType kDt, int kHeadDim>
cudaError_t run_bwd_sm90(const BwdArgs& a, cudaStream_t stream) {
  using Cfg = typename BwdFeatureTiles<kHeadDim>::type;
  switch (feature_level(a.mask, a.scores)) {
    case kPlain: return launch_bwd_sm90<kDt, typename BwdTiles<kHeadDim>::type, kPlain>(a, stream);
    case kMasks: return launch_bwd_sm90<kDt, Cfg, kMasks>(a, stream);
    case kDropout: return launch_bwd_sm90<kDt, Cfg, kDropout>(a, stream);
    default: {
      // The bias through TMA when it can be (features.cuh:
      // encode_bias_map) and its tiles fit, else read per element; with the
      // soft cap, whose gradient needs the capped logits after dP^T, the
      // fused kScores pass.
      using BiasCfg = typename BwdBiasTiles<kHeadDim>::type;
      if constexpr (BiasCfg::bias_smem_bytes(false) <= 227 * 1024) {
        CUtensorMap bias_map;
        if (a.scores.bias != nullptr && a.scores.softcap == 0.f &&
            BiasCfg::bias_smem_bytes(a.scores.bias_f32) <= 227 * 1024 &&
            encode_bias_map(&bias_map, a.scores, a.shape, kDt, BiasCfg::kBlockM))
          return launch_bwd_sm90<kDt, BiasCfg, kBias>(a, stream, &bias_map);
      }
      return launch_bwd_sm90<kDt, Cfg, kScores>(a, stream);
    }
  }
}

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
