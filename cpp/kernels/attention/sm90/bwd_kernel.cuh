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
#include "kernels/attention/sm90/bwd_producer.cuh"
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
  constexpr int kD = Cfg::kHeadDim, kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  constexpr int kCB = Cfg::kColBlocks;
  constexpr bool kFused = Cfg::fused(kFeat);
  static_assert(kFeat == kPlain || kBM == 64, "the feature instances' bitmasks hold 64 queries");
  constexpr bool kDqWarp = Cfg::dq_warp(kFeat);
  constexpr int kDqFullBarrier = Cfg::kDqFullBarrier;
  constexpr int kDqBarrierThreads = Cfg::kDqBarrierThreads;
  constexpr bool kDvAfterDs = Cfg::kDvAfterDs;
  const BwdArgs& a = p.a;
  const ShapeArgs& sh = a.shape;

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
  const int n0 = wk.n0, kv_head = wk.kv_head, b = wk.b, group = wk.group;
  const SeqLens lens = wk.lens;
  const int mt_begin = wk.mt_begin, mt_end = wk.mt_end;

  if (BwdProducer<Cfg, kFeat>::run(p, sm, wk, wg, tid, lane)) return;

  setmaxnreg_inc<kFeat >= kScores ? Cfg::kScoreConsumerRegs : Cfg::kConsumerRegs>();
  using Features = BwdScoreFeatures<kDt, Cfg, kFeat>;
  const BwdConsumerThread<Cfg, kFeat> th(tid, wg, lane);
  const int c = th.c, ct = th.ct, w = th.w, g = th.g, t = th.t;
  const int wg_key0 = th.wg_key0, acc_cb0 = th.acc_cb0, thread_key0 = th.thread_key0;
  const int wg_q0 = th.wg_q0, q_frag0 = th.q_frag0;
  constexpr int kAcc = Cfg::kAccCols;
  constexpr int kSN = Cfg::kSN;
  // B operand of dV += P^T dO and dK += dS^T Q (MN-major): rows kk kWgmmaK..
  // of the stage's dO or Q tile, this warpgroup's dK/dV columns.
  auto acc_b_desc = [&](uint32_t tile, int kk) {
    return smem_desc(tile + acc_cb0 * col_block_bytes<kBM>() + kk * kWgmmaK * kSwizzleRowBytes,
                     col_block_bytes<kBM>());
  };
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
  [[maybe_unused]] const bool dbias_storer = kFeat == kBias && p.dbias_tma && ct == 0;
  const Features features{p, sm, th, wk, kid, key_id_lo, key_id_hi, bias_off, dbias_storer};

  // kSplitD: this warpgroup's columns of P^T or dS^T (fragment x, 16-bit)
  // into `buf`, laid out [kBN keys][kBM queries] like the dS^T buffers:
  // element (j, 2 h2 + e) is key row thread_key0 + 8 h2, query q_frag0 + 8 j + e.
  [[maybe_unused]] auto store_keys_by_queries = [&](uint32_t buf, const float (&x)[kSN / 8][4]) {
#pragma unroll
    for (int j = 0; j < kSN / 8; ++j)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
        st_shared_b32(buf + swizzled_offset(thread_key0 + 8 * h2, wg_q0 / 8 + j) + 4 * t,
                      pack2<kDt>(x[j][2 * h2], x[j][2 * h2 + 1]));
  };

  const int cb_lo = th.cb_lo;
  using Dq = BwdDq<kDt, Cfg, kFeat>;
  using DqFrag = typename Dq::Frag;
  const Dq dq{p, sm, th, wk};

  mbar_wait(sm.ring.once(), 0);
  int it = 0;
  for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    for (int mt = mt_begin; mt < mt_end; ++mt, ++it) {
      const int s = sm.ring.stage(it);
      const int m0 = mt * kBM;
      sm.ring.wait_full(it);

      float st[kSN / 8][4], dpt[kSN / 8][4];
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kD / kWgmmaK; ++k) {
        const int off = (k / 4) * col_block_bytes<kBN>() + wg_key0 * kSwizzleRowBytes + (k % 4) * 32;
        const int qoff = (k / 4) * col_block_bytes<kBM>() + wg_q0 * kSwizzleRowBytes + (k % 4) * 32;
        wgmma_ss<kDt, kSN>(st, smem_desc(sm.k_sa + off, 0), smem_desc(sm.q_tile(s) + qoff, 0), k > 0);
      }
      wgmma_commit();
