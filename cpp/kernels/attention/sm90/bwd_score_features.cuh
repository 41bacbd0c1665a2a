// BwdScoreFeatures: what the Hopper backward's feature instances (kFeat,
// features.cuh) add to a consumer's step: the segment-id and boolean-mask
// visibility of its fragment elements, the bias (per element, or from the
// kBias instances' TMA-loaded tiles), dS into dbias, and the fused P^T /
// dS^T pass of the soft-cap and dropout instances. The plain instance
// compiles none of it.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/sm90/bwd_args.h"
#include "kernels/attention/sm90/bwd_consumer_thread.cuh"
#include "kernels/attention/sm90/bwd_scheduler.cuh"
#include "kernels/attention/sm90/bwd_smem.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/softmax.cuh"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

template <DType kDt, class Cfg, int kFeat>
struct BwdScoreFeatures {
  static constexpr int kBM = Cfg::kBlockM, kSN = Cfg::kSN;
  static_assert(kFeat != kBias || !Cfg::kSplitD, "head dim 256 reads its bias per element");
  using Frag = float[kSN / 8][4];  // S^T or dP^T: C fragment
  // Every member refers to a variable of the kernel's consumer part, as a
  // lambda's captures would (bwd_kernel.cuh says why).
  const BwdSm90Args& p;
  const BwdSmem<Cfg, kFeat>& sm;
  const BwdConsumerThread<Cfg, kFeat>& th;
  const BwdWork& wk;
  // Segment ids of this thread's two keys and the warp's id range
  // (load_key_ids).
  const int (&kid)[2];
  const int &key_id_lo, &key_id_hi;
  // kBias: the fragment elements' offsets in a bias tile (bias_offsets).
  const uint32_t (&bias_off)[2][2];
  // kBias with dbias_tma: thread ct == 0 of each warpgroup stores its dS tiles.
  const bool& dbias_storer;

