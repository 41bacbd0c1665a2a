// Host side of the TMA copies: encodes a [B, L, heads, head_dim] tensor as a
// 4-D tensor map whose box is rows x 128 bytes of one head, 128-byte
// swizzled (the layout hopper.cuh's descriptors read). Encoding is a pure
// host computation (no device call, no sync), so it is safe inside a CUDA
// graph capture; the map travels to the kernel by value.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/sm90/hopper.cuh"

namespace jaxcraft {
namespace attn {
namespace sm90 {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver entry point, looked up once through the runtime so the library
// needs no link-time dependency on libcuda.
inline EncodeTiledFn encode_tiled_fn() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// Tensor [batch, seqlen, heads, head_dim] (row-major, elem_bytes per
// element); box of box_rows sequence positions x 128 bytes of one head.
// Out-of-bounds elements read as zero and are skipped on stores and
// reductions.
inline bool encode_bshd_typed(CUtensorMap* map, const void* base, CUtensorMapDataType type,
                              int elem_bytes, int64_t batch, int64_t seqlen, int64_t heads,
                              int64_t head_dim, int box_rows) {
  const EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr) return false;
  const int64_t e = elem_bytes;
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(seqlen),
                              cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(head_dim * e), cuuint64_t(heads * head_dim * e),
                                 cuuint64_t(seqlen * heads * head_dim * e)};
  const cuuint32_t box[4] = {cuuint32_t(kSwizzleRowBytes / elem_bytes), 1, cuuint32_t(box_rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, type, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// 16-bit operands: boxes of 64 columns.
inline bool encode_bshd(CUtensorMap* map, const void* base, DType dt, int64_t batch,
                        int64_t seqlen, int64_t heads, int64_t head_dim, int box_rows) {
  const CUtensorMapDataType type = dt == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode_bshd_typed(map, base, type, 2, batch, seqlen, heads, head_dim, box_rows);
}

// float32 accumulators (dq_accum): boxes of 32 columns.
inline bool encode_bshd_f32(CUtensorMap* map, const float* base, int64_t batch, int64_t seqlen,
                            int64_t heads, int64_t head_dim, int box_rows) {
  return encode_bshd_typed(map, base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, batch, seqlen, heads,
                           head_dim, box_rows);
}

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