#pragma unroll
      for (int k = 0; k < kD / kWgmmaK; ++k) {
        const int off = (k / 4) * col_block_bytes<kBN>() + wg_key0 * kSwizzleRowBytes + (k % 4) * 32;
        const int qoff = (k / 4) * col_block_bytes<kBM>() + wg_q0 * kSwizzleRowBytes + (k % 4) * 32;
        wgmma_ss<kDt, kSN>(dpt, smem_desc(sm.v_sa + off, 0), smem_desc(sm.do_tile(s) + qoff, 0), k > 0);
      }
      wgmma_commit();
      dq.release_last_stage(it);
      if constexpr (kFused) {
        wgmma_wait<0>();
        fence_operands(st);
        fence_operands(dpt);
      } else {
        wgmma_wait<1>();
        fence_operands(st);
      }

      // P^T, masked. Fragment element (j, 2 h + e): key thread_key0 + 8 h,
      // query m0 + q_frag0 + 8 j + e.
      const int key0 = n0 + wg_key0;
      const bool partial = tile_is_partial(a.mask, m0 + wg_q0, m0 + wg_q0 + kSN - 1, key0,
                                           key0 + kWgmmaM - 1, lens.kv_len);
      if constexpr (kFused) {
        features.score_step(s, m0, h, partial, st, dpt);
      } else {
        const uint32_t vis = kFeat == kMasks || kFeat == kBias ? features.visibility(s, m0, h) : ~0u;
#pragma unroll
        for (int j = 0; j < kSN / 8; ++j) {
          float2 l2;
          asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                       : "=f"(l2.x), "=f"(l2.y)
                       : "r"(sm.lse_vec(s) + 4 * (q_frag0 + 8 * j)));
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float l = e ? l2.y : l2.x;
              if constexpr (kFeat == kBias)  // exponent x log2 e - lse log2 e, x = scale s + bias
                l = fmaf(-features.tile_bias(features.bias_elem_addr(s, j, h2, e)), kLog2e, l);
              float pv = fast_exp2(fmaf(st[j][2 * h2 + e], scale_log2, -l));
              if ((kFeat == kMasks || kFeat == kBias) && !((vis >> (4 * j + 2 * h2 + e)) & 1u))
                pv = 0.f;
              st[j][2 * h2 + e] = pv;
            }
        }
        // Causal, window and length masks in a pass of their own, entered
        // once per tile: folded into the loop above, each element's test
        // compiled to its own branch, taken or not (about half of the H128
        // P^T pass's warp samples under ncu). Each of the thread's two keys
        // is visible to the queries [q_lo, q_hi): two compares per element.
        if (partial) {
          int q_lo[2], q_hi[2];
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int key = n0 + thread_key0 + 8 * h2;
            query_range(a.mask, key, key, lens.q_len, &q_lo[h2], &q_hi[h2]);
            if (key >= lens.kv_len) q_hi[h2] = q_lo[h2];
          }
