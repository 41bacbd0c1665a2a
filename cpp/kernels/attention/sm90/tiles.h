// The Hopper attention kernels' tile and pipeline choices, by name. Each
// configuration derives from FwdTileDefaults or BwdTileDefaults and sets
// only what differs; FwdConfig and BwdConfig (fwd_config.cuh,
// bwd_config.cuh) derive sizes, register splits and shared-memory layouts
// from it. The traits after each part's configurations pick one per
// head-dim bucket and kernel instance; each configuration carries the
// measurement behind it (more in docs/design.md).
#pragma once

namespace jaxcraft {
namespace attn {
namespace sm90 {

template <class Tiles>
struct FwdConfig;
template <class Tiles>
struct BwdConfig;

// ---- Forward ----
// kConsumers warpgroups of 64 query rows each, kBlockN keys per tile, a
// kStages ring of K/V tiles.
// kOverlap: each warpgroup computes tile i + 1's scores and softmax while
// tile i's P V runs (needs a third ring stage, else the K/V load of tile
// i + 2, which can only start once P V of tile i has released its stage, is
// exposed: measured 513 -> 459 TFLOP/s at H128 with two stages, 614 with three).
// kPersistent: a persistent grid (one CTA per SM striding through the work
// items) without a causal mask, and with one when the queries are at most
// kCausalPersistRows (beyond that, one CTA per item measured faster).
// kQBufs = 2 (where shared memory has room): the Q tiles of consecutive
// work items alternate between two buffers, so the next item's Q loads while
// this item computes and stores its O, instead of after that store.
// kOInStage: in persistent launches, O is staged in the item's last K/V
// stage (once every consumer warpgroup is done with it) instead of the Q
// tile, so the Q tile is released for the next item as soon as this item's
// last S = Q K^T is in (measured +3-5% at S <= 1024; with one item per CTA
// the extra barrier cost 0-7%).
// kSplitKV: K and V of a stage arrive and are released on barriers of their
// own, K once the tile's scores are masked, V after its P V. The overlapped
// loop then needs only two stages: tile i + 2's K load waits for tile i's
// S = Q K^T, not for its P V (head dim 256, where a third stage does not fit).
// kStagger: the second consumer warpgroup issues an item's first product
// after the first has issued its own (a named barrier), so the two
// prologues' softmaxes do not both leave the tensor cores idle (plain
// instance; head dim 128: 2-4% at S <= 1024; at 256 it lost 2-7%).
// kSumByMma: the softmax's row sums come from the tensor cores (every
// instance but dropout's): P V runs with N = head dim + 8, B's extra 8
// columns reading a block of ones, so O's last accumulator columns hold
// each row's sum of P (rounded as P V uses it), rescaled with O. That drops
// one FADD per probability from the softmax, whose issue slots at head dim
// 64 cost about as much as the products (2-3% on full rows, docs/design.md).
// kHalfTiles: without the overlap, a warpgroup's last live key tile runs
// at half width (S = Q K^T with N = kBN / 2, P V over kBN / 2 keys) when
// its rows see none of the tile's second half: every other warpgroup on a
// causal diagonal when kBN is twice the warpgroup's 64 rows (head dim 64:
// S512 causal 3-5% faster, S1024 causal 2-3.5%, full rows up to 2.6% slower,
// docs/design.md).
// kBalancedPairs: causal launches run pairs (query tile r, then tile
// m - 1 - r of the same head; a fixed stride, not the tile counter), and in
// the upper tile the warpgroups take their rows in reverse order. On a
// causal diagonal a tile's later warpgroups see more key tiles than its
// first; reversed in one tile of the pair, every warpgroup sees the same
// number over the pair, and the ring, which moves at its slowest
// warpgroup's pace, idles none (head dim 64 at S512 causal: 9 key tiles
// each, where a tile cost its slowest warpgroup's 4 and 8; 7% faster kernel
// alone, docs/design.md).
struct FwdTileDefaults {
  static constexpr int kStages = 2;
  static constexpr bool kOverlap = false;
  static constexpr bool kPersistent = false;
  static constexpr int kQBufs = 1;
  static constexpr int kCausalPersistRows = 0;
  static constexpr bool kOInStage = false;
  static constexpr bool kSplitKV = false;
  static constexpr bool kStagger = false;
  static constexpr bool kSumByMma = false;
  static constexpr bool kHalfTiles = false;
  static constexpr bool kBalancedPairs = false;
};

// Measured in the standalone variants (docs/design.md): two Q buffers and a
// third stage at head dim 64 (+7-16% at S <= 2048), a causal persistent grid
// up to 4096 queries at 64 and 128 (+3-35%; a 1-2% loss beyond), split K/V
// barriers and the overlapped loop at head dim 256 (+3-11%; at 64 and 128
// the split alone changed nothing), and with them a causal persistent grid
// up to 2048 queries there (+3-7%; without the overlap it lost 1-3%).
struct FwdPlain64 : FwdTileDefaults {
  static constexpr int kHeadDim = 64, kConsumers = 3, kBlockN = 128, kStages = 3;
  static constexpr bool kPersistent = true, kSumByMma = true, kHalfTiles = true;
  static constexpr int kQBufs = 2, kCausalPersistRows = 4096;
};
struct FwdPlain128 : FwdTileDefaults {
  static constexpr int kHeadDim = 128, kConsumers = 2, kBlockN = 128, kStages = 3;
  static constexpr bool kOverlap = true, kPersistent = true, kOInStage = true, kStagger = true;
  static constexpr int kCausalPersistRows = 4096;
};
struct FwdPlain256 : FwdTileDefaults {
  static constexpr int kHeadDim = 256, kConsumers = 2, kBlockN = 64;
  static constexpr bool kOverlap = true, kPersistent = true, kOInStage = true, kSplitKV = true;
  static constexpr int kCausalPersistRows = 2048;
};
// Head dim 64's plain instance on short rows: four consumer warpgroups (256
// query rows) over 64-key tiles (at 112 registers, 128-key score tiles spill
// 860 bytes). S512 full 2.4% and causal 2.8% faster than FwdPlain64 kernel
// alone, where 192-row tiles compute 576 rows for 512 (causal 9% with the
// balanced pairs); from S1024 on twice the key tiles' softmax and barrier
// steps lose 1-14% (H200, docs/design.md). Two-warpgroup 128-row tiles
// lost 14-22% at S512. (Head dim 64 under a causal mask up to 2048 queries
// took 128-query tiles and the overlapped loop until each warpgroup skipped
// the tiles past its rows' last key; since then the 192-query tiles are
// 5-8% faster there.)
struct FwdShort64 : FwdTileDefaults {
  static constexpr int kHeadDim = 64, kConsumers = 4, kBlockN = 64, kStages = 6;
  static constexpr bool kPersistent = true, kSumByMma = true, kBalancedPairs = true;
  static constexpr int kQBufs = 2, kCausalPersistRows = 4096;
};
// kScores instances at head dim 64: FwdPlain64's 160-register consumers have
// no room for the bias loads; two consumers, one CTA per item.
struct FwdScores64 : FwdTileDefaults {
  static constexpr int kHeadDim = 64, kConsumers = 2, kBlockN = 128;
};
// kBias instances at head dim 128 (the bias tile rides in each ring stage):
// 64-key tiles keep three stages.
struct FwdBias128 : FwdTileDefaults {
  static constexpr int kHeadDim = 128, kConsumers = 2, kBlockN = 64, kStages = 3;
  static constexpr bool kOverlap = true;
};
// kDropout instances: the keep test's Philox rounds need the registers the
// overlapped loop holds for the next tile, so head dims 128 and 256 run
// without it (at 256 it spilled 28 bytes).
struct FwdDropout128 : FwdTileDefaults {
  static constexpr int kHeadDim = 128, kConsumers = 2, kBlockN = 128;
};
struct FwdDropout256 : FwdTileDefaults {
  static constexpr int kHeadDim = 256, kConsumers = 2, kBlockN = 64;
  static constexpr bool kPersistent = true, kOInStage = true;
};

template <int kHeadDim>
struct FwdTiles;
template <>
struct FwdTiles<64> { using type = FwdConfig<FwdPlain64>; };
template <>
struct FwdTiles<128> { using type = FwdConfig<FwdPlain128>; };
template <>
struct FwdTiles<256> { using type = FwdConfig<FwdPlain256>; };
template <int kHeadDim>
struct FwdShortTiles {
  using type = void;
};
template <>
struct FwdShortTiles<64> { using type = FwdConfig<FwdShort64>; };
template <int kHeadDim>
struct FwdScoreTiles : FwdTiles<kHeadDim> {};
template <>
struct FwdScoreTiles<64> { using type = FwdConfig<FwdScores64>; };
template <int kHeadDim>
struct FwdBiasTiles : FwdScoreTiles<kHeadDim> {};
template <>
struct FwdBiasTiles<128> { using type = FwdConfig<FwdBias128>; };
template <int kHeadDim>
struct FwdDropoutTiles : FwdScoreTiles<kHeadDim> {};
template <>
struct FwdDropoutTiles<128> { using type = FwdConfig<FwdDropout128>; };
template <>
struct FwdDropoutTiles<256> { using type = FwdConfig<FwdDropout256>; };

// ---- Backward ----
// Two consumer warpgroups; one CTA per key tile of a KV head, stepping
// through kBlockM-query steps from a kStages ring of Q/dO tiles.
// dQ = dS K: with kDqByKeys each warpgroup multiplies its own 64 keys (no
// barrier between warpgroups, twice the fp32 atomics); otherwise the two
// split dQ's 64-column blocks over all 128 keys after a barrier (head dim
// 64, one block: they take turns by step).
// kSplitD (head dim 256, where 64 keys x 256 columns of dK plus dV would be
// 256 registers per thread): both warpgroups take the same 64 keys and own
// half the columns of dK, dV and dQ each. Each computes S^T and dP^T for
// half the step's queries (N = 32), and P^T and dS^T meet in shared memory
// for the dV and dK products (SS wgmma) after a barrier. (Both computing
// all of S^T and dP^T, with P^T and dS^T from registers, spent 7 GEMM
// units of tensor work where 5 suffice.)
// kDqTma (dQ split by columns): each warpgroup writes its 64 x 64 dQ block
// to its own float32 tile in shared memory and one thread adds it into
// dq_accum with TMA bulk reductions, in place of 16-32 red.add per thread
// (their issue and address arithmetic took a quarter of the H128 kernel's
// warp samples under ncu).
// kDqInStage (with kDqTma, where there is no room for dQ tiles of their own:
// kSplitD, the kBias instances): once both warpgroups are done with the
// step's Q and dO tiles, dQ is staged in them (a warpgroup's columns in one
// tile, or the turn's block across both), and the stage is released when
// the reductions have read it.
// kBlockM = 128 (kDqByRows; head dim 64, plain instance): 128 queries per
// step, and each warpgroup takes 64 query rows of the step's dQ over all
// 128 keys, so both compute dQ every step and no turn is taken (each a
// step late, on mbarriers instead of a barrier between the warpgroups: see
// ds_full in the kernel). At head dim 64 a 64-query step is short (each
// product 64 x 64 x 64) and its fixed costs (ring wait, lse/delta loads,
// the dS^T barrier, a dQ reduction) weigh more. The visibility bitmask of
// the feature instances holds 64 queries, so they keep kBlockM = 64.
struct BwdTileDefaults {
  static constexpr int kStages = 2;
  static constexpr bool kDqByKeys = false;
  static constexpr bool kSplitD = false;
  static constexpr bool kDqTma = false;
  static constexpr bool kDqInStage = false;
  static constexpr int kBlockM = 64;
};

// Head dim 128 fits the TMA dQ tiles with a 2-stage ring (3 stages measure
// the same); so does head dim 64 with 128-query steps.
struct BwdPlain64 : BwdTileDefaults {
  static constexpr int kHeadDim = 64, kBlockM = 128;
  static constexpr bool kDqTma = true;
};
struct BwdPlain128 : BwdTileDefaults {
  static constexpr int kHeadDim = 128;
  static constexpr bool kDqTma = true;
};
struct BwdPlain256 : BwdTileDefaults {
  static constexpr int kHeadDim = 256;
  static constexpr bool kDqByKeys = true, kSplitD = true, kDqTma = true, kDqInStage = true;
};
// Segment ids, the boolean mask, soft cap and dropout (kMasks, kScores,
// kDropout) at head dim 64: 64-query steps (their visibility bits cover 64
// queries), three stages.
struct BwdFeature64 : BwdTileDefaults {
  static constexpr int kHeadDim = 64, kStages = 3;
  static constexpr bool kDqTma = true;
};
// kBias instances: the bias tiles take the room of the TMA dQ tiles (head
// dim 64 and 128: dQ goes through the stage); head dim 256 has no room for
// them (its bias is read per element, kScores).
struct BwdBias64 : BwdTileDefaults {
  static constexpr int kHeadDim = 64, kStages = 3;
  static constexpr bool kDqTma = true, kDqInStage = true;
};
struct BwdBias128 : BwdTileDefaults {
  static constexpr int kHeadDim = 128;
  static constexpr bool kDqTma = true, kDqInStage = true;
};

template <int kHeadDim>
struct BwdTiles;
template <>
struct BwdTiles<64> { using type = BwdConfig<BwdPlain64>; };
template <>
struct BwdTiles<128> { using type = BwdConfig<BwdPlain128>; };
template <>
struct BwdTiles<256> { using type = BwdConfig<BwdPlain256>; };
template <int kHeadDim>
struct BwdFeatureTiles : BwdTiles<kHeadDim> {};
template <>
struct BwdFeatureTiles<64> { using type = BwdConfig<BwdFeature64>; };
template <int kHeadDim>
struct BwdBiasTiles : BwdTiles<kHeadDim> {};
template <>
struct BwdBiasTiles<64> { using type = BwdConfig<BwdBias64>; };
template <>
struct BwdBiasTiles<128> { using type = BwdConfig<BwdBias128>; };

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
