// Hopper forward (sm_90a), warp-specialized: one producer warpgroup issues
// TMA copies (Q once, then K and V tiles into a kStages ring guarded by
// full/empty mbarriers); kConsumers consumer warpgroups each own 64 query
// rows and run S = Q K^T (wgmma, both operands in shared memory), the online
// softmax in registers, and O += P V (wgmma, P from registers). Consumers
// never wait on each other, so one warpgroup's softmax runs while another's
// GEMMs occupy the tensor cores. O is staged in the warpgroup's own (dead)
// rows of the Q tile (or of the last K/V stage: kOInStage) and written by a
// TMA store, which clips partial tiles.
// Persistent grids (kPersistent): one CTA per SM strides through the work
// items, and the producer loads the next item's first K/V tile while the
// consumers finish this one, and its Q once their O stores have read the Q
// tile, or at once into a second Q buffer (kQBufs); at S <= 2048 a CTA sees
// only 4-16 key tiles, and a fresh CTA's launch and first loads cost a large
// part. Under a causal mask the items differ in work, so a persistent CTA
// takes them in pairs of equal total work (query tiles r and m_blocks - 1 - r
// of one head); a fixed stride over single items measured 11-38% slower
// than one CTA per item. At head dim 64 the CTAs instead take their next
// unit from a tile counter (FwdArgs::tile_counter), causal items singly,
// longest first.
// Segment ids, the boolean mask, soft cap, bias and dropout run in separate
// instances of the same kernel (kFeat, features.cuh).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
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

