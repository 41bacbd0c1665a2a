// BwdSm90Args: the Hopper backward kernel's parameters (one
// __grid_constant__ block, built by launch_bwd_sm90).
#pragma once
#include <cuda.h>

#include "kernels/attention/kernel_args.h"
#include "kernels/attention/sm90/tile_order.h"

namespace jaxcraft {
namespace attn {
namespace sm90 {

struct BwdSm90Args {
  CUtensorMap q_map, do_map;   // box kBlockM rows
  CUtensorMap k_map, v_map;    // box 128 rows
  CUtensorMap dk_map, dv_map;  // box 64 rows (one consumer warpgroup)
  CUtensorMap dq_map;          // kDqTma: dq_accum, float32, box kDqRows x 32 columns
  BwdArgs a;
  CUtensorMap bias_map;  // kBias instances: box 64 query rows x 128 bytes of keys
  // kBias with one writer per dbias element in the bias's dtype: each step's
  // dS goes into the stage's bias tile (same layout) and out by TMA store;
  // the kernel then writes every element (no memset).
  CUtensorMap dbias_map;
  int dbias_tma;
  TileOrder order;  // of the launch grid (tile_order.h)
};

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
