// BwdQueryTile: a Hopper backward consumer warpgroup's work on one ring step
// (a query tile of one query head) against its keys: S^T = K Q^T and
// dP^T = V dO^T (wgmma, both operands in shared memory), P^T and dS^T in
// registers, dV += P^T dO and dK += dS^T Q (wgmma; P^T and dS^T from
// registers, kSplitD: from shared memory), dS^T into its shared buffer for
// dQ, and the stage's release.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/sm90/bwd_args.h"
#include "kernels/attention/sm90/bwd_config.cuh"
#include "kernels/attention/sm90/bwd_consumer_thread.cuh"
#include "kernels/attention/sm90/bwd_dq.cuh"
#include "kernels/attention/sm90/bwd_scheduler.cuh"
#include "kernels/attention/sm90/bwd_score_features.cuh"
#include "kernels/attention/sm90/bwd_smem.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/softmax.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <DType kDt, class Cfg, int kFeat>
struct BwdQueryTile {
  static constexpr int kD = Cfg::kHeadDim, kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  static constexpr int kCB = Cfg::kColBlocks, kSN = Cfg::kSN, kAcc = Cfg::kAccCols;
  static constexpr bool kFused = Cfg::fused(kFeat);
  static constexpr bool kDqWarp = Cfg::dq_warp(kFeat);
  static constexpr bool kDvAfterDs = Cfg::kDvAfterDs;
  using Acc = float[kAcc / 8][4];   // dK or dV: C fragment
  using Frag = float[kSN / 8][4];   // S^T, P^T, dP^T or dS^T: C fragment
  using AFrag = uint32_t[kSN / 16][4];  // P^T or dS^T, 16-bit: A fragment
  using Dq = BwdDq<kDt, Cfg, kFeat>;
  // Every member refers to a variable of the kernel's consumer part or of
  // its step loop, as a lambda's captures would (bwd_kernel.cuh says why).
  const BwdSm90Args& p;
  const BwdSmem<Cfg, kFeat>& sm;
  const BwdConsumerThread<Cfg, kFeat>& th;
  const BwdWork& wk;
  const BwdScoreFeatures<kDt, Cfg, kFeat>& features;
  const float& scale_log2;
  Acc& dk;
  Acc& dv;
  Frag& st;
  Frag& dpt;
  AFrag& pa;
  AFrag& dsa;

  // B operand of dV += P^T dO and dK += dS^T Q (MN-major): rows kk kWgmmaK..
  // of the stage's dO or Q tile, this warpgroup's dK/dV columns.
  __device__ uint64_t acc_b_desc(uint32_t tile, int kk) const {
    return smem_desc(tile + th.acc_cb0 * col_block_bytes<kBM>() + kk * kWgmmaK * kSwizzleRowBytes,
                     col_block_bytes<kBM>());
  }