// Sizes, register split and shared-memory layout of a forward tile
// configuration (tiles.h).
template <class Tiles>
struct FwdConfig {
  static constexpr bool kBalancedPairs = Tiles::kBalancedPairs;
  static constexpr bool kSumByMma = Tiles::kSumByMma;
  static constexpr bool kHalfTiles = Tiles::kHalfTiles;
  static constexpr bool kStagger = Tiles::kStagger;
  static constexpr bool kSplitKV = Tiles::kSplitKV;
  static constexpr bool kOInStage = Tiles::kOInStage;
  static constexpr bool kOverlap = Tiles::kOverlap;
  static constexpr bool kPersistent = Tiles::kPersistent;
  static constexpr int kQBufs = Tiles::kQBufs;
  static constexpr int kCausalPersistRows = Tiles::kCausalPersistRows;
  static constexpr int kHeadDim = Tiles::kHeadDim;
  // A causal pair's item with fewer keys runs first (see short_first in the
  // kernel). Head dim 128 read only the minimum either way, and short first
  // was 3% slower there at S512 causal; head dim 64 ran 2% slower on every
  // row with it (H200, docs/design.md).
  static constexpr bool kShortFirst = kHeadDim >= 256;
  // A persistent grid takes its units from the tile counter (FwdArgs) at
  // head dim 64, under a causal mask single items longest first: 1.5-3%
  // faster than the fixed stride on full rows up to S4096, 6-7% on causal
  // S2048-S4096. At 128 and 256 (one Q buffer) it was up to 2% (128) and
  // 3% (256) slower at S <= 2048, so they keep the fixed stride and the
  // causal pairs (H100, docs/design.md).
  static constexpr bool kTileCounter = kHeadDim == 64;
  static constexpr int kConsumers = Tiles::kConsumers;
  static constexpr int kBlockM = kConsumers * kWgmmaM;
  static constexpr int kBlockN = Tiles::kBlockN;
  static constexpr int kStages = Tiles::kStages;
  static_assert(!kStagger || (kOverlap && kConsumers == 2 && kOInStage), "stagger: two overlapped warpgroups, O in the stage");
  static constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
  static constexpr int kColBlocks = kHeadDim / kSwizzleCols;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;  // one buffer
  static constexpr int kQAllBytes = kQBufs * kQBytes;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one of K or V
  static constexpr int kStageBytes = 2 * kKVBytes;
  static_assert(!kOInStage || kQBytes <= kStageBytes, "O fits a stage");
  // The ring's barriers (its `once` is buffer 0's Q arrival; with kSplitKV
  // they serve K, and a second ring's serve V), the other Q buffers'
  // arrivals and every Q buffer's release, then each Q buffer's work slot
  // and its two barriers.
  static constexpr int kBarrierBytes =
      (kSplitKV ? 2 : 1) * ring_barrier_bytes(kStages) + 8 * (2 * kQBufs - 1) + 24 * kQBufs;
  // kSumByMma's ones: one wgmma's K depth of rows (16 x 128 bytes, every
  // element 1), after the barriers, 1024-byte aligned like the swizzled
  // tiles (the swizzle permutes within aligned 128-byte rows); each k step's
  // descriptor reaches it.
  static constexpr int kOnesAlign = kSumByMma ? kSwizzleAtomBytes : 16;
  static constexpr int kOnesRel =
      (kQAllBytes + kStages * kStageBytes + kBarrierBytes + kOnesAlign - 1) / kOnesAlign * kOnesAlign;
  static constexpr int kOnesBytes = kSumByMma ? kWgmmaK * kSwizzleRowBytes : 0;
  // + alignment slack: the swizzled tiles need 1024-byte-aligned addresses.
  static constexpr int kSmemBytes = kSwizzleAtomBytes + kOnesRel + kOnesBytes;
  // Feature instances: per ring stage, the key tile's segment ids and their
  // min and max (written by the producer warp), after the ones.
  static constexpr int kIdBytes = kBlockN * 4 + 16;
  static constexpr int kIdsRel = kOnesRel + kOnesBytes;  // from the aligned base
  static constexpr int kFeatSmemBytes = kSwizzleAtomBytes + kIdsRel + kStages * kIdBytes;
  // setmaxnreg: the producer only issues copies (with two consumers 40: its
  // work-item loop spilled at 24 in the feature instances; with three the
  // consumers keep their 160, and the producer's 32 leave the mask instance
  // a 44-byte spill; with four, 640 threads launch at 96 each, and the
  // producer's 24 leave the consumers 112); the consumers hold S, O and P
  // fragments. Totals stay within the SM's 64K registers.
  static constexpr int kProducerRegs = kConsumers == 2 ? 40 : kConsumers == 3 ? 32 : 24;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 232 : kConsumers == 3 ? 160 : 112;
  static_assert(kHeadDim % kSwizzleCols == 0, "head dim is whole 64-column blocks");
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 shared-memory opt-in");
  static_assert(kFeatSmemBytes <= 227 * 1024, "fits the sm_90 shared-memory opt-in");
  // kBias instances: per ring stage, the bias tile (kBlockM x kBlockN, 16-bit
  // or float32), swizzled, after the ids.
  static constexpr int kBiasRel =
      (kIdsRel + kStages * kIdBytes + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr int bias_smem_bytes(bool f32) {
    return kSwizzleAtomBytes + kBiasRel + kStages * kBlockM * kBlockN * (f32 ? 4 : 2);
  }
  static_assert(kProducerRegs * kWarpgroupThreads + kConsumerRegs * kConsumers *
                        kWarpgroupThreads <= 64 * 1024, "register file");
};

// The keys a score slab (float[1][keys / 8][4], a C-layout fragment
// reference) holds: kBN, or kBN / 2 for a half tile (kHalfTiles).
template <class Slab>
constexpr int kSlabKeys = 8 * std::extent_v<std::remove_reference_t<Slab>, 1>;

struct FwdSm90Args {
  CUtensorMap q_map;  // box kBlockM rows
  CUtensorMap k_map;  // box kBlockN rows
  CUtensorMap v_map;  // box kBlockN rows
  CUtensorMap o_map;  // box 64 rows (one consumer warpgroup)
  FwdArgs a;
  CUtensorMap bias_map;  // kBias instances: box kBlockM rows x 128 bytes
  TileOrder order;       // of the units (tile_order.h)
  // Work items: m_blocks query tiles x heads x batch, taken in `units`
  // units (kernel parameters, which cost the consumers no registers).
  // paired: a unit is query tiles r and m_blocks - 1 - r of one head
  // (ceil(m_blocks / 2) units per head), else one tile (m_blocks per head).
  int m_blocks, units, paired;
  // Query tile r's first row is r * kBlockM - m_shift. A causal launch with
  // the tile counter (head dim 64, the plain instance) shifts the tiles
  // toward the last query row by whole warpgroups: the partial tile, with
  // idle warpgroups, is then the first, which sees the fewest keys, not the
  // last, which sees the most (S1024: the last tile's 64 rows kept two of
  // the three warpgroups idle for 8 key tiles, the first tile's for 1).
  int m_shift;
  FastDivmod kv_group;  // query heads per KV head
  int o_in_stage;  // kOInStage and a persistent launch
  // A persistent launch's zeroed count of units handed out (FwdArgs::
  // tile_counter), or null: the fixed stride.
  uint32_t* tile_counter;
};

// kFeat (features.cuh): kPlain, or the instances that add segment ids and
// the boolean mask (kMasks), also soft cap and bias (kScores, kBias), and
// also dropout (kDropout), each a run-time branch inside them. The plain
// instance compiles none of that.
template <DType kDt, class Cfg, int kFeat = kPlain>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ FwdSm90Args p) {
#ifdef JAXCRAFT_SM90A_ENABLED
  constexpr int kD = Cfg::kHeadDim, kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  constexpr int kStages = Cfg::kStages, kCB = Cfg::kColBlocks;
  // The L2 priority of the Q loads and O stores. Each is touched once per
  // work item, while the item's K/V tiles are read again by its other query
  // tiles and by the CTAs on the same head's other items. Evict-first Q and
  // O leave L2 to K/V: 1-2% on the H100 at head dims 128 and 256 up to S1024;
  // head dim 64 runs 0.5-0.8% slower with them, so it keeps evict-normal.
  const auto q_o_policy = [] { return kD > 64 ? l2_evict_first() : l2_evict_normal(); };
  const FwdArgs& a = p.a;
  const ShapeArgs& sh = a.shape;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t q_sa = swizzle_aligned(smem_raw);
  const uint32_t kv_sa = q_sa + Cfg::kQAllBytes;
  const RingBarriers<kStages> ring{kv_sa + kStages * Cfg::kStageBytes};
  // V's barriers: a ring of their own with kSplitKV, else the same as K's.
  const RingBarriers<kStages> vring{ring.base + (Cfg::kSplitKV ? RingBarriers<kStages>::kBytes : 0)};
  // This CTA's n-th work item uses Q buffer n % kQBufs for the (n /
  // kQBufs)-th time. q_full: the TMA bytes' arrival; q_empty: the release
  // for a later item, one arrive per consumer warpgroup once its O store
  // has read its rows of the buffer (with O in the stage: one per consumer
  // warp once its last S = Q K^T is in).
  constexpr int kQBufs = Cfg::kQBufs;
  const uint32_t q_bars = vring.base + RingBarriers<kStages>::kBytes;
  auto q_tile = [&](int n) { return q_sa + (n % kQBufs) * Cfg::kQBytes; };
  auto q_full = [&](int n) { return n % kQBufs == 0 ? ring.once() : q_bars + 8 * (kQBufs + n % kQBufs - 1); };
  auto q_empty = [&](int n) { return q_bars + 8 * (n % kQBufs); };
  auto q_parity = [&](int n) { return uint32_t(n / kQBufs) & 1; };
  // With a tile counter the producer writes the n-th item's cursor into
  // q_slot(n) as it starts the item's Q load and arrives on slot_full(n);
  // the consumers decode the item while Q is on its way, each consumer
  // warp arriving on slot_empty(n) once it has read the slot.
  auto q_slot = [&](int n) { return q_bars + 8 * (2 * kQBufs - 1) + 8 * (n % kQBufs); };
  auto slot_full = [&](int n) { return q_bars + 8 * (3 * kQBufs - 1) + 8 * (n % kQBufs); };
  auto slot_empty = [&](int n) { return q_bars + 8 * (4 * kQBufs - 1) + 8 * (n % kQBufs); };
  auto k_tile = [&](int s) { return kv_sa + s * Cfg::kStageBytes; };
  auto v_tile = [&](int s) { return kv_sa + s * Cfg::kStageBytes + Cfg::kKVBytes; };
  // kSumByMma (not with dropout, which zeroes P after its sum is taken):
  // O's columns kD.. hold the row sums.
  constexpr bool kSumByMma = Cfg::kSumByMma && kFeat != kDropout;
  constexpr int kOTiles = kD / 8 + (kSumByMma ? 1 : 0);
  const uint32_t ones_sa = q_sa + Cfg::kOnesRel;

  // Feature instances: stage s's key segment ids at ids_vec(s), their min
  // and max at ids_vec(s) + 4 kBN.
  [[maybe_unused]] const uint32_t ids_sa = q_sa + Cfg::kIdsRel;
  [[maybe_unused]] auto ids_vec = [&](int s) { return ids_sa + s * Cfg::kIdBytes; };
  // kBias: stage s's bias tile.
  [[maybe_unused]] const int bias_tile_bytes = kBM * kBN * (a.scores.bias_f32 ? 4 : 2);
  [[maybe_unused]] auto bias_tile = [&](int s) { return q_sa + Cfg::kBiasRel + s * bias_tile_bytes; };

  const int tid = threadIdx.x;
  // Broadcast from lane 0 so that ptxas knows it is warp-uniform: values
  // derived from it (the warpgroup's rows, its loop bounds) stay on the
  // uniform datapath (SASS: 43 R2UR moves in the head-dim-128 kernel -> 8;
  // measured 1.5-3.5% faster).
  const int wg = __shfl_sync(0xffffffffu, tid / kWarpgroupThreads, 0);
  // full: the TMA bytes' arrival (plus, with features, one per producer
  // lane, each after writing its ids); empty: one arrival per consumer warp.
  // Empty arrivals: one per consumer warp; in the feature instances one per
  // consumer thread, as each reads the stage's segment ids with ordinary
  // loads and only its own arrive orders them before the producer's rewrite
  // (compute-sanitizer racecheck flagged the lane-0 arrive there).
  if (tid == 0) {
    for (int qb = 0; qb < kQBufs; ++qb) {
      mbar_init(q_empty(qb), Cfg::kConsumers * (p.o_in_stage ? 4 : 1));
      mbar_init(slot_full(qb), 1);
      mbar_init(slot_empty(qb), Cfg::kConsumers * 4);
      if (qb > 0) mbar_init(q_full(qb), 1);
    }
    const int empty_arrivals = Cfg::kConsumers * (kFeat == kPlain ? 4 : kWarpgroupThreads);
    ring.init(kFeat == kPlain ? 1 : 1 + kWarpSize, empty_arrivals);
    if (Cfg::kSplitKV) vring.init(1, empty_arrivals);
  }
  if constexpr (kSumByMma) {
    const uint32_t one2 = kDt == DType::kBF16 ? 0x3F803F80u : 0x3C003C00u;  // two 16-bit 1.0
    for (int i = tid; i < Cfg::kOnesBytes / 4; i += Cfg::kThreads) st_shared_b32(ones_sa + 4 * i, one2);
    fence_proxy_async();  // the wgmma reads them through the async proxy
  }
  __syncthreads();

  // Work items (query tile, head, batch element), highest query tiles first:
  // under a causal mask they have the most keys. This CTA takes units
  // blockIdx.x, + gridDim.x, ... (one, unless the launch is persistent),
  // and in a paired unit its two items one after the other: under a causal
  // mask a pair holds m_blocks + 1 tiles' worth of keys whichever it is, so
  // the fixed stride of a persistent grid gives every SM the same work.
  // kShortFirst: the pair's lower query tile first. Both items read the
  // head's key tiles from the first on, and the head's pairs run at once on
  // neighbouring CTAs; long item first, the short item's re-reads of the
  // first tiles come 6 key steps (at S512) after the pairs have read them,
  // and L2 has dropped them: head dim 256, S512 causal reads 246 MB on the
  // H100 where 201 MB is the minimum. Short first, every re-read comes 2
  // steps after the last read of that tile: 116 -> 106 us there.
  const bool short_first = Cfg::kShortFirst && p.paired;
  struct Cursor {
    int unit, second;
  };
  auto item_at = [&](Cursor cur) {
    TileItem item = tile_item_at(cur.unit, p.order);
    if (cur.second != short_first) item.rank = p.m_blocks - 1 - item.rank;
    return item;
  };
  struct Work {
    int rank, m0, head, b, kv_head, rows_valid, t_begin, t_end;
    int row_first;  // the item's rows [row_first, rows_valid) are queries (m0 may be < 0)
    SeqLens lens;
  };
  // The cursor after `cur`, whose work is `wk` (its rank decoded once).
  // A new unit: the next in the fixed stride, or with a tile counter the
  // next one not yet handed out (the first gridDim.x go to the CTAs in
  // order). Longest first holds either way; the counter also evens out CTAs
  // that run slower than others (their L2 misses, their clocks) instead of
  // leaving the last of the fixed stride's rounds to them.
  const bool dynamic = p.tile_counter != nullptr;
  auto next_item = [&](Cursor cur, const Work& wk) {
    const int unit_rank = short_first ? p.m_blocks - 1 - wk.rank : wk.rank;
    if (p.paired && !cur.second && 2 * unit_rank + 1 < p.m_blocks) return Cursor{cur.unit, 1};
    if (!dynamic) return Cursor{cur.unit + int(gridDim.x), 0};
    // (Only lane 0 gets here. Through the shuffle ptxas knows the unit is
    // warp-uniform, and the producer's item decode and TMA coordinates stay
    // on the uniform datapath: without it the forward ran 2% slower.)
    return Cursor{__shfl_sync(1u, int(atomicAdd(p.tile_counter, 1u)), 0) + int(gridDim.x), 0};
  };
  auto write_slot = [&](int n, Cursor cur) {
    if (!dynamic) return;
    if (n >= kQBufs) mbar_wait(slot_empty(n), q_parity(n) ^ 1);
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(q_slot(n)), "r"(cur.unit), "r"(cur.second)
                 : "memory");
    mbar_arrive(slot_full(n));
  };
  // Consumer warps: lane 0 reads the slot, releases it and shares it.
  auto read_slot = [&](int n) {
    Cursor cur{0, 0};
    if (threadIdx.x % kWarpSize == 0) {
      asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(cur.unit), "=r"(cur.second) : "r"(q_slot(n))
                   : "memory");
      mbar_arrive(slot_empty(n));
    }
    return Cursor{__shfl_sync(0xffffffffu, cur.unit, 0), __shfl_sync(0xffffffffu, cur.second, 0)};
  };
  // Both roles derive the key tiles [t_begin, t_end) an item visits, so
  // that the producer loads exactly the tiles the consumers take from the ring.
  auto work_at = [&](Cursor cur) {
    const TileItem item = item_at(cur);
    Work w;
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
  };
  // Producer thread: Q of the CTA's n-th item into its buffer, once the O
  // stores of the buffer's previous item have read it.
  auto load_q = [&](int n, const Work& wk, Cursor cur) {
    if (n >= kQBufs) mbar_wait(q_empty(n), q_parity(n) ^ 1);
    write_slot(n, cur);
    mbar_arrive_expect_tx(q_full(n), Cfg::kQBytes);
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_load_4d(q_tile(n) + cb * col_block_bytes<kBM>(), &p.q_map, q_full(n), cb * kSwizzleCols,
                  wk.head, wk.m0, wk.b, q_o_policy());
  };
  // Producer thread, with a tile counter: the cursor past the last unit in
  // the n-th item's slot, so that the consumers leave their loop too.
  auto send_end = [&](int n, Cursor cur) {
    if (!dynamic) return;
    if (n >= kQBufs) mbar_wait(q_empty(n), q_parity(n) ^ 1);
    write_slot(n, cur);
  };

  // Producer thread: key tile nt's K (its barrier also expecting `extra`
  // bytes) and V into the stage of ring use `it`, after the caller's
  // ring.wait_free (the K half with kSplitKV; V then waits for its own).
  auto load_k = [&](int it, int nt, const Work& wk, uint32_t extra) {
    const int s = ring.stage(it);
    mbar_arrive_expect_tx(ring.full(s), (Cfg::kSplitKV ? Cfg::kKVBytes : Cfg::kStageBytes) + extra);
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_load_4d(k_tile(s) + cb * col_block_bytes<kBN>(), &p.k_map, ring.full(s),
                  cb * kSwizzleCols, wk.kv_head, nt * kBN, wk.b);
  };
  auto load_v = [&](int it, int nt, const Work& wk) {
    const int s = ring.stage(it);
    if constexpr (Cfg::kSplitKV) {
      vring.wait_free(it);
      mbar_arrive_expect_tx(vring.full(s), Cfg::kKVBytes);
    }
#pragma unroll
    for (int cb = 0; cb < kCB; ++cb)
      tma_load_4d(v_tile(s) + cb * col_block_bytes<kBN>(), &p.v_map, vring.full(s),
                  cb * kSwizzleCols, wk.kv_head, nt * kBN, wk.b);
  };

  if (wg == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if constexpr (kFeat == kPlain) {
      if (tid == 0) {
        prefetch_tensor_map(&p.q_map);
        prefetch_tensor_map(&p.k_map);
        prefetch_tensor_map(&p.v_map);
        int it = 0, n = 0;
        Cursor cur{int(blockIdx.x), 0};
        for (; cur.unit < p.units; ++n) {
          const Work wk = work_at(cur);
          // Q after this item's first K/V tile, whose stage frees up earlier.
          if (wk.t_begin == wk.t_end) load_q(n, wk, cur);
          for (int nt = wk.t_begin; nt < wk.t_end; ++nt, ++it) {
            ring.wait_free(it);
            load_k(it, nt, wk, 0);
            load_v(it, nt, wk);
            if (nt == wk.t_begin) load_q(n, wk, cur);
          }
          cur = next_item(cur, wk);
        }
        send_end(n, cur);
      }
    } else if (tid < kWarpSize) {
      // As above, and the whole warp copies each key tile's segment ids
      // (keys past S read key S - 1; they are hidden by the length mask)
      // and their range into the stage, so the consumers never wait on a
      // global load.
      if (tid == 0) {
        prefetch_tensor_map(&p.q_map);
        prefetch_tensor_map(&p.k_map);
        prefetch_tensor_map(&p.v_map);
        if constexpr (kFeat == kBias) prefetch_tensor_map(&p.bias_map);
      }
      int it = 0, n = 0;
      Cursor cur{int(blockIdx.x), 0};
      for (; cur.unit < p.units; ++n) {
        const Work wk = work_at(cur);
        const int m0 = wk.m0, head = wk.head, b = wk.b;
        const int t_begin = wk.t_begin, t_end = wk.t_end;
        if (tid == 0) load_q(n, wk, cur);
        const int32_t* kv_ids = a.mask.q_segment_ids != nullptr
                                    ? a.mask.kv_segment_ids + int64_t(b) * sh.seqlen_k
                                    : nullptr;
        // The ids are loaded one tile ahead, so their latency hides behind
        // the wait for a free stage.
        int v[kBN / kWarpSize];
        auto load_tile_ids = [&](int nt) {
#pragma unroll
          for (int k = 0; k < kBN / kWarpSize; ++k)
            v[k] = __ldg(kv_ids + min(nt * kBN + tid + kWarpSize * k, sh.seqlen_k - 1));
        };
        if (kv_ids != nullptr) load_tile_ids(t_begin);
        for (int nt = t_begin; nt < t_end; ++nt, ++it) {
          const int s = ring.stage(it);
          ring.wait_free(it);
          if (tid == 0) {
            load_k(it, nt, wk, kFeat == kBias ? bias_tile_bytes : 0);
            if constexpr (kFeat == kBias)  // rows m0.., keys nt kBN..
              load_bias_tile<kBM, kBN>(bias_tile(s), &p.bias_map, ring.full(s), a.scores, nt * kBN,
                                       m0, head, b);
            load_v(it, nt, wk);
          }
          if (kv_ids != nullptr) {
            int lo = v[0], hi = v[0];
#pragma unroll
            for (int k = 0; k < kBN / kWarpSize; ++k) {
              st_shared_b32(ids_vec(s) + 4 * (tid + kWarpSize * k), v[k]);
              lo = min(lo, v[k]);
              hi = max(hi, v[k]);
            }
            lo = warp_min(lo);
            hi = warp_max(hi);
            if (tid == 0) {
              st_shared_b32(ids_vec(s) + 4 * kBN, lo);
              st_shared_b32(ids_vec(s) + 4 * kBN + 4, hi);
            }
            if (nt + 1 < t_end) load_tile_ids(nt + 1);
          }
          mbar_arrive(ring.full(s));
        }
        // The warp's lane 0 takes the next unit, for all of it.
        Cursor next{};
        if (tid == 0) next = next_item(cur, wk);
        cur = Cursor{__shfl_sync(0xffffffffu, next.unit, 0), __shfl_sync(0xffffffffu, next.second, 0)};
      }
      if (tid == 0) send_end(n, cur);
    }
    return;
  }

  setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int c = wg - 1;  // consumer index (its query rows: wg_row0 below)
  const int ct = tid % kWarpgroupThreads, lane = tid % kWarpSize, w = ct / kWarpSize;
  const int g = lane / 4, t = lane % 4;

  // With O in the stage (plain instance), thread 0 of the warpgroup does not
  // wait for its O store to read the stage: it releases the stage for all
  // its warps in the next item, once that item's first S = Q K^T is issued,
  // so the store's read overlaps the next item instead of stalling the
  // warpgroup. (The feature instances release by every thread.)
  constexpr bool kLateRelease = kFeat == kPlain && Cfg::kOInStage;
  int stored_stage = -1;  // thread 0: the stage its O store is still reading
  auto release_stored = [&] {
    if (kLateRelease && stored_stage >= 0) {
      tma_store_wait_read();
      mbar_arrive(ring.empty(stored_stage), 4);  // one per warp, as release_*() count
      if (Cfg::kSplitKV) mbar_arrive(vring.empty(stored_stage), 4);
      stored_stage = -1;
    }
  };

  int it0 = 0, n = 0;  // ring uses before this work item; items done
  for (Cursor cur{int(blockIdx.x), 0};; ++n) {
    if (dynamic) {
      mbar_wait(slot_full(n), q_parity(n));
      cur = read_slot(n);
    }
    if (cur.unit >= p.units) break;
    const Work wk = work_at(cur);
    const int m0 = wk.m0, head = wk.head, b = wk.b, rows_valid = wk.rows_valid;
    const int row_first = wk.row_first;
    const int t_begin = wk.t_begin, t_end = wk.t_end;
    const SeqLens lens = wk.lens;
    // kBalancedPairs: a causal pair's upper tile takes the rows in reverse.
    const bool reversed = Cfg::kBalancedPairs && p.paired && 2 * wk.rank + 1 < p.m_blocks;
    const int wg_row0 = (reversed ? Cfg::kConsumers - 1 - c : c) * kWgmmaM;  // first tile row
    const int thread_row0 = wg_row0 + w * 16 + g;  // this thread's rows: + 0 and + 8
    float o[1][kOTiles][4];
    float row_max[1][2] = {{-INFINITY, -INFINITY}}, row_sum[1][2] = {{0.f, 0.f}};
#pragma unroll
    for (int j = 0; j < kOTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[0][j][e] = 0.f;
    const float scale_log2 = a.scale * kLog2e;
    // As in the portable kernel: the exponent folds the scale in and needs it
    // > 0; a zero or negative scale is applied to the raw scores instead.
    const bool prescale = scale_log2 <= 0.f;
    // kScores and up: a soft cap or bias needs the logits themselves, so the scores
    // become x log2(e) (x the final logit) and the exponent's scale is 1, as
    // when prescaling.
    bool transform = prescale;
    if constexpr (kFeat >= kScores) transform |= a.scores.softcap > 0.f || a.scores.bias != nullptr;
    const float softmax_scale = transform ? 1.f : scale_log2;

    // Segment ids of this thread's two rows (rows past T read row T - 1:
    // their output is dropped) and the warp's id range, held for the work
    // item; the keys' ids come through the ring (ids_vec).
    [[maybe_unused]] int row_id[2] = {0, 0};
    [[maybe_unused]] int row_id_lo = 0, row_id_hi = 0;
    if constexpr (kFeat != kPlain) {
      if (a.mask.q_segment_ids != nullptr) {
        const int32_t* q_ids = a.mask.q_segment_ids + int64_t(b) * sh.seqlen_q;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          row_id[h] = __ldg(q_ids + min(m0 + thread_row0 + 8 * h, sh.seqlen_q - 1));
        row_id_lo = warp_min(min(row_id[0], row_id[1]));
        row_id_hi = warp_max(max(row_id[0], row_id[1]));
      }
    }

    // S = Q K^T for key tile nt (ring step it) into sc, scaled and masked;
    // or, for a half tile, its first kBN / 2 keys into a narrower slab.
    float sc[1][kBN / 8][4];
    auto issue_scores_into = [&](int it, auto& slab) {
      constexpr int kN = kSlabKeys<decltype(slab)>;
      const int s = ring.stage(it0 + it);
      const uint64_t q_desc = smem_desc(q_tile(n) + wg_row0 * kSwizzleRowBytes, 0);
      const uint64_t k_desc = smem_desc(k_tile(s), 0);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kD / kWgmmaK; ++k) {
        const int cb = k / 4, kb = (k % 4) * kWgmmaK * 2;
        wgmma_ss<kDt, kN>(slab[0], desc_plus(q_desc, cb * col_block_bytes<kBM>() + kb),
                          desc_plus(k_desc, cb * col_block_bytes<kBN>() + kb), k > 0);
      }
      wgmma_commit();
    };
    auto issue_scores = [&](int it) { issue_scores_into(it, sc); };
    // Feature instances: the logit transform and the per-element masks of
    // tile nt. Fragment element sc[0][j][2 h + e] is row m0 + thread_row0 + 8 h,
    // key nt * kBN + 8 j + 2 t + e.
    [[maybe_unused]] auto feature_scores = [&](int nt) {
      const int n0 = nt * kBN;
      const uint32_t ids = ids_vec(ring.stage(it0 + nt - t_begin));
      int cover = kSegAllVisible;
      if (a.mask.q_segment_ids != nullptr) {
        int2 range;
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                     : "=r"(range.x), "=r"(range.y)
                     : "r"(ids + 4 * kBN));
        cover = segment_cover(row_id_lo, row_id_hi, range.x, range.y);
      }
      if (transform) {
        float cap = 0.f, inv_cap = 0.f;
        const void* bias = nullptr;
        bool f32 = false;
        if constexpr (kFeat >= kScores) {
          cap = a.scores.softcap;
          inv_cap = cap > 0.f ? 1.f / cap : 0.f;
          bias = a.scores.bias;
          f32 = a.scores.bias_f32;
        }
        if constexpr (kFeat == kBias) {
          // From the stage's tile: key pairs 8 j + 2 t + {0, 1} in one
          // conflict-free shared load.
          const uint32_t tile = bias_tile(ring.stage(it0 + nt - t_begin));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = thread_row0 + 8 * h;
#pragma unroll
            for (int j = 0; j < kBN / 8; ++j) {
              const uint32_t at = bias_tile_addr(tile, kBM, f32, r, 8 * j + 2 * t);
              float2 bv;
              if (f32) {
                bv = ld_shared_f2(at);
              } else {
                uint32_t w;
                asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w) : "r"(at));
                bv = unpack2<kDt>(w);
              }
              sc[0][j][2 * h] = (capped_logit(sc[0][j][2 * h], a.scale, cap, inv_cap) + bv.x) * kLog2e;
              sc[0][j][2 * h + 1] =
                  (capped_logit(sc[0][j][2 * h + 1], a.scale, cap, inv_cap) + bv.y) * kLog2e;
            }
          }
        } else if (bias != nullptr) {
          // Key pairs 8 j + 2 t + {0, 1} in one load when aligned (keys past
          // S read the last pair: they are hidden by the length mask).
          const bool pairs = bias_pairs_aligned(a.scores, sh.seqlen_k);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = min(m0 + thread_row0 + 8 * h, sh.seqlen_q - 1);
            const long long row_at = b * a.scores.bias_stride_b + head * a.scores.bias_stride_n +
                                     static_cast<long long>(r) * sh.seqlen_k;
#pragma unroll
            for (int j = 0; j < kBN / 8; ++j) {
              const int key = n0 + 8 * j + 2 * t;
              float2 bv;
              if (pairs) {
                bv = bias_pair<kDt>(bias, f32, row_at + min(key, sh.seqlen_k - 2));
              } else {
                bv.x = bias_at<kDt>(bias, f32, row_at + min(key, sh.seqlen_k - 1));
                bv.y = bias_at<kDt>(bias, f32, row_at + min(key + 1, sh.seqlen_k - 1));
              }
              sc[0][j][2 * h] = (capped_logit(sc[0][j][2 * h], a.scale, cap, inv_cap) + bv.x) * kLog2e;
              sc[0][j][2 * h + 1] =
                  (capped_logit(sc[0][j][2 * h + 1], a.scale, cap, inv_cap) + bv.y) * kLog2e;
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              sc[0][j][e] = capped_logit(sc[0][j][e], a.scale, cap, inv_cap) * kLog2e;
        }
      }
      // Segment ids and the boolean mask as visibility bits (bit 2 j + e of
      // vis[h]), applied in one pass. A warp whose rows share no segment with
      // the tile (rare: tiles come from segment_key_range) takes the same
      // path with nothing visible: an early-out there costs the overlapped
      // loop spills. The bit loops stay rolled, so the compiler cannot hoist
      // all their loads and shuffles at once.
      const bool has_mask = a.mask.mask != nullptr;
      if (cover != kSegAllVisible || has_mask) {
        uint32_t vis[2] = {0u, 0u};
        if (cover == kSegMixed) {
#pragma unroll 1
          for (int j = 0; j < kBN / 8; ++j) {
            int2 id;
            asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                         : "=r"(id.x), "=r"(id.y)
                         : "r"(ids + 4 * (8 * j + 2 * t)));
#pragma unroll
            for (int h = 0; h < 2; ++h)
              vis[h] |= (uint32_t(id.x == row_id[h]) | uint32_t(id.y == row_id[h]) << 1) << (2 * j);
          }
        } else if (cover == kSegAllVisible) {
          vis[0] = vis[1] = ~0u;
        }
        if (has_mask) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = min(m0 + thread_row0 + 8 * h, sh.seqlen_q - 1);
            const uint8_t* mrow = a.mask.mask + b * a.mask.mask_stride_b +
                                  head * a.mask.mask_stride_n + static_cast<long long>(r) * sh.seqlen_k;
            uint32_t bits = 0u;
