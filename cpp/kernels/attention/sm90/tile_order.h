// The order in which the Hopper kernels' CTAs take their work items (a
// query or key tile of one head of one batch element) from the launch grid
// (tiles, heads, batch).
//
// Head-major (group 1, the grid's own order): the tiles of one head run
// together, so its K/V (forward) or Q/dO (backward) are read from L2 by all
// of them. Under a causal mask the tiles' work differs up to the sequence's
// length in key (query) tiles, and head-major leaves the largest tiles of
// the last heads for the last wave while other SMs idle. Tile-major within
// groups of `group` heads runs the largest tiles of a group first and the
// smallest last, and the group's data still fits in L2. A list-scheduling
// model of D64 S2048 causal, 132 SMs, gives 87% -> 94% busy (forward) and
// 91% -> 96% (backward). The launchers narrow the groups where that balance
// costs more than it gives: the forward's causal pairs (equal work) run
// head-major at head dims 128 and 256, the backward caps its groups at 16
// heads (4 at S512); short rows read their K/V (Q/dO) in bursts otherwise.
// The backward widens groups of fewer tiles than SMs (grouped KV heads).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/fast_divmod.h"

namespace jaxcraft {
namespace attn {
namespace sm90 {

// L2 room for one group's streamed tensors (the H100 has 50 MB of L2).
constexpr int64_t kTileGroupBytes = int64_t(16) << 20;

// Heads per tile-major group: 1 (head-major) without a causal mask, else as
// many as keep `bytes_per_head` each within kTileGroupBytes.
inline int tile_group(bool causal, int64_t bytes_per_head, int64_t heads_total) {
  if (!causal || bytes_per_head <= 0) return 1;
  const int64_t group = kTileGroupBytes / bytes_per_head;
  return static_cast<int>(group < 1 ? 1 : group < heads_total ? group : heads_total);
}

struct TileItem {
  int rank;  // 0 first: the tile with the most work under a causal mask
  int head, batch;
};

// Work item idx of `tiles` x `heads` x `batches` (tiles fastest), read as
// tile-major within groups of `group` (head, batch) pairs; the last group
// may be smaller. Built on the host (tile_order below).
struct TileOrder {
  FastDivmod group_tiles;  // items per full group
  FastDivmod group, last;  // (head, batch) pairs per full group, in the last group
  FastDivmod heads;
  int last_chunk;          // index of the last group
};

inline TileOrder tile_order(int tiles, int heads, int batches, int group) {
  const uint32_t members = uint32_t(heads) * uint32_t(batches);
  TileOrder o;
  o.group_tiles = FastDivmod::make(uint32_t(group) * uint32_t(tiles));
  o.group = FastDivmod::make(uint32_t(group));
  o.last_chunk = static_cast<int>((members - 1) / uint32_t(group));
  o.last = FastDivmod::make(members - uint32_t(o.last_chunk) * uint32_t(group));
  o.heads = FastDivmod::make(uint32_t(heads));
  return o;
}

// Multiply-shift divisions only: the persistent forward decodes each work
// item it takes, on the item's critical path, where 64-bit divisions cost
// 3-11% at S <= 1024 (docs/design.md). The launchers keep idx below 2^31.
__device__ __forceinline__ TileItem tile_item_at(int idx, const TileOrder& o) {
  uint32_t chunk, within, rank, in_group, batch, head;
  o.group_tiles.divmod(idx, chunk, within);
  const FastDivmod size = int(chunk) == o.last_chunk ? o.last : o.group;
  size.divmod(within, rank, in_group);
  o.heads.divmod(chunk * o.group.divisor + in_group, batch, head);
  return TileItem{int(rank), int(head), int(batch)};
}

// This CTA's work item when the launch grid is (tiles, heads, batch).
__device__ __forceinline__ TileItem tile_item(const TileOrder& o) {
  return tile_item_at(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), o);
}

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
