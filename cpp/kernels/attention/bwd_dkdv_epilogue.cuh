// store_dkdv: the portable dK/dV kernel's epilogue. Once every warp is done
// with K and V, dK (times the softmax scale) and dV go as 16-bit values
// through the K and V tiles to global memory in 16-byte stores.
#pragma once
#include <cstdint>

#include "common/cuda/cp_async.cuh"
#include "contract/dtype.h"
#include "kernels/attention/bwd_dkdv_shape.cuh"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/smem_tile.cuh"

namespace jaxcraft {
namespace attn {

// The arguments refer to the kernel's variables, as a lambda's captures
// would. The rows from keys_valid to keys_out
// (keys past the sequence's length) get zeros.
template <DType kDt, class Sh>
__device__ __forceinline__ void store_dkdv(const BwdArgs& a,
                                           const float (&dk)[Sh::kHCols / kMmaN][4],
                                           const float (&dv)[Sh::kHCols / kMmaN][4],
                                           typename ElemOf<kDt>::type* const& k_tile,
                                           typename ElemOf<kDt>::type* const& v_tile,
                                           const int& key_r0, const int& part, const int& lane,
                                           const int& tid, const int64_t& kv_off,
                                           const int64_t& kv_row_stride, const int& keys_out,
                                           const int& keys_valid) {
  using Elem = typename ElemOf<kDt>::type;
  constexpr int kBN = Sh::kBlockN, kHeadDim = Sh::kHeadDim, kThreads = Sh::kThreads;
  constexpr int kStride = Sh::kStride;
  const ShapeArgs& sh = a.shape;
  cp_async_wait<0>();
  __syncthreads();

  // K and V are dead: stage dK and dV through their tiles for 16-byte stores.
  const int hc0 = part * Sh::kHCols;
  store_acc_slab<kDt>(k_tile, kStride, key_r0, hc0, dk, a.scale, lane);
  store_acc_slab<kDt>(v_tile, kStride, key_r0, hc0, dv, 1.f, lane);
  __syncthreads();
  store_tile<kBN, kHeadDim, kThreads>(static_cast<Elem*>(a.dk) + kv_off, kv_row_stride, k_tile,
                                      keys_out, keys_valid, sh.head_dim, tid);
  store_tile<kBN, kHeadDim, kThreads>(static_cast<Elem*>(a.dv) + kv_off, kv_row_stride, v_tile,
                                      keys_out, keys_valid, sh.head_dim, tid);
}

}  // namespace attn
}  // namespace jaxcraft