#pragma unroll 1
            for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int key = min(n0 + 8 * j + 2 * t + e, sh.seqlen_k - 1);
                bits |= uint32_t(__ldg(mrow + key) != 0) << (2 * j + e);
              }
            vis[h] &= bits;
          }
        }
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              if (!((vis[h] >> (2 * j + e)) & 1u)) sc[0][j][2 * h + e] = -INFINITY;
      }
    };
    auto mask_slab_scores = [&](int nt, auto& slab) {  // after the product's wgmma_wait
      constexpr int kN = kSlabKeys<decltype(slab)>;
      static_assert(kN == kBN || kFeat == kPlain, "half tiles: plain instance only");
      fence_operands(slab[0]);
      const int n0 = nt * kBN;
      if constexpr (kFeat != kPlain) {
        feature_scores(nt);
      } else if (prescale) {
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) slab[0][j][e] *= scale_log2;
      }
      if (tile_is_partial(a.mask, m0 + wg_row0, m0 + wg_row0 + kWgmmaM - 1, n0, n0 + kN - 1,
                          lens.kv_len))
        mask_slab(slab[0], a.mask, m0 + thread_row0, n0, t, lens.kv_len);
    };
    auto mask_scores = [&](int nt) { mask_slab_scores(nt, sc); };
    // O += P V for ring step it, P (16-bit) from registers.
    // (keys: the first keys.value of the tile, a std::integral_constant.)
    uint32_t pa[kBN / 16][4];
    auto issue_pv_keys = [&](int it, auto keys) {
      const int s = ring.stage(it0 + it);
      if constexpr (Cfg::kSplitKV) vring.wait_full(it0 + it);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < decltype(keys)::value / kWgmmaK; ++kk) {
        const uint32_t va = v_tile(s) + kk * kWgmmaK * kSwizzleRowBytes;
        // kSumByMma: B's next 64-column block (the leading offset away) is the ones.
        const uint64_t vd = smem_desc(va, kSumByMma ? ones_sa - va : col_block_bytes<kBN>());
        wgmma_rs<kDt, kOTiles * 8>(o[0], pa[kk], vd);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int it) { issue_pv_keys(it, std::integral_constant<int, kBN>{}); };
    auto pack_slab = [&](auto& slab) {
      constexpr int kN = kSlabKeys<decltype(slab)>;
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) acc_to_a<kDt>(pa[kk], slab[0][2 * kk], slab[0][2 * kk + 1]);
    };
    auto pack_probs = [&] { pack_slab(sc); };

    // The stage of ring step it: its K half (kSplitKV only; the feature
    // instances' segment ids and bias tile ride with K) once the scores are
    // masked, its V half (the whole stage otherwise) once P V has landed.
    auto release_k = [&](int it) {
      if (Cfg::kSplitKV && (kFeat != kPlain || lane == 0)) mbar_arrive(ring.empty(ring.stage(it0 + it)));
    };
    auto release_v = [&](int it) {
      if (kFeat != kPlain || lane == 0) mbar_arrive(vring.empty(ring.stage(it0 + it)));
    };

    // kDropout: zero the dropped probabilities of tile nt (after the row sums
    // took them: the softmax is that of all keys); the epilogue scales by
    // 1 / (1 - rate). Keys 4 j4 .. + 3 of a row share a Philox block; this
    // thread's pair 8 j + 2 t + {0, 1} of row h is words 2 (t % 2) + {0, 1}
    // of block (row h, (nt kBN + 8 j) / 4 + t / 2). The quad needs four
    // blocks per j: lane t computes the one of row t % 2 and swaps halves
    // with lane t ^ 1, which needs the same block's other words.
    [[maybe_unused]] auto drop_probs = [&](int nt) {
      if constexpr (kFeat == kDropout) {
        const uint32_t key[2] = {a.scores.dropout_key[0], a.scores.dropout_key[1]};
        const uint32_t rb = a.scores.dropout_broadcast ? 0 : b;
        const uint32_t rn = a.scores.dropout_broadcast ? 0 : head;
        const uint32_t thr = a.scores.dropout_threshold;
        const bool odd = t & 1;
        const uint32_t i = m0 + thread_row0 + 8 * odd;  // this lane's block row
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
          const Philox4 w = dropout_block(key, rb, rn, i, (nt * kBN + 8 * j) / 4 + (t >> 1));
          // Own words 2 (t % 2) + {0, 1} serve row t % 2; the partner's
          // block, same words, serves the other row.
          const uint32_t own0 = odd ? w.x[2] : w.x[0], own1 = odd ? w.x[3] : w.x[1];
          const uint32_t give0 = odd ? w.x[0] : w.x[2], give1 = odd ? w.x[1] : w.x[3];
          const uint32_t got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
          const uint32_t got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const bool mine = h == int(odd);
            if ((mine ? own0 : got0) < thr) sc[0][j][2 * h] = 0.f;
            if ((mine ? own1 : got1) < thr) sc[0][j][2 * h + 1] = 0.f;
          }
        }
      }
    };
    mbar_wait(q_full(n), q_parity(n));
    const int n_tiles = t_end - t_begin;
    // O in the last stage: once this warp's last S = Q K^T is in, it is
    // done with Q, and that stage is released after the O store has read it.
    const bool o_in_stage = p.o_in_stage && n_tiles > 0;
    auto q_read = [&](int it) {
      if (o_in_stage && it == n_tiles - 1 && lane == 0) mbar_arrive(q_empty(n));
    };
    auto keep_stage = [&](int it) { return o_in_stage && it == n_tiles - 1; };
    auto keys_read = [&](int it) {
      if (!keep_stage(it)) release_k(it);
    };
    auto values_read = [&](int it) {
      if (!keep_stage(it)) release_v(it);
    };
    // The valid rows of this warpgroup see no key from tile n_live on (on
    // a causal diagonal: the first warpgroup's last 64-key tile at head dim
    // 256, one or two of the three warpgroups' last tile at 64). Those
    // tiles are only waited for and released, after the others: a branch
    // around the products instead made ptxas serialize every wgmma. Its
    // loop bound must be warp-uniform (the broadcast wg): without that it
    // cost 5-12% on every row.
    int n_live = 0, last_keys = 0;  // last_keys: the live keys of tile n_live - 1
    if (const int wg_first = max(wg_row0, row_first), wg_end = min(wg_row0 + kWgmmaM, rows_valid);
        wg_end > wg_first) {
      int wg_lo, wg_hi;
      key_range(a.mask, m0 + wg_first, m0 + wg_end - 1, lens.kv_len, &wg_lo, &wg_hi);
      n_live = min(n_tiles, max(0, (wg_hi - t_begin * kBN + kBN - 1) / kBN));
      last_keys = wg_hi - (t_begin + n_live - 1) * kBN;
    }
    if constexpr (!Cfg::kOverlap) {
      auto step = [&](int it, auto& slab) {
        constexpr int kN = kSlabKeys<decltype(slab)>;
        ring.wait_full(it0 + it);
        issue_scores_into(it, slab);
        if (it == 0) release_stored();
        wgmma_wait<0>();
        q_read(it);
        mask_slab_scores(t_begin + it, slab);
        keys_read(it);
        float corr[1][2];
        if (online_softmax_step<!kSumByMma>(slab, row_max, row_sum, corr, softmax_scale))
          rescale_rows(o, corr);
        drop_probs(t_begin + it);
        pack_slab(slab);
        issue_pv_keys(it, std::integral_constant<int, kN>{});
        wgmma_wait<0>();
        fence_operands(o[0]);
        values_read(it);
      };
      // kHalfTiles: where the last live tile's second half is hidden from
      // every row of this warpgroup (a causal diagonal, the length edge),
      // its products and softmax run over the first half alone. A loop of
      // its own: a branch around a wgmma makes ptxas fence every wgmma.
      constexpr bool kHalf = Cfg::kHalfTiles && kFeat == kPlain;
      const int n_full = kHalf && n_live > 0 && last_keys <= kBN / 2 ? n_live - 1 : n_live;
      for (int it = 0; it < n_full; ++it) step(it, sc);
      if constexpr (kHalf) {
        float sc_half[1][kBN / 16][4];
        for (int it = n_full; it < n_live; ++it) step(it, sc_half);
      }
    }
    // kStagger: both warpgroups start an item on the same Q and K arrivals;
    // the second issues its first S = Q K^T only once the first has issued
    // its own, so that the first's softmax runs under the second's product
    // instead of both softmaxes leaving the tensor cores idle. The first
    // cannot arrive for the next item before the second passed here: with
    // O in the stage its epilogue waits for every warp's last S = Q K^T, and
    // without it the launch is one item per CTA. (The second's wait holds
    // the previous item's O stage a little longer; the first's first tile
    // never sits in that stage.)
    constexpr bool kStagger = Cfg::kStagger && kFeat == kPlain;
    constexpr int kStaggerBarrier = 2 + Cfg::kConsumers;
    auto stagger_first = [&] {
      if constexpr (kStagger)
        if (c == 0 && n_tiles > 0) named_barrier_arrive(kStaggerBarrier, 2 * kWarpgroupThreads);
    };
    if constexpr (kStagger)
      if (c == 1 && n_tiles > 0) named_barrier_sync(kStaggerBarrier, 2 * kWarpgroupThreads);
    // Software-pipelined within the warpgroup: tile it's scores are computed
    // while tile it - 1's P V runs, and their softmax (the exponentials) runs
    // under that product too; O is rescaled only once P V has landed.
    if (Cfg::kOverlap && n_live > 0) {
      ring.wait_full(it0);
      issue_scores(0);
      stagger_first();
      release_stored();
      wgmma_wait<0>();
      q_read(0);
      mask_scores(t_begin);
      keys_read(0);
      float corr[1][2];
      online_softmax_step<!kSumByMma>(sc, row_max, row_sum, corr, softmax_scale);  // O is still 0
      drop_probs(t_begin);
      pack_probs();
    }
    if (n_live == 0) stagger_first();
    for (int it = 1; Cfg::kOverlap && it < n_live; ++it) {
      ring.wait_full(it0 + it);
      issue_scores(it);
      issue_pv(it - 1);
      wgmma_wait<1>();
      q_read(it);
      mask_scores(t_begin + it);
      keys_read(it);
      float corr[1][2];
      const bool rescale = online_softmax_step<!kSumByMma>(sc, row_max, row_sum, corr, softmax_scale);
      drop_probs(t_begin + it);
      wgmma_wait<0>();
      fence_operands(o[0]);
      release_v(it - 1);
      if (rescale) rescale_rows(o, corr);
      pack_probs();
    }
    if (Cfg::kOverlap && n_live > 0) {
      issue_pv(n_live - 1);
      wgmma_wait<0>();
      fence_operands(o[0]);
      values_read(n_live - 1);
    }
    // The previous item's O stage first (a no-op after a live tile): the
    // producer may need it to fill the tiles waited for below (without
    // this, the check with 3 persistent CTAs hung).
    release_stored();
    for (int it = n_live; it < n_tiles; ++it) {  // the ring's phases stay in step
      ring.wait_full(it0 + it);
      q_read(it);
      keys_read(it);
      if constexpr (Cfg::kSplitKV) vring.wait_full(it0 + it);
      values_read(it);
    }

    // Epilogue: normalize, write the logsumexp, stage O (16-bit, swizzled)
    // over this warpgroup's rows of the Q tile (kOInStage: of the last
    // stage), then one thread stores it and, once the store has read them,
    // the Q tile (the stage) is released.
    const int rows_out = min(kBM, sh.seqlen_q - m0);
    float* lse = a.lse + (int64_t(b) * sh.num_heads + head) * sh.seqlen_q + m0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = thread_row0 + 8 * h;
      const float sum = kSumByMma ? o[0][kD / 8][2 * h] : quad_sum(row_sum[0][h]);
      // sum = 0: the row saw no key (zeros, lse -inf); NaN: a NaN score,
      // which makes the row and its lse NaN, as jax.nn.
      const bool seen = (sum > 0.f || sum != sum) && r >= row_first && r < rows_valid;
      float inv = seen ? 1.f / sum : 0.f;
      if constexpr (kFeat == kDropout) inv *= a.scores.dropout_keep_scale;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        o[0][j][2 * h] *= inv;
        o[0][j][2 * h + 1] *= inv;
      }
      if (t == 0 && r >= row_first && r < rows_out)
        lse[r] = seen ? (row_max[0][h] + __log2f(sum)) * kLn2 : -INFINITY;
    }
    const int o_stage = ring.stage(it0 + n_tiles - 1);
    const uint32_t o_tile = o_in_stage ? k_tile(o_stage) : q_tile(n);
    release_stored();  // an item without keys issued no S = Q K^T
    // Every warpgroup's last products have read the stage. Where O fits the
    // stage's K tile, the Q release says so (each warp arrives once its last
    // S = Q K^T is in), and no warpgroup waits for another's epilogue.
    if (o_in_stage) {
      if constexpr (Cfg::kQBytes <= Cfg::kKVBytes)
        mbar_wait(q_empty(n), q_parity(n));
      else
        named_barrier_sync(1 + Cfg::kConsumers, Cfg::kConsumers * kWarpgroupThreads);
    }
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const int cb = j / 8, chunk = j % 8;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = thread_row0 + 8 * h;
        const uint32_t v = pack2<kDt>(o[0][j][2 * h], o[0][j][2 * h + 1]);
        st_shared_b32(o_tile + cb * col_block_bytes<kBM>() + swizzled_offset(r, chunk) + 4 * t, v);
      }
    }
    fence_proxy_async();
    named_barrier_sync(1 + c, kWarpgroupThreads);
    const bool late_release = kLateRelease && o_in_stage;
    if (ct == 0) {
      // A warpgroup whose rows lie before row 0 (a shifted first tile) stores nothing.
      if (wg_row0 < rows_out && wg_row0 >= row_first) {
#pragma unroll
        for (int cb = 0; cb < kCB; ++cb)
          tma_store_4d(&p.o_map, o_tile + cb * col_block_bytes<kBM>() + wg_row0 * kSwizzleRowBytes,
                       cb * kSwizzleCols, head, m0 + wg_row0, b, q_o_policy());
        tma_store_commit();
        if (!late_release) tma_store_wait_read();
      }
      if (!p.o_in_stage) mbar_arrive(q_empty(n));
      if (late_release) stored_stage = o_stage;
    }
    if (p.o_in_stage && !late_release) {
      named_barrier_sync(1 + c, kWarpgroupThreads);  // the store has read the staged O
      if (o_in_stage) {
        release_k(n_tiles - 1);
        release_v(n_tiles - 1);
      } else if (lane == 0) {
        mbar_arrive(q_empty(n));
      }
    }
    it0 += t_end - t_begin;
    if (!dynamic) cur = next_item(cur, wk);  // else from the next item's slot
  }
  release_stored();  // the last store reads shared memory until here
