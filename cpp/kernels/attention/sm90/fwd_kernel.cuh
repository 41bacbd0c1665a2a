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
// The parts: FwdConfig (fwd_config.cuh), FwdSm90Args (fwd_args.h), FwdSmem
// (fwd_smem.cuh), FwdScheduler (fwd_scheduler.cuh), FwdProducer
// (fwd_producer.cuh), the consumers' FwdItem and ring steps
// (fwd_consumer_item.cuh), FwdKeyTile (fwd_key_tile.cuh), FwdScoreFeatures
// (fwd_score_features.cuh) and fwd_epilogue (fwd_epilogue.cuh). The
// consumer's loop over key tiles stays in the kernel, and the parts take the
// kernel's values as reference arguments or, where they act on one key
// tile, hold references to the loop's variables: nvcc compiled other
// arrangements to different code (the loop in a function of its own
// hoisted other values out of the work-item loop and changed most of the
// head-dim-128 plain instance's SASS; values held in the parts' members cost
// a mask's parameter loads their speculation, and the head-dim-256 bias
// instance 52 bytes of spills).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/sm90/entry.h"
#include "kernels/attention/sm90/features.cuh"
#include "kernels/attention/sm90/fwd_args.h"
#include "kernels/attention/sm90/fwd_config.cuh"
#include "kernels/attention/sm90/fwd_consumer_item.cuh"
#include "kernels/attention/sm90/fwd_epilogue.cuh"
#include "kernels/attention/sm90/fwd_key_tile.cuh"
#include "kernels/attention/sm90/fwd_producer.cuh"
#include "kernels/attention/sm90/fwd_scheduler.cuh"
#include "kernels/attention/sm90/fwd_smem.cuh"
#include "kernels/attention/sm90/hopper.cuh"
#include "kernels/attention/sm90/tensor_map.h"
#include "kernels/attention/sm90/tile_order.h"
#include "kernels/attention/sm90/tiles.h"