#pragma unroll
          for (int j = 0; j < kSN / 8; ++j)
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int q = m0 + q_frag0 + 8 * j + e;
                if (q < q_lo[h2] || q >= q_hi[h2]) st[j][2 * h2 + e] = 0.f;
              }
        }
      }
      // dS^T [kBN keys][kBM queries] in shared memory (swizzled, in column
      // blocks of 64 queries) for dQ = dS K; kSplitD: P^T beside it, each
      // warpgroup writing its query columns.
      const uint32_t ds_buf = sm.ds_sa + (it % 2) * Cfg::kDsBytes;
      [[maybe_unused]] const uint32_t p_buf = sm.p_sa + (it % 2) * Cfg::kDsBytes;
      [[maybe_unused]] uint32_t pa[kSN / 16][4], dsa[kSN / 16][4];
      auto issue_dv = [&] {
#pragma unroll
        for (int kk = 0; kk < kSN / 16; ++kk) acc_to_a<kDt>(pa[kk], st[2 * kk], st[2 * kk + 1]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBM / kWgmmaK; ++kk)
          wgmma_rs<kDt, kAcc>(dv, pa[kk], acc_b_desc(sm.do_tile(s), kk));
        wgmma_commit();
      };
      if constexpr (Cfg::kSplitD)
        store_keys_by_queries(p_buf, st);
      else if constexpr (!kDvAfterDs)
        issue_dv();
      // dS^T: in dpt where score_step or kDvAfterDs put it, else in st.
      float(&ds_frag)[kSN / 8][4] = kFused || kDvAfterDs ? dpt : st;
      if constexpr (!kFused) {
        // dP^T is in (without kSplitD or kDvAfterDs, dV += P^T dO may still run).
        wgmma_wait<Cfg::kSplitD || kDvAfterDs ? 0 : 1>();
        fence_operands(dpt);

        [[maybe_unused]] const long long bias_h =
            b * a.scores.bias_stride_b + h * a.scores.bias_stride_n;
#pragma unroll
        for (int j = 0; j < kSN / 8; ++j) {
          float2 d2;
          asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                       : "=f"(d2.x), "=f"(d2.y)
                       : "r"(sm.delta_vec(s) + 4 * (q_frag0 + 8 * j)));
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            ds_frag[j][2 * h2] = st[j][2 * h2] * (dpt[j][2 * h2] - d2.x);
            ds_frag[j][2 * h2 + 1] = st[j][2 * h2 + 1] * (dpt[j][2 * h2 + 1] - d2.y);
            if constexpr (kFeat == kBias) {  // dbias = dS
#pragma unroll
              for (int e = 0; e < 2; ++e)
                features.put_dbias(features.bias_elem_addr(s, j, h2, e), bias_h, m0 + q_frag0 + 8 * j + e,
                          n0 + thread_key0 + 8 * h2, ds_frag[j][2 * h2 + e]);
            }
          }
        }
        if constexpr (kDvAfterDs) issue_dv();
      }
      if constexpr (Cfg::kSplitD) {
        store_keys_by_queries(ds_buf, ds_frag);
        fence_proxy_async();
        named_barrier_sync(1, Cfg::kConsumers * kWarpgroupThreads);
        // Both halves of P^T and dS^T are in: dV += P^T dO, dK += dS^T Q
        // over this warpgroup's columns.
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBM / kWgmmaK; ++kk)
          wgmma_ss_nt<kDt, kAcc>(dv, smem_desc(p_buf + kk * 32, 0), acc_b_desc(sm.do_tile(s), kk), 1);