  // S^T = K Q^T, then dP^T = V dO^T, each its own commit group.
  __device__ __forceinline__ void issue_products(int s) {
    const int wg_key0 = th.wg_key0, wg_q0 = th.wg_q0;
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
      wgmma_ss<kDt, kSN>(dpt, smem_desc(sm.v_sa + off, 0), smem_desc(sm.do_tile(s) + qoff, 0),
                         k > 0);
    }
    wgmma_commit();
  }

  // S^T (kFused: and dP^T) is in.
  __device__ __forceinline__ void wait_products() {
    if constexpr (kFused) {
      wgmma_wait<0>();
      fence_operands(st);
      fence_operands(dpt);
    } else {
      wgmma_wait<1>();
      fence_operands(st);
    }
  }

  // P^T, masked. Fragment element (j, 2 h + e): key thread_key0 + 8 h,
  // query m0 + q_frag0 + 8 j + e. q_lo, q_hi: the partial pass's scratch.
  __device__ __forceinline__ void form_probs(const BwdStep& step, int (&q_lo)[2], int (&q_hi)[2]) {
    const BwdArgs& a = p.a;
    const int s = step.s, h = step.h, m0 = step.m0;
    const int n0 = wk.n0, thread_key0 = th.thread_key0, q_frag0 = th.q_frag0, wg_q0 = th.wg_q0;
    const SeqLens& lens = wk.lens;
    const int key0 = n0 + th.wg_key0;
    const bool partial = tile_is_partial(a.mask, m0 + wg_q0, m0 + wg_q0 + kSN - 1, key0,
                                         key0 + kWgmmaM - 1, lens.kv_len);
    if constexpr (kFused) {
      features.score_step(s, m0, h, partial, st, dpt);
    } else {
      const uint32_t vis = kFeat == kMasks || kFeat == kBias ? features.visibility(s, m0, h) : ~0u;
#pragma unroll
      for (int j = 0; j < kSN / 8; ++j) {
        const float2 l2 = ld_shared_f2(sm.lse_vec(s) + 4 * (q_frag0 + 8 * j));
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
  }

  // dV += P^T dO, P^T (16-bit) from registers.
  __device__ void issue_dv(int s) {
#pragma unroll
    for (int kk = 0; kk < kSN / 16; ++kk) acc_to_a<kDt>(pa[kk], st[2 * kk], st[2 * kk + 1]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / kWgmmaK; ++kk)
      wgmma_rs<kDt, kAcc>(dv, pa[kk], acc_b_desc(sm.do_tile(s), kk));
    wgmma_commit();
  }

  // dS^T: in dpt where score_step or kDvAfterDs put it, else in st.
  __device__ __forceinline__ Frag& ds_frag() {
    if constexpr (kFused || kDvAfterDs)
      return dpt;
    else
      return st;
  }

  // kSplitD: this warpgroup's columns of P^T or dS^T (fragment x, 16-bit)
  // into `buf`, laid out [kBN keys][kBM queries] like the dS^T buffers:
  // element (j, 2 h2 + e) is key row thread_key0 + 8 h2, query q_frag0 + 8 j + e.
  __device__ void store_keys_by_queries(uint32_t buf, const Frag& x) {
    const int thread_key0 = th.thread_key0, wg_q0 = th.wg_q0, t = th.t;
#pragma unroll
    for (int j = 0; j < kSN / 8; ++j)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
        st_shared_b32(buf + swizzled_offset(thread_key0 + 8 * h2, wg_q0 / 8 + j) + 4 * t,
                      pack2<kDt>(x[j][2 * h2], x[j][2 * h2 + 1]));
  }

  // dS^T = P^T (dP^T - delta) (kFused: score_step formed it), and kBias's
  // dbias; dV += P^T dO issued before (overlapping this pass) or, with
  // kDvAfterDs, after it; kSplitD: P^T into shared memory instead.
  __device__ __forceinline__ void form_ds(const BwdStep& step) {
    const BwdArgs& a = p.a;
    const int it = step.it, s = step.s, h = step.h, m0 = step.m0;
    const int n0 = wk.n0, b = wk.b, thread_key0 = th.thread_key0, q_frag0 = th.q_frag0;
    // dS^T [kBN keys][kBM queries] in shared memory (swizzled, in column
    // blocks of 64 queries) for dQ = dS K; kSplitD: P^T beside it, each
    // warpgroup writing its query columns.
    [[maybe_unused]] const uint32_t p_buf = sm.p_buf(it);
    if constexpr (Cfg::kSplitD)
      store_keys_by_queries(p_buf, st);
    else if constexpr (!kDvAfterDs)
      issue_dv(s);
    Frag& ds = ds_frag();
    if constexpr (!kFused) {
      // dP^T is in (without kSplitD or kDvAfterDs, dV += P^T dO may still run).
      wgmma_wait<Cfg::kSplitD || kDvAfterDs ? 0 : 1>();
      fence_operands(dpt);

      [[maybe_unused]] const long long bias_h =
          b * a.scores.bias_stride_b + h * a.scores.bias_stride_n;
#pragma unroll
      for (int j = 0; j < kSN / 8; ++j) {
        const float2 d2 = ld_shared_f2(sm.delta_vec(s) + 4 * (q_frag0 + 8 * j));
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          ds[j][2 * h2] = st[j][2 * h2] * (dpt[j][2 * h2] - d2.x);
          ds[j][2 * h2 + 1] = st[j][2 * h2 + 1] * (dpt[j][2 * h2 + 1] - d2.y);
          if constexpr (kFeat == kBias) {  // dbias = dS
#pragma unroll
            for (int e = 0; e < 2; ++e)
              features.put_dbias(features.bias_elem_addr(s, j, h2, e), bias_h,
                                 m0 + q_frag0 + 8 * j + e, n0 + thread_key0 + 8 * h2,
                                 ds[j][2 * h2 + e]);
          }
        }
      }
      if constexpr (kDvAfterDs) issue_dv(s);
    }
  }

  // kSplitD: dS^T beside P^T in shared memory; once both halves of each
  // are in, dV += P^T dO, dK += dS^T Q over this warpgroup's columns.
  __device__ __forceinline__ void issue_split_d_products(const BwdStep& step, uint32_t ds_buf) {
    const int it = step.it, s = step.s;
    const uint32_t p_buf = sm.p_buf(it);
    store_keys_by_queries(ds_buf, ds_frag());
    fence_proxy_async();
    named_barrier_sync(Cfg::kConsumersBarrier, Cfg::kConsumerThreads);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / kWgmmaK; ++kk)
      wgmma_ss_nt<kDt, kAcc>(dv, smem_desc(p_buf + kk * 32, 0), acc_b_desc(sm.do_tile(s), kk), 1);
#pragma unroll
    for (int kk = 0; kk < kBM / kWgmmaK; ++kk)
      wgmma_ss_nt<kDt, kAcc>(dk, smem_desc(ds_buf + kk * 32, 0), acc_b_desc(sm.q_tile(s), kk), 1);
    wgmma_commit();
  }

  // dK += dS^T Q, dS^T (16-bit) from registers.
  __device__ __forceinline__ void issue_dk(int s) {
    Frag& ds = ds_frag();
#pragma unroll
    for (int kk = 0; kk < kSN / 16; ++kk) acc_to_a<kDt>(dsa[kk], ds[2 * kk], ds[2 * kk + 1]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / kWgmmaK; ++kk)
      wgmma_rs<kDt, kAcc>(dk, dsa[kk], acc_b_desc(sm.q_tile(s), kk));
    wgmma_commit();
  }

  // dS^T (16-bit, after issue_dk) into the step's buffer for dQ, and
  // kBias's dS tile out to dbias.
  __device__ __forceinline__ void store_ds(const BwdStep& step, uint32_t ds_buf) {
    const int it = step.it, s = step.s, h = step.h, mt = step.mt;
    const int c = th.c, ct = th.ct, t = th.t, thread_key0 = th.thread_key0;
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
      named_barrier_sync(Cfg::kWarpgroupBarrier + c, kWarpgroupThreads);
    else
      named_barrier_sync(Cfg::kConsumersBarrier, Cfg::kConsumerThreads);
    if constexpr (kFeat == kBias) {
      if (features.dbias_storer) {  // the warpgroup's dS is in the tile (fenced before the barrier)
        features.store_dbias(sm.bias_tile(s), mt, h, false);
        tma_store_commit();
      }
    }
  }

  // Once dK and dV's products are done: the stage's last reader.
  __device__ void release_stage(int s) {
    fence_operands(dk);
    fence_operands(dv);
    if constexpr (!Cfg::kSplitD) {
      fence_operands(pa);
      fence_operands(dsa);
    }
    // The stage is free once the dbias stores have read it.
    if constexpr (kFeat == kBias)
      if (features.dbias_storer) tma_store_wait_read();
    // Every consumer thread arrives: each has read this stage's lse and
    // delta with ordinary loads, and its own arrive releases them.
    // kDqInStage: dQ goes into the stage once both warpgroups are done
    // with it, and thread 0's arrive waits for the reductions' reads
    // (in the next step, or from warp 1 with kDqWarp).
    if constexpr (Cfg::kDqInStage)
      named_barrier_sync(Cfg::kConsumersBarrier, Cfg::kConsumerThreads);
    if (!Cfg::kDqInStage || th.ct != 0) mbar_arrive(sm.ring.empty(s));
  }

  // The step's dQ (kDqByRows: the last step's, from ds_prev) and the
  // stage's release, in the order that overlaps best; dq_acc holds a dQ
  // column block's product.
  __device__ __forceinline__ void finish(const BwdStep& step, const Dq& dq, uint32_t ds_buf,
                                         uint32_t ds_prev, typename Dq::Frag& dq_acc) {
    const int it = step.it, s = step.s, h = step.h, mt = step.mt, m0 = step.m0;
    const int cb_lo = th.cb_lo;
    const int cb_hi = dq.cb_hi(it);
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
      dq.issue(ds_buf, cb_lo, dq_acc);
      wgmma_wait<1>();
      release_stage(s);
      wgmma_wait<0>();
      dq.put(it, s, h, m0, cb_lo, dq_acc);
    } else if constexpr (Cfg::kDqByRows) {
      // The last step's query head and tile (recomputed: held across the
      // step's products, they made ptxas serialize the wgmmas).
      const bool new_head = mt == wk.mt_begin;
      const int prev_h = new_head ? h - 1 : h, prev_m0 = (new_head ? wk.mt_end - 1 : mt - 1) * kBM;
      wgmma_wait<0>();
      release_stage(s);
      if (it > 0) dq.late(it - 1, ds_prev, prev_h, prev_m0);
    } else {
      wgmma_wait<0>();
      release_stage(s);
      for (int cb = cb_lo; cb < cb_hi; ++cb) {
        dq.issue(ds_buf, cb, dq_acc);
        wgmma_wait<0>();
        dq.put(it, s, h, m0, cb, dq_acc);
      }
    }
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