namespace jaxcraft {
namespace attn {
namespace sm90 {

// kFeat (features.cuh): kPlain, or the instances that add segment ids and
// the boolean mask (kMasks), also soft cap and bias (kScores, kBias), and
// also dropout (kDropout), each a run-time branch inside them. The plain
// instance compiles none of that.
template <DType kDt, class Cfg, int kFeat = kPlain>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ FwdSm90Args p) {
#ifdef JAXCRAFT_SM90A_ENABLED
  extern __shared__ unsigned char smem_raw[];
  const FwdSmem<Cfg> sm(smem_raw, p.a.scores.bias_f32);
  const int tid = threadIdx.x;
  // Broadcast from lane 0 so that ptxas knows it is warp-uniform: values
  // derived from it (the warpgroup's rows, its loop bounds) stay on the
  // uniform datapath (SASS: 43 R2UR moves in the head-dim-128 kernel -> 8;
  // measured 1.5-3.5% faster).
  const int wg = __shfl_sync(0xffffffffu, tid / kWarpgroupThreads, 0);
  sm.template init<kDt, kFeat>(tid, p.o_in_stage);
  __syncthreads();

  const FwdScheduler<Cfg, kFeat> sched(p);
  if (wg == 0) {
    FwdProducer<Cfg, kFeat>::run(p, sm, sched, tid);
    return;
  }

  setmaxnreg_inc<Cfg::kConsumerRegs>();
  constexpr int kBN = Cfg::kBlockN;
  using KeyTile = FwdKeyTile<kDt, Cfg, kFeat>;
  using Features = FwdScoreFeatures<kDt, Cfg, kFeat>;
  constexpr bool kSumByMma = KeyTile::kSumByMma;
  const FwdConsumerThread th(tid, wg);
  const int c = th.c, lane = th.lane;
  FwdLateRelease<Cfg, kFeat> late;
  int it0 = 0, n = 0;  // ring uses before this work item; items done
  for (FwdCursor cur{int(blockIdx.x), 0};; ++n) {
    if (sched.dynamic) {
      mbar_wait(sm.slot_full(n), sm.q_parity(n));
      cur = sched.read_slot(sm, n);
    }
    if (cur.unit >= p.units) break;
    const FwdWork wk = sched.work_at(p, cur);
    const int m0 = wk.m0, rows_valid = wk.rows_valid, row_first = wk.row_first;
    const int t_begin = wk.t_begin, t_end = wk.t_end;
    const SeqLens lens = wk.lens;
    // kBalancedPairs: a causal pair's upper tile takes the rows in reverse.
    const bool reversed = Cfg::kBalancedPairs && p.paired && 2 * wk.rank + 1 < p.m_blocks;
    const int wg_row0 = (reversed ? Cfg::kConsumers - 1 - c : c) * kWgmmaM;  // first tile row
    const FwdItem item{n,         it0,        m0,    wk.head, wk.b,    rows_valid,
                       row_first, t_begin,    t_end, lens,    wg_row0, wg_row0 + th.w * 16 + th.g};
    typename KeyTile::OAcc o;
    float row_max[1][2] = {{-INFINITY, -INFINITY}}, row_sum[1][2] = {{0.f, 0.f}};
#pragma unroll
    for (int j = 0; j < KeyTile::kOTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[0][j][e] = 0.f;
    const float scale_log2 = p.a.scale * kLog2e;
    const bool prescale = scale_log2 <= 0.f;
    bool transform = prescale;
    if constexpr (kFeat >= kScores) transform |= p.a.scores.softcap > 0.f || p.a.scores.bias != nullptr;
    const float softmax_scale = transform ? 1.f : scale_log2;
    const FwdScale scale{scale_log2, prescale, transform, softmax_scale};
    [[maybe_unused]] int row_id[2] = {0, 0};
    [[maybe_unused]] int row_id_lo = 0, row_id_hi = 0;
    Features::load_row_ids(p, item, row_id, row_id_lo, row_id_hi);
    const Features features{p, sm, th, item, row_id, row_id_lo, row_id_hi};
    typename KeyTile::Scores sc;
    typename KeyTile::Probs pa;
    KeyTile tile{p, sm, th, item, o, scale, features, sc, pa};

    mbar_wait(sm.q_full(n), sm.q_parity(n));
    const int n_tiles = t_end - t_begin;
    const FwdItemSteps<Cfg, kFeat> steps{n, it0, lane, n_tiles, p.o_in_stage && n_tiles > 0};
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
      key_range(p.a.mask, m0 + wg_first, m0 + wg_end - 1, lens.kv_len, &wg_lo, &wg_hi);
      n_live = min(n_tiles, max(0, (wg_hi - t_begin * kBN + kBN - 1) / kBN));
      last_keys = wg_hi - (t_begin + n_live - 1) * kBN;
    }
    if constexpr (!Cfg::kOverlap) {
      auto step = [&](int it, auto& slab) {
        constexpr int kN = kSlabKeys<decltype(slab)>;
        sm.ring.wait_full(it0 + it);
        tile.issue_scores_into(it, slab);
        if (it == 0) late.release(sm);
        wgmma_wait<0>();
        steps.q_read(sm, it);
        tile.mask_slab_scores(t_begin + it, slab);
        steps.keys_read(sm, it);
        float corr[1][2];
        if (online_softmax_step<!kSumByMma>(slab, row_max, row_sum, corr, softmax_scale))
          rescale_rows(o, corr);
        features.drop(sc, t_begin + it);
        tile.pack_slab(slab);
        tile.issue_pv_keys(it, std::integral_constant<int, kN>{});
        wgmma_wait<0>();
        fence_operands(o[0]);
        steps.values_read(sm, it);
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
      sm.ring.wait_full(it0);
      tile.issue_scores(0);
      stagger_first();
      late.release(sm);
      wgmma_wait<0>();
      steps.q_read(sm, 0);
      tile.mask_scores(t_begin);
      steps.keys_read(sm, 0);
      float corr[1][2];
      online_softmax_step<!kSumByMma>(sc, row_max, row_sum, corr, softmax_scale);  // O is still 0
      features.drop(sc, t_begin);
      tile.pack_probs();
    }
    if (n_live == 0) stagger_first();
    for (int it = 1; Cfg::kOverlap && it < n_live; ++it) {
      sm.ring.wait_full(it0 + it);
      tile.issue_scores(it);
      tile.issue_pv(it - 1);
      wgmma_wait<1>();
      steps.q_read(sm, it);
      tile.mask_scores(t_begin + it);
      steps.keys_read(sm, it);
      float corr[1][2];
      const bool rescale = online_softmax_step<!kSumByMma>(sc, row_max, row_sum, corr, softmax_scale);
      features.drop(sc, t_begin + it);
      wgmma_wait<0>();
      fence_operands(o[0]);
      steps.release_v(sm, it - 1);
      if (rescale) rescale_rows(o, corr);
      tile.pack_probs();
    }
    if (Cfg::kOverlap && n_live > 0) {
      tile.issue_pv(n_live - 1);
      wgmma_wait<0>();
      fence_operands(o[0]);
      steps.values_read(sm, n_live - 1);
    }
    // The previous item's O stage first (a no-op after a live tile): the
    // producer may need it to fill the tiles waited for below (without
    // this, the check with 3 persistent CTAs hung).
    late.release(sm);
    for (int it = n_live; it < n_tiles; ++it) {  // the ring's phases stay in step
      sm.ring.wait_full(it0 + it);
      steps.q_read(sm, it);
      steps.keys_read(sm, it);
      if constexpr (Cfg::kSplitKV) sm.vring.wait_full(it0 + it);
      steps.values_read(sm, it);
    }

    fwd_epilogue<kDt>(p, sm, th, item, steps, o, row_max, row_sum, late);
    it0 += t_end - t_begin;
    if (!sched.dynamic) cur = sched.next_item(p, cur, wk);  // else from the next item's slot
  }
  late.release(sm);  // the last store reads shared memory until here
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