#pragma unroll
        for (int kk = 0; kk < kBM / kWgmmaK; ++kk)
          wgmma_ss_nt<kDt, kAcc>(dk, smem_desc(ds_buf + kk * 32, 0), acc_b_desc(sm.q_tile(s), kk), 1);
        wgmma_commit();
      } else {
#pragma unroll
        for (int kk = 0; kk < kSN / 16; ++kk)
          acc_to_a<kDt>(dsa[kk], ds_frag[2 * kk], ds_frag[2 * kk + 1]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBM / kWgmmaK; ++kk)
          wgmma_rs<kDt, kAcc>(dk, dsa[kk], acc_b_desc(sm.q_tile(s), kk));
        wgmma_commit();

        // kDqByRows: this step's dS^T goes into the buffer of two steps
        // back once both warpgroups' dQ products have read it.
        if (Cfg::kDqByRows && it >= 2) mbar_wait(sm.ds_empty(it % 2), ((it - 2) / 2) & 1);
#pragma unroll
        for (int kk = 0; kk < kSN / 16; ++kk)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int r = thread_key0 + 8 * h2;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int chunk = 2 * kk + half;  // of 8 queries; 8 per 64-query column block
              st_shared_b32(ds_buf + (chunk / 8) * col_block_bytes<kBN>() +
                                swizzled_offset(r, chunk % 8) + 4 * t,
                            dsa[kk][2 * half + h2]);
            }
          }
        fence_proxy_async();
        // kDqTma: the last step's reductions have read this warpgroup's dQ
        // tile before anyone passes the barrier and writes it again.
        if (Cfg::kDqTma && !Cfg::kDqInStage && !kDqWarp && !Cfg::kDqByRows && ct == 0)
          tma_store_wait_read();
        if constexpr (Cfg::kDqByRows)
          mbar_arrive(sm.ds_full(it % 2));
        else if constexpr (Cfg::kDqByKeys)
          named_barrier_sync(2 + c, kWarpgroupThreads);
        else
          named_barrier_sync(1, Cfg::kConsumers * kWarpgroupThreads);
        if constexpr (kFeat == kBias) {
          if (dbias_storer) {  // the warpgroup's dS is in the tile (fenced before the barrier)
            features.store_dbias(sm.bias_tile(s), mt, h, false);
            tma_store_commit();
          }
        }
      }
      const int cb_hi = dq.cb_hi(it);
      // Once dK and dV's products are done: the stage's last reader.
      auto release_stage = [&] {
        fence_operands(dk);
        fence_operands(dv);
        if constexpr (!Cfg::kSplitD) {
          fence_operands(pa);
          fence_operands(dsa);
        }
        // The stage is free once the dbias stores have read it.
        if constexpr (kFeat == kBias)
          if (dbias_storer) tma_store_wait_read();
        // Every consumer thread arrives: each has read this stage's lse and
        // delta with ordinary loads, and its own arrive releases them.
        // kDqInStage: dQ goes into the stage once both warpgroups are done
        // with it, and thread 0's arrive waits for the reductions' reads
        // (in the next step, or from warp 1 with kDqWarp).
        if constexpr (Cfg::kDqInStage) named_barrier_sync(1, Cfg::kConsumers * kWarpgroupThreads);
        if (!Cfg::kDqInStage || ct != 0) mbar_arrive(sm.ring.empty(s));
      };
      // One dQ block per warpgroup and step, split by columns into tiles
      // of its own (head dim 128): its product is issued before the wait
      // for dK and dV, so that the tensor cores go on from one to the other
      // (H200, plain instance alone: 1-2.5% faster). Not at head dim 64's
      // 128-query steps, whose plain instance then spilled 52 bytes (28
      // before) and ran 7-9% slower, nor in the fused soft-cap and dropout
      // instances (soft cap 2% slower).
      constexpr bool kDqEarly = Cfg::kDqTma && !Cfg::kDqInStage && !Cfg::kDqByKeys &&
                                !Cfg::kDqByRows && kCB == Cfg::kConsumers && !kFused;
      if constexpr (kDqEarly) {
        DqFrag acc;
        dq.issue(ds_buf, cb_lo, acc);
        wgmma_wait<1>();
        release_stage();
        wgmma_wait<0>();
        dq.put(it, s, h, m0, cb_lo, acc);
      } else if constexpr (Cfg::kDqByRows) {
        // The last step's query head and tile (recomputed: held across the
        // step's products, they made ptxas serialize the wgmmas).
        const bool new_head = mt == mt_begin;
        const int prev_h = new_head ? h - 1 : h, prev_m0 = (new_head ? mt_end - 1 : mt - 1) * kBM;
        wgmma_wait<0>();
        release_stage();
        // The other dS^T buffer, as an offset from this step's (addressed
        // from ds_sa, it cost ptxas a register: 8 more spilled bytes).
        if (it > 0)
          dq.late(it - 1, ds_buf + ((it & 1) ? -Cfg::kDsBytes : Cfg::kDsBytes), prev_h, prev_m0);
      } else {
        wgmma_wait<0>();
        release_stage();
        for (int cb = cb_lo; cb < cb_hi; ++cb) {
          DqFrag acc;
          dq.issue(ds_buf, cb, acc);
          wgmma_wait<0>();
          dq.put(it, s, h, m0, cb, acc);
        }
      }
      if constexpr (kDqWarp) named_barrier_arrive(kDqFullBarrier + c, kDqBarrierThreads);
    }
  }

  if constexpr (Cfg::kDqByRows) {  // the last step's dQ
    if (it > 0)
      dq.late(it - 1, sm.ds_sa + ((it - 1) % 2) * Cfg::kDsBytes, (kv_head + 1) * group - 1,
              (mt_end - 1) * kBM);
  }

  // Epilogue: dK = scale * sum dS^T Q. Every warpgroup's last dQ product
  // (which reads all of K) is done once both pass the barrier; then each
  // stages its 64 rows of dK and dV over its own rows of K and V and stores.
  // (kDqTma: the last reductions read their tiles before the CTA exits;
  // kDqWarp: warp 1 waits for its own.)
  if (Cfg::kDqTma && !kDqWarp && ct == 0) tma_store_wait_read();
  named_barrier_sync(1, Cfg::kConsumers * kWarpgroupThreads);
  // kBias with dbias_tma: query tiles this CTA never visits (outside
  // [mt_begin, mt_end): hidden by causal, window, lengths or segment
  // ranges) get zeros, from a zeroed block of this warpgroup's dS^T buffer.
  [[maybe_unused]] const uint32_t zero_tile = sm.ds_sa + c * Cfg::kDsBytes;
  if constexpr (kFeat == kBias) {
    if (p.dbias_tma)
      for (int i = ct; i < kBM * kSwizzleRowBytes / 16; i += kWarpgroupThreads)
        asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(zero_tile + 16 * i), "r"(0)
                     : "memory");
  }