  // Segment ids of this thread's two keys (keys past S read key S - 1: they
  // are hidden by the length mask) and the warp's id range, held for the
  // whole CTA; the query ids come through the ring with lse and delta.
  static __device__ __forceinline__ void load_key_ids(const BwdSm90Args& p,
                                                      const BwdConsumerThread<Cfg, kFeat>& th,
                                                      const BwdWork& wk, int (&kid)[2],
                                                      int& key_id_lo, int& key_id_hi) {
    if constexpr (kFeat != kPlain) {
      const BwdArgs& a = p.a;
      const ShapeArgs& sh = a.shape;
      if (a.mask.q_segment_ids != nullptr) {
        const int32_t* kv_ids = a.mask.kv_segment_ids + int64_t(wk.b) * sh.seqlen_k;
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2)
          kid[h2] = __ldg(kv_ids + min(wk.n0 + th.thread_key0 + 8 * h2, sh.seqlen_k - 1));
        key_id_lo = warp_min(min(kid[0], kid[1]));
        key_id_hi = warp_max(max(kid[0], kid[1]));
      }
    }
  }

  // kBias: the bias element of tile row r (query), CTA key column kc, from
  // the stage's TMA-loaded tile; *at is its shared address, where dS goes
  // back. Conflict-free: a warp access reads 4 query rows x one chunk of
  // keys (two for float32), which the swizzle puts on distinct banks.
  // (ldmatrix.trans would fetch 16-bit pairs in a quarter of the
  // instructions, but its registers, held across the pass, spilled.)
  // The address of fragment element (j, 2 h2 + e) is bias_tile(s) +
  // bias_off[h2][e] + j * 8 rows: the swizzle depends on the row mod 8 only,
  // so four offsets serve every j (and stay the only live addresses).
  static __device__ __forceinline__ void bias_offsets(const BwdSm90Args& p,
                                                      const BwdConsumerThread<Cfg, kFeat>& th,
                                                      uint32_t (&bias_off)[2][2]) {
    if constexpr (kFeat == kBias)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          bias_off[h2][e] =
              bias_tile_addr(0, kBM, p.a.scores.bias_f32, 2 * th.t + e, th.thread_key0 + 8 * h2);
  }
  __device__ uint32_t bias_elem_addr(int s, int j, int h2, int e) const {
    return sm.bias_tile(s) + bias_off[h2][e] + j * 8 * kSwizzleRowBytes;
  }
  __device__ float tile_bias(uint32_t at) const {
    if (p.a.scores.bias_f32) {
      float v;
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(at));
      return v;
    }
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(at));
    return unpack2<kDt>(v).x;
  }

  // Visibility of the step's fragment elements under segment ids and the
  // boolean mask, as bits 4 j + 2 h2 + e for element st[j][2 h2 + e] (key
  // n0 + thread_key0 + 8 h2, query m0 + q_frag0 + 8 j + e).
  // The bit loops stay rolled: unrolled, the compiler would hoist all their
  // loads and crowd the registers.
  __device__ uint32_t visibility(int s, int m0, int h) const {
    const BwdArgs& a = p.a;
    const ShapeArgs& sh = a.shape;
    const int n0 = wk.n0, b = wk.b, thread_key0 = th.thread_key0, q_frag0 = th.q_frag0;
    uint32_t vis = ~0u;
    if (a.mask.q_segment_ids != nullptr) {
      int2 q_range;
      asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                   : "=r"(q_range.x), "=r"(q_range.y)
                   : "r"(sm.qid_vec(s) + Cfg::kVecBytes));
      const int cover = segment_cover(key_id_lo, key_id_hi, q_range.x, q_range.y);
      if (cover != kSegAllVisible) {
        vis = 0u;
        if (cover == kSegMixed) {
#pragma unroll 1
          for (int j = 0; j < kSN / 8; ++j) {
            int2 id;
            asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                         : "=r"(id.x), "=r"(id.y)
                         : "r"(sm.qid_vec(s) + 4 * (q_frag0 + 8 * j)));
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2)
              vis |= (uint32_t(id.x == kid[h2]) | uint32_t(id.y == kid[h2]) << 1) << (4 * j + 2 * h2);
          }
        }
      }
    }
    if (a.mask.mask != nullptr) {
      const uint8_t* mh = a.mask.mask + b * a.mask.mask_stride_b + h * a.mask.mask_stride_n;
      uint32_t bits = 0u;
#pragma unroll 1
      for (int j = 0; j < kSN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const long long row =
              static_cast<long long>(min(m0 + q_frag0 + 8 * j + e, sh.seqlen_q - 1)) * sh.seqlen_k;
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int key = min(n0 + thread_key0 + 8 * h2, sh.seqlen_k - 1);
            bits |= uint32_t(__ldg(mh + row + key) != 0) << (4 * j + 2 * h2 + e);
          }
        }
      vis &= bits;
    }
    return vis;
  }

  // dS of element (query q, key) into dbias (score features only): with
  // dbias_tma into the stage's bias tile at `at` (in place of the bias
  // element; the tile leaves by TMA store), else a global store, or an
  // atomic add where several (b, n) share the element.
  __device__ void put_dbias(uint32_t at, long long bias_h, int q, int key, float ds) const {
    const BwdArgs& a = p.a;
    const ShapeArgs& sh = a.shape;
    if (a.dbias == nullptr) return;
    if (kFeat == kBias && p.dbias_tma) {
      if (a.scores.bias_f32)
        asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(ds) : "memory");
      else
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(at),
                     "h"(static_cast<unsigned short>(pack2<kDt>(ds, 0.f))) : "memory");
    } else if (q < sh.seqlen_q && key < sh.seqlen_k) {
      const long long off = bias_h + static_cast<long long>(q) * sh.seqlen_k + key;
      if (dbias_needs_atomics(a.scores, sh)) {
        if (ds != 0.f) atomicAdd(static_cast<float*>(a.dbias) + off, ds);
      } else if (a.dbias_f32) {
        static_cast<float*>(a.dbias)[off] = ds;
      } else {
        static_cast<typename ElemOf<kDt>::type*>(a.dbias)[off] =
            static_cast<typename ElemOf<kDt>::type>(ds);
      }
    }
  }

  // kScores and kDropout: P^T (dropped and rescaled under kDropout) into st and
  // dS^T (times the soft-cap gradient) into dpt in one pass, once both
  // products are in; dS itself goes to dbias.
  __device__ void score_step(int s, int m0, int h, bool partial, Frag& st, Frag& dpt) const {
    const BwdArgs& a = p.a;
    const ShapeArgs& sh = a.shape;
    const int n0 = wk.n0, b = wk.b, g = th.g, thread_key0 = th.thread_key0, q_frag0 = th.q_frag0;
    const SeqLens& lens = wk.lens;
    const uint32_t vis = visibility(s, m0, h);
    const float cap = a.scores.softcap, inv_cap = cap > 0.f ? 1.f / cap : 0.f;
    const void* bias = a.scores.bias;
    const bool f32 = a.scores.bias_f32;
    const long long bias_h = b * a.scores.bias_stride_b + h * a.scores.bias_stride_n;
    const int key_base = n0 + thread_key0;
    // kDropout: key k of query q is word k % 4 (= g % 4 here) of Philox
    // block (k / 4, q). The four lanes g & ~3 + {0..3} (same t) need the
    // same four blocks per j, (h2, e) = (i / 2, i % 2): lane i = g % 4
    // computes block i and a 4 x 4 transpose hands each lane its word.
    [[maybe_unused]] uint32_t drop_key[2] = {0u, 0u};
    [[maybe_unused]] uint32_t drop_b = 0, drop_n = 0;
    if constexpr (kFeat == kDropout) {
      drop_key[0] = a.scores.dropout_key[0];
      drop_key[1] = a.scores.dropout_key[1];
      drop_b = a.scores.dropout_broadcast ? 0 : b;
      drop_n = a.scores.dropout_broadcast ? 0 : h;
    }
    [[maybe_unused]] const uint32_t drop_kb4 = (n0 + thread_key0 - (g & 3)) / 4;
#pragma unroll
    for (int j = 0; j < kSN / 8; ++j) {
      [[maybe_unused]] uint32_t keep_word[4];
      if constexpr (kFeat == kDropout) {
        const int i = g & 3;
        const Philox4 w = dropout_block(drop_key, drop_b, drop_n, m0 + q_frag0 + 8 * j + (i & 1),
                                        drop_kb4 + 2 * (i >> 1));
#pragma unroll
        for (int k = 0; k < 4; ++k) keep_word[k] = w.x[k];
        transpose4(keep_word, i, 4);  // keep_word[2 h2 + e]: this lane's word
      }
      const float2 l2 = ld_shared_f2(sm.lse_vec(s) + 4 * (q_frag0 + 8 * j));
      const float2 d2 = ld_shared_f2(sm.delta_vec(s) + 4 * (q_frag0 + 8 * j));
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int q = m0 + q_frag0 + 8 * j + e, key = key_base + 8 * h2;
          const float xc = capped_logit(st[j][2 * h2 + e], a.scale, cap, inv_cap);
          float x = xc;
          if (bias != nullptr) {
            x += bias_at<kDt>(bias, f32,
                              bias_h + static_cast<long long>(min(q, sh.seqlen_q - 1)) * sh.seqlen_k +
                                  min(key, sh.seqlen_k - 1));
          }
          float pv = fast_exp2(fmaf(x, kLog2e, -(e ? l2.y : l2.x)));
          bool hide = !((vis >> (4 * j + 2 * h2 + e)) & 1u);
          if (partial) hide |= !key_visible(a.mask, q, key, lens.kv_len);
          if (hide) pv = 0.f;
          float dp = dpt[j][2 * h2 + e];
          if constexpr (kFeat == kDropout) {
            // dV takes the dropped, rescaled P; dS = P (dP keep / (1 - rate) - delta).
            const float keep = keep_word[2 * h2 + e] >= a.scores.dropout_threshold
                                   ? a.scores.dropout_keep_scale
                                   : 0.f;
            dp *= keep;
            st[j][2 * h2 + e] = pv * keep;
          }
          float ds = pv * (dp - (e ? d2.y : d2.x));
          put_dbias(0, bias_h, q, key, ds);
          if (cap > 0.f) ds *= 1.f - (xc * inv_cap) * (xc * inv_cap);
          if constexpr (kFeat != kDropout) st[j][2 * h2 + e] = pv;
          dpt[j][2 * h2 + e] = ds;
        }
    }
  }

  // kBias with dbias_tma: TMA stores of this warpgroup's 64 keys (128-byte
  // column blocks) of query tile mt, head h, from `tile` (the stage's bias
  // tile, now holding dS, or a zeroed one); thread ct == 0 issues them.
  __device__ void store_dbias(uint32_t tile, int mt, int h, bool zeros) const {
    const BwdArgs& a = p.a;
    const int n0 = wk.n0, b = wk.b, wg_key0 = th.wg_key0;
    const int block_keys = a.scores.bias_f32 ? 32 : 64;
    const int bn = a.scores.bias_stride_n ? h : 0, bb = a.scores.bias_stride_b ? b : 0;
    for (int cb = wg_key0 / block_keys; cb < (wg_key0 + kWgmmaM) / block_keys; ++cb)
      tma_store_4d(&p.dbias_map, tile + (zeros ? 0 : cb * kBM * kSwizzleRowBytes),
                   n0 + cb * block_keys, mt * kBM, bn, bb);
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
