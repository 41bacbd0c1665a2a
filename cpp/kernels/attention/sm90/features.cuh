// Per-element attention features for the Hopper kernels' feature instances
// (FeatureLevel below): segment ids, the boolean mask, logit soft cap and
// additive bias (contract/attention.h: AttentionMask, AttentionScores). The plain
// instances never include any of this, so their registers and wgmma
// schedule stay as they are.
//
// Both kernels hold a warp's scores as C fragments: 16 "rows" (g and g + 8 of
// each thread; queries in the forward, keys in the backward) times the
// tile's columns 8 j + 2 t + {0, 1}. The rows' segment ids stay in
// registers for the whole CTA, with the warp's min and max; the columns'
// ids and their min and max come through the ring stage, written by the
// producer warp. From the two ranges each tile is classified as fully
// visible (one segment everywhere: no per-element test), fully hidden (the
// ranges do not meet) or mixed (per-element compare, in a rolled loop);
// exact for any ids, sorted or not.
#pragma once
#include <climits>
#include <cmath>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_mods.cuh"
#include "kernels/attention/sm90/tensor_map.h"
#include "kernels/attention/softmax.cuh"

namespace jaxcraft {
namespace attn {
namespace sm90 {

// Which instance of a kernel (entry.h: feature_level picks it).
enum FeatureLevel : int {
  kPlain = 0,   // lengths, causal and window masks only
  kMasks = 1,   // + segment ids and the boolean mask
  kScores = 2,  // + soft cap and bias (bias read per element from global memory)
  kBias = 3,    // the bias tiles loaded by TMA into the ring stages (backward: no soft cap)
  kDropout = 4, // kScores + dropout
};

// Four lanes (lane ^ k * lane_stride, k = 0..3) hold the rows i = 0..3 of a
// 4 x 4 word matrix in r; afterwards lane i holds column i (r[k] = row k's
// word i). Two xor-shuffle stages of four shuffles each.
__device__ __forceinline__ void transpose4(uint32_t (&r)[4], int i, int lane_stride) {
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {
    uint32_t nr[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t recv = __shfl_xor_sync(0xffffffffu, r[k ^ m], m * lane_stride);
      nr[k] = (k & m) == (i & m) ? r[k] : recv;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) r[k] = nr[k];
  }
}

__device__ __forceinline__ int warp_min(int v) { return __reduce_min_sync(0xffffffffu, v); }
__device__ __forceinline__ int warp_max(int v) { return __reduce_max_sync(0xffffffffu, v); }

// How a warp's segment ids meet a tile's.
enum SegmentCover : int { kSegMixed = 0, kSegAllVisible = 1, kSegAllHidden = 2 };

__device__ __forceinline__ int segment_cover(int row_lo, int row_hi, int col_lo, int col_hi) {
  if (col_lo > row_hi || col_hi < row_lo) return kSegAllHidden;
  if (row_lo == row_hi && col_lo == col_hi && row_lo == col_lo) return kSegAllVisible;
  return kSegMixed;
}

// Bias element (row i, column k) of the row whose element offset is `row_at`
// (b * stride_b + n * stride_n + i * S), as float.
template <DType kDt>
__device__ __forceinline__ float bias_at(const void* bias, bool f32, long long at) {
  if (f32) return static_cast<const float*>(bias)[at];
  using E = typename ElemOf<kDt>::type;
  const E v = static_cast<const E*>(bias)[at];
  if constexpr (kDt == DType::kBF16)
    return __bfloat162float(v);
  else
    return __half2float(v);
}

// Bias elements `at` and `at` + 1 as floats, in one 4-byte (16-bit bias) or
// 8-byte (float32) load; callers check bias_pairs_aligned and keep `at` even.
template <DType kDt>
__device__ __forceinline__ float2 bias_pair(const void* bias, bool f32, long long at) {
  if (f32) return *reinterpret_cast<const float2*>(static_cast<const float*>(bias) + at);
  using E = typename ElemOf<kDt>::type;
  const unsigned w = *reinterpret_cast<const unsigned*>(static_cast<const E*>(bias) + at);
  return unpack2<kDt>(w);
}

// True when every (row start + even key) bias offset is pair-aligned.
__device__ __forceinline__ bool bias_pairs_aligned(const ScoreArgs& sc, int seqlen_k) {
  const unsigned long long align = sc.bias_f32 ? 8 : 4;
  return reinterpret_cast<unsigned long long>(sc.bias) % align == 0 && seqlen_k % 2 == 0 &&
         sc.bias_stride_b % 2 == 0 && sc.bias_stride_n % 2 == 0;
}

// Logit transform: x = scale * s, then the soft cap when cap > 0.
__device__ __forceinline__ float capped_logit(float s, float scale, float cap, float inv_cap) {
  const float x = s * scale;
#ifdef JAXCRAFT_SM90_TANHF
  return cap > 0.f ? cap * tanhf(x * inv_cap) : x;
#else
  return cap > 0.f ? soft_cap_fast(x, cap, inv_cap) : x;
#endif
}

// Host: the bias (contract/attention.h: laid out like [B or 1, N or 1, T, S]) as a 4-D
// tensor map {S, T, N or 1, B or 1}, box of 128 bytes of keys x box_rows
// rows, 128-byte swizzled like the other tiles. False when TMA cannot
// address it (16-byte alignment of the base and of every stride); the
// caller then reads the bias per element instead.
inline bool encode_bias_map(CUtensorMap* map, const ScoreArgs& sc, const ShapeArgs& s, DType dt,
                            int box_rows) {
  const EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr || sc.bias == nullptr) return false;
  const uint64_t es = sc.bias_f32 ? 4 : 2;
  const uint64_t row = uint64_t(s.seqlen_k) * es, plane = row * uint64_t(s.seqlen_q);
  const uint64_t nb = sc.bias_stride_n ? s.num_heads : 1, bb = sc.bias_stride_b ? s.batch : 1;
  const uint64_t sn = sc.bias_stride_n ? uint64_t(sc.bias_stride_n) * es : plane;
  const uint64_t sb = sc.bias_stride_b ? uint64_t(sc.bias_stride_b) * es : plane * nb;
  if (reinterpret_cast<uintptr_t>(sc.bias) % 16 != 0 || row % 16 != 0 || sn % 16 != 0 ||
      sb % 16 != 0 || sc.bias_stride_n < 0 || sc.bias_stride_b < 0)
    return false;
  const cuuint64_t dims[4] = {cuuint64_t(s.seqlen_k), cuuint64_t(s.seqlen_q), nb, bb};
  const cuuint64_t strides[3] = {row, sn, sb};
  const cuuint32_t box[4] = {cuuint32_t(kSwizzleRowBytes / es), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = sc.bias_f32            ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : dt == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 4, const_cast<void*>(sc.bias), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Shared address of bias element (row r, key c) in a
// TMA-loaded tile of `rows` rows (128-byte swizzled blocks of 64 16-bit or
// 32 float32 keys). With c even, keys c and c + 1 are adjacent there.
__device__ __forceinline__ uint32_t bias_tile_addr(uint32_t tile, int rows, bool f32, int r, int c) {
  const int bytes = f32 ? 4 * c : 2 * c;  // byte column in the row
  const int blk = bytes / kSwizzleRowBytes, in = bytes % kSwizzleRowBytes;
  return tile + blk * rows * kSwizzleRowBytes + swizzled_offset(r, in / 16) + in % 16;
}

#ifdef JAXCRAFT_SM90A_ENABLED
// kBias instances: the bias tile of rows [row0, row0 + kRows) x keys [key0,
// key0 + kKeys) of `head` and batch element `b` into `tile`, in 128-byte
// column blocks, completing on `bar`; past the ends reads zero (the masks
// hide those).
template <int kRows, int kKeys>
__device__ __forceinline__ void load_bias_tile(uint32_t tile, const CUtensorMap* map, uint32_t bar,
                                               const ScoreArgs& sc, int key0, int row0, int head,
                                               int b) {
  const int block_keys = sc.bias_f32 ? 32 : 64;
  const int bn = sc.bias_stride_n ? head : 0, bb = sc.bias_stride_b ? b : 0;
  for (int cb = 0; cb < kKeys / block_keys; ++cb)
    tma_load_4d(tile + cb * kRows * kSwizzleRowBytes, map, bar, key0 + cb * block_keys, row0, bn,
                bb);
}
#endif  // JAXCRAFT_SM90A_ENABLED

}  // namespace sm90
}  // namespace attn
}  // namespace jaxcraft