#pragma unroll
  for (int j = 0; j < kAcc / 8; ++j) {
    const int cb = acc_cb0 + j / 8, chunk = j % 8;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = thread_key0 + 8 * h2;
      const uint32_t off = cb * col_block_bytes<kBN>() + swizzled_offset(r, chunk) + 4 * t;
      const uint32_t kv = pack2<kDt>(dk[j][2 * h2] * a.scale, dk[j][2 * h2 + 1] * a.scale);
      const uint32_t vv = pack2<kDt>(dv[j][2 * h2], dv[j][2 * h2 + 1]);
      st_shared_b32(sm.k_sa + off, kv);
      st_shared_b32(sm.v_sa + off, vv);
    }
  }
  fence_proxy_async();
  named_barrier_sync(2 + c, kWarpgroupThreads);
  if (ct == 0 && n0 + wg_key0 < sh.seqlen_k) {
    if constexpr (kFeat == kBias) {
      if (dbias_storer) {
        const int q_tiles = (sh.seqlen_q + kBM - 1) / kBM;
        for (int h = kv_head * group; h < (kv_head + 1) * group; ++h)
          for (int mt = 0; mt < q_tiles; ++mt)
            if (mt < mt_begin || mt >= mt_end) features.store_dbias(zero_tile, mt, h, true);
      }
    }
#pragma unroll
    for (int cb = acc_cb0; cb < acc_cb0 + kAcc / kSwizzleCols; ++cb) {
      const uint32_t off = cb * col_block_bytes<kBN>() + wg_key0 * kSwizzleRowBytes;
      tma_store_4d(&p.dk_map, sm.k_sa + off, cb * kSwizzleCols, kv_head, n0 + wg_key0, b);
      tma_store_4d(&p.dv_map, sm.v_sa + off, cb * kSwizzleCols, kv_head, n0 + wg_key0, b);
    }
    tma_store_commit_and_wait();
  }
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
