// FwdScheduler: which work items (query tile, head, batch element) a
// Hopper forward CTA runs, in which order, and the key tiles of each; with
// a tile counter, the Q buffers' work slots that hand the items from the
// producer to the consumers.
//
// Work items run highest query tiles first: under a causal mask they have
// the most keys. A CTA takes units blockIdx.x, + gridDim.x, ... (one,
// unless the launch is persistent), and in a paired unit its two items one
// after the other: under a causal mask a pair holds m_blocks + 1 tiles'
// worth of keys whichever it is, so the fixed stride of a persistent grid
// gives every SM the same work.
// kShortFirst: the pair's lower query tile first. Both items read the
// head's key tiles from the first on, and the head's pairs run at once on
// neighbouring CTAs; long item first, the short item's re-reads of the
// first tiles come 6 key steps (at S512) after the pairs have read them,
// and L2 has dropped them: head dim 256, S512 causal reads 246 MB on the
// H100 where 201 MB is the minimum. Short first, every re-read comes 2
// steps after the last read of that tile: 116 -> 106 us there.
#pragma once
#include <cstdint>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/fwd_args.h"
#include "kernels/attention/sm90/fwd_smem.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/sm90/tile_order.h"

#ifdef JAXCRAFT_SM90A_ENABLED
namespace jaxcraft {
namespace attn {
namespace sm90 {

// A CTA's place in its work: the unit, and in a paired unit which item.
struct FwdCursor {
  int unit, second;
};

// One work item as both roles derive it.
struct FwdWork {
  int rank, m0, head, b, kv_head, rows_valid, t_begin, t_end;
  int row_first;  // the item's rows [row_first, rows_valid) are queries (m0 may be < 0)
  SeqLens lens;
};

// Holds values only; the kernel's parameters come in as a reference
// argument (fwd_kernel.cuh says why).
template <class Cfg, int kFeat>
struct FwdScheduler {
  static constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kQBufs = Cfg::kQBufs;
  bool short_first;
  bool dynamic;  // units from the tile counter, else the fixed stride

  __device__ __forceinline__ explicit FwdScheduler(const FwdSm90Args& p)
      : short_first(Cfg::kShortFirst && p.paired), dynamic(p.tile_counter != nullptr) {}

  __device__ TileItem item_at(const FwdSm90Args& p, FwdCursor cur) const {
    TileItem item = tile_item_at(cur.unit, p.order);
    if (cur.second != short_first) item.rank = p.m_blocks - 1 - item.rank;
    return item;
  }

  // The cursor after `cur`, whose work is `wk` (its rank decoded once).
  // A new unit: the next in the fixed stride, or with a tile counter the
  // next one not yet handed out (the first gridDim.x go to the CTAs in
  // order). Longest first holds either way; the counter also evens out CTAs
  // that run slower than others (their L2 misses, their clocks) instead of
  // leaving the last of the fixed stride's rounds to them.
  __device__ FwdCursor next_item(const FwdSm90Args& p, FwdCursor cur, const FwdWork& wk) const {
    const int unit_rank = short_first ? p.m_blocks - 1 - wk.rank : wk.rank;
    if (p.paired && !cur.second && 2 * unit_rank + 1 < p.m_blocks) return FwdCursor{cur.unit, 1};
    if (!dynamic) return FwdCursor{cur.unit + int(gridDim.x), 0};
    // (Only lane 0 gets here. Through the shuffle ptxas knows the unit is
    // warp-uniform, and the producer's item decode and TMA coordinates stay
    // on the uniform datapath: without it the forward ran 2% slower.)
    return FwdCursor{__shfl_sync(1u, int(atomicAdd(p.tile_counter, 1u)), 0) + int(gridDim.x), 0};
  }

  // Producer thread: the n-th item's cursor into its slot.
  __device__ void write_slot(const FwdSmem<Cfg>& sm, int n, FwdCursor cur) const {
    if (!dynamic) return;
    if (n >= kQBufs) mbar_wait(sm.slot_empty(n), sm.q_parity(n) ^ 1);
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(sm.q_slot(n)), "r"(cur.unit), "r"(cur.second)
                 : "memory");
    mbar_arrive(sm.slot_full(n));
  }

  // Consumer warps: lane 0 reads the slot, releases it and shares it.
  __device__ FwdCursor read_slot(const FwdSmem<Cfg>& sm, int n) const {
    FwdCursor cur{0, 0};
    if (threadIdx.x % kWarpSize == 0) {
      asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(cur.unit), "=r"(cur.second) : "r"(sm.q_slot(n))
                   : "memory");
      mbar_arrive(sm.slot_empty(n));
    }
    return FwdCursor{__shfl_sync(0xffffffffu, cur.unit, 0), __shfl_sync(0xffffffffu, cur.second, 0)};
  }

  // Both roles derive the key tiles [t_begin, t_end) an item visits, so
  // that the producer loads exactly the tiles the consumers take from the ring.
  __device__ FwdWork work_at(const FwdSm90Args& p, FwdCursor cur) const {
    const FwdArgs& a = p.a;
    const ShapeArgs& sh = a.shape;
    const TileItem item = item_at(p, cur);
    FwdWork w;
    w.rank = item.rank;
    w.head = item.head;
    w.b = item.batch;
    w.kv_head = p.kv_group.div(w.head);
    w.lens = seq_lens(a.mask, sh, w.b);
    w.m0 = (p.m_blocks - 1 - item.rank) * kBM - (Cfg::kTileCounter ? p.m_shift : 0);
    w.row_first = Cfg::kTileCounter ? max(0, -w.m0) : 0;
    w.rows_valid = min(kBM, w.lens.q_len - w.m0);
    int n_lo = 0, n_hi = 0;
    if (w.rows_valid > w.row_first) {
      const int first = w.m0 + w.row_first, last = w.m0 + w.rows_valid - 1;
      key_range(a.mask, first, last, w.lens.kv_len, &n_lo, &n_hi);
      if constexpr (kFeat != kPlain) segment_key_range(a.mask, sh, w.b, first, last, &n_lo, &n_hi);
    }
    w.t_begin = max(n_lo, 0) / kBN;
    w.t_end = n_hi > n_lo ? (n_hi + kBN - 1) / kBN : w.t_begin;
    return w;
  }
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
#endif  // JAXCRAFT_SM90A_ENABLED
