// BwdWork: the key tile a Hopper backward CTA runs (one per CTA, in the
// launch grid's tile order) and the query tiles it visits for each query
// head of its KV head's group.
#pragma once
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/sm90/bwd_args.h"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/tile_order.h"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

struct BwdWork {
  int n0;  // the tile's first key
  int kv_head, b;
  int group;  // query heads per KV head: kv_head's are [kv_head group, (kv_head + 1) group)
  SeqLens lens;
  int mt_begin, mt_end;  // the query tiles visited (of kBlockM queries)
};

// Lowest key tiles first: under a causal mask they see the most queries.
// The query tiles [mt_begin, mt_end) are computed before the roles split,
// so that the producer loads exactly the tiles the consumers take from the
// ring.
template <class Cfg, int kFeat>
__device__ __forceinline__ BwdWork bwd_work(const BwdSm90Args& p) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  const BwdArgs& a = p.a;
  const ShapeArgs& sh = a.shape;
  const TileItem item = tile_item(p.order);
  const int n0 = item.rank * kBN;
  const int kv_head = item.head, b = item.batch;
  const int group = sh.num_heads / sh.num_kv_heads;
  const SeqLens lens = seq_lens(a.mask, sh, b);
  int q_lo = 0, q_hi = 0;
  if (n0 < lens.kv_len) {
    const int c1 = min(n0 + kBN, lens.kv_len) - 1;
    query_range(a.mask, n0, c1, lens.q_len, &q_lo, &q_hi);
    if constexpr (kFeat != kPlain) segment_query_range(a.mask, sh, b, n0, c1, &q_lo, &q_hi);
  }
  const int mt_begin = max(q_lo, 0) / kBM;
  const int mt_end = q_hi > q_lo ? (q_hi + kBM - 1) / kBM : mt_begin;
  return BwdWork{n0, kv_head, b, group, lens, mt_begin, mt_end};
}

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