#endif  // JAXCRAFT_SM90A_ENABLED
}

template <DType kDt, int kHeadDim>
bool fwd_sm90_available() {
  static const bool yes =
      kernel_runs_sm90a(attn_fwd_sm90_kernel<kDt, typename FwdTiles<kHeadDim>::type>) &&
      encode_tiled_fn() != nullptr;
  return yes;
}

template <DType kDt, class Cfg, int kFeat = kPlain>
cudaError_t launch_fwd_sm90(const FwdArgs& a, cudaStream_t stream,
                            const CUtensorMap* bias_map = nullptr) {
  const ShapeArgs& s = a.shape;
  FwdSm90Args p;
  p.a = a;
  if (!encode_bshd(&p.q_map, a.q, kDt, s.batch, s.seqlen_q, s.num_heads, s.head_dim, Cfg::kBlockM) ||
      !encode_bshd(&p.k_map, a.k, kDt, s.batch, s.seqlen_k, s.num_kv_heads, s.head_dim, Cfg::kBlockN) ||
      !encode_bshd(&p.v_map, a.v, kDt, s.batch, s.seqlen_k, s.num_kv_heads, s.head_dim, Cfg::kBlockN) ||
      !encode_bshd(&p.o_map, a.o, kDt, s.batch, s.seqlen_q, s.num_heads, s.head_dim, kWgmmaM))
    return cudaErrorInvalidValue;
  auto* kernel = attn_fwd_sm90_kernel<kDt, Cfg, kFeat>;
  const int smem = kFeat == kPlain  ? Cfg::kSmemBytes
                   : kFeat == kBias ? Cfg::bias_smem_bytes(a.scores.bias_f32)
                                    : Cfg::kFeatSmemBytes;
  if (kFeat == kBias) {
    if (bias_map == nullptr || smem > 227 * 1024) return cudaErrorInvalidValue;
    p.bias_map = *bias_map;
  }
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const bool persistent =
      Cfg::kPersistent && (!a.mask.causal || s.seqlen_q <= Cfg::kCausalPersistRows);
  p.m_blocks = (s.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  // kBalancedPairs: causal launches take the pairs (in a fixed stride).
  const bool pairs = a.mask.causal && Cfg::kBalancedPairs;
  p.tile_counter = persistent && Cfg::kTileCounter && !pairs ? a.tile_counter : nullptr;
  // Whole warpgroups' rows (a TMA store at a negative row is an illegal
  // instruction; loads there read zeros): the last tile may still end past
  // the last row by less than 64.
  p.m_shift = p.tile_counter != nullptr && a.mask.causal && kFeat == kPlain
                  ? (p.m_blocks * Cfg::kBlockM - int(s.seqlen_q)) / kWgmmaM * kWgmmaM
                  : 0;
  p.paired = persistent && a.mask.causal && p.tile_counter == nullptr;
  p.o_in_stage = persistent && Cfg::kOInStage;
  p.kv_group = FastDivmod::make(s.num_heads / s.num_kv_heads);
  const int unit_tiles = p.paired ? (p.m_blocks + 1) / 2 : p.m_blocks;
  const int64_t units = int64_t(unit_tiles) * s.num_heads * s.batch;
  const int max_grid = persistent_grid_size();
  if (units + max_grid > INT32_MAX) return cudaErrorInvalidValue;
  p.units = static_cast<int>(units);
  // Each query head's tiles stream its KV head's K and V. Causal pairs
  // (tile i with tile m - 1 - i) all carry the same work, so tile-major
  // groups balance nothing there, and at head dims 128 and 256 head-major
  // order is faster: kernel alone, H100, D128 S512 causal 113-115 -> 106 us,
  // S1024 151 -> 141, S2048 238 -> 230, S4096 420 -> 413; D256 S512 127 ->
  // 119, S1024 147 -> 138, S2048 217 -> 209 (unpaired rows lost 4-8% with
  // it: D128 S8192, D256 S4096 and S8192). Head dim 64 (192-query tiles)
  // lost 14-28% at S512-S2048 and keeps the groups (docs/design.md).
  const bool head_major = p.paired && Cfg::kHeadDim >= 128;
  p.order = tile_order(unit_tiles, s.num_heads, s.batch,
                       head_major ? 1
                                  : tile_group(a.mask.causal, int64_t(s.seqlen_k) * s.head_dim * 4,
                                               int64_t(s.num_heads) * s.batch));
  const int grid = persistent ? std::min(p.units, max_grid) : p.units;
  if (p.tile_counter != nullptr &&
      (err = cudaMemsetAsync(p.tile_counter, 0, sizeof(uint32_t), stream)) != cudaSuccess)
    return err;
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

// FwdShortTiles apply up to 512 queries and keys where their query tiles
// leave fewer rows idle than FwdTiles' (T in (192, 256] and (384, 512] at
// head dim 64).
template <class Short, class Cfg>
bool short_tiles_pay(const ShapeArgs& s) {
  const auto rows = [&](int64_t tile) { return (s.seqlen_q + tile - 1) / tile * tile; };
  return s.seqlen_q <= 512 && s.seqlen_k <= 512 && rows(Short::kBlockM) < rows(Cfg::kBlockM);
}

template <DType kDt, int kHeadDim>
cudaError_t run_fwd_sm90(const FwdArgs& a, cudaStream_t stream) {
  using Cfg = typename FwdTiles<kHeadDim>::type;
  using Short = typename FwdShortTiles<kHeadDim>::type;
  switch (feature_level(a.mask, a.scores)) {
    case kPlain:
      if constexpr (!std::is_void_v<Short>)
        if (short_tiles_pay<Short, Cfg>(a.shape))
          return launch_fwd_sm90<kDt, Short, kPlain>(a, stream);
      return launch_fwd_sm90<kDt, Cfg, kPlain>(a, stream);
    case kMasks: return launch_fwd_sm90<kDt, Cfg, kMasks>(a, stream);
    case kDropout:
      return launch_fwd_sm90<kDt, typename FwdDropoutTiles<kHeadDim>::type, kDropout>(a, stream);
    default: {
      // The bias through TMA when it can be (features.cuh:
      // encode_bias_map) and its tiles fit, else read per element.
      using BiasCfg = typename FwdBiasTiles<kHeadDim>::type;
      CUtensorMap bias_map;
      if (a.scores.bias != nullptr &&
          BiasCfg::bias_smem_bytes(a.scores.bias_f32) <= 227 * 1024 &&
          encode_bias_map(&bias_map, a.scores, a.shape, kDt, BiasCfg::kBlockM))
        return launch_fwd_sm90<kDt, BiasCfg, kBias>(a, stream, &bias_map);
      return launch_fwd_sm90<kDt, typename FwdScoreTiles<kHeadDim>::type, kScores>(a, stream);
    }
  }
}

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
