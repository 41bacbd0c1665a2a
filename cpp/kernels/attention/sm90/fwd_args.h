// FwdSm90Args: the Hopper forward kernel's parameters (one
// __grid_constant__ block, built by launch_fwd_sm90).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/cuda/fast_divmod.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/sm90/tile_order.h"

namespace jaxcraft {
namespace attn {
namespace sm90 {

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

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
