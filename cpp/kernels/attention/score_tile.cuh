// Per-element attention features for the portable (sm_80) kernels: segment
// ids, the boolean mask (mask.cuh), logit soft cap, additive bias and dropout
// (score_mods.cuh), on C-layout MMA fragments. Each kernel is instantiated
// per FeatLevel so the plain instance (lengths, causal and window masks)
// compiles exactly as without these features.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "contract/dtype.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_mods.cuh"
#include "kernels/attention/softmax.cuh"
#include "math/philox.h"

namespace jaxcraft {
namespace attn {

// Which instance of a portable kernel a launch runs.
enum FeatLevel : int {
  kFeatPlain = 0,   // lengths, causal and window masks (interval masks only)
  kFeatMasks = 1,   // + segment ids and the boolean mask (per-element visibility)
  kFeatScores = 2,  // + soft cap, bias (with dbias) and dropout
};

inline int feat_level(const MaskArgs& m, const ScoreArgs& s) {
  if (s.softcap > 0.f || s.bias != nullptr || s.dropout_key != nullptr) return kFeatScores;
  return m.q_segment_ids != nullptr || m.mask != nullptr ? kFeatMasks : kFeatPlain;
}

// Calls run(std::integral_constant<int, level>) for the launch's level.
template <class Run>
auto dispatch_feat_level(const MaskArgs& m, const ScoreArgs& s, Run&& run) {
  switch (feat_level(m, s)) {
    case kFeatScores: return run(std::integral_constant<int, kFeatScores>{});
    case kFeatMasks: return run(std::integral_constant<int, kFeatMasks>{});
    default: return run(std::integral_constant<int, kFeatPlain>{});
  }
}

__device__ __forceinline__ uint32_t keep_nibble(const Philox4& w, uint32_t threshold) {
  return uint32_t(w.x[0] >= threshold) | uint32_t(w.x[1] >= threshold) << 1 |
         uint32_t(w.x[2] >= threshold) << 2 | uint32_t(w.x[3] >= threshold) << 3;
}

// Dropout keep bits of a query-major C fragment (forward, dQ): rows r0 (g)
// and r1 (g + 8) x keys c0, c0 + 1 with c0 = n0 + 8 j + 2 t (n0 % 8 == 0).
// Bit 2 h + e: (row h, key c0 + e) kept. Lanes t and t ^ 1 share the Philox
// block of keys c0 & ~3 .. + 3: the even lane draws row r0's, the odd lane
// row r1's, and one shuffle swaps them. Warp-collective.
__device__ __forceinline__ uint32_t dropout_bits_rows(const ScoreArgs& sc, int b, int n, int r0,
                                                      int r1, int c0, int t) {
  const int odd = t & 1;
  const Philox4 w = dropout_words(sc, b, n, odd ? r1 : r0, c0 >> 2);
  uint32_t v = keep_nibble(w, sc.dropout_threshold) << (4 * odd);
  v |= __shfl_xor_sync(0xffffffffu, v, 1);
  // Nibble 0: row r0's block, nibble 1: row r1's; this lane's keys are
  // words 2 odd, 2 odd + 1 of each.
  return ((v >> (2 * odd)) & 3u) | (((v >> (4 + 2 * odd)) & 3u) << 2);
}

// Dropout keep bits of a key-major C fragment (dK/dV phase A): keys k0 + g
// (h = 0) and k0 + g + 8 (h = 1) with k0 % 16 == 0, x queries q0, q0 + 1.
// Bit 2 h + e: (key half h, query q0 + e) kept. The four lanes g & 3 = r of
// one (g >> 2, t) need the same four Philox blocks ((query q0 + e, keys of
// half h) for e + 2 h = 0..3): lane r draws block r, two shuffles share the
// nibbles, and each lane keeps word r (its key) of every block.
// Warp-collective.
__device__ __forceinline__ uint32_t dropout_bits_keys(const ScoreArgs& sc, int b, int n, int q0,
                                                      int k0, int g) {
  const int r = g & 3;
  const Philox4 w =
      dropout_words(sc, b, n, q0 + (r & 1), (k0 + 8 * (r >> 1) + (g & ~3)) >> 2);
  uint32_t v = keep_nibble(w, sc.dropout_threshold) << (4 * r);
  v |= __shfl_xor_sync(0xffffffffu, v, 4);
  v |= __shfl_xor_sync(0xffffffffu, v, 8);
  return ((v >> r) & 1u) | ((v >> (4 + r)) & 1u) << 1 | ((v >> (8 + r)) & 1u) << 2 |
         ((v >> (12 + r)) & 1u) << 3;
}

// --- Staging the bias and the boolean mask in shared memory ---------------
// Per-element loads straight from global memory stall the softmax on their
// latency and cost one L1 wavefront per row they touch; the kernels instead
// copy each score tile's [rows x keys] block of the bias (16-bit or float32)
// and of the mask (bytes) into shared memory ahead of its use. Row r of a
// staged tile starts at r * elem_row_bytes: a 16-byte pad keeps the rows'
// fragment reads in distinct banks.
__host__ __device__ constexpr int elem_row_bytes(int cols, int elem) { return cols * elem + 16; }
__host__ __device__ constexpr int elem_tile_bytes(int rows, int cols, int elem) {
  return rows * elem_row_bytes(cols, elem);
}

// Copies a [kRows x kCols] block of `elem`-byte elements whose row r starts
// at src + r * src_row_bytes (bytes) to the shared tile `dst`; rows >=
// valid_rows and columns >= valid_cols become zeros and are not read.
// aligned (src and src_row_bytes 16-byte aligned): cp.async, which the
// caller commits and waits for; else plain loads and shared stores, visible
// after the caller's next __syncthreads. `fallback`: any valid global address.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void stage_elem_tile(unsigned char* dst, const unsigned char* src,
                                                int64_t src_row_bytes, int elem, int valid_rows,
                                                int valid_cols, bool aligned,
                                                const void* fallback, int tid) {
  const int row_bytes = elem_row_bytes(kCols, elem);
  if (aligned) {
    const int chunks_log = __ffs(kCols * elem / 16) - 1;  // 16-byte chunks per row, log2
    const int valid_bytes = valid_cols * elem;
    const uint32_t dst_sa = smem_u32(dst);
    for (int i = tid; i < (kRows << chunks_log); i += kThreads) {
      const int r = i >> chunks_log, k = (i & ((1 << chunks_log) - 1)) * 16;
      const int n = min(16, valid_bytes - k);
      const bool ok = r < valid_rows && n > 0;
      cp_async_zfill(dst_sa + r * row_bytes + k, ok ? src + r * src_row_bytes + k : fallback,
                     ok ? n : 0);
    }
  } else {
    for (int i = tid; i < kRows * kCols; i += kThreads) {
      const int r = i / kCols, c = i % kCols;
      const bool ok = r < valid_rows && c < valid_cols;
      const unsigned char* p = src + r * src_row_bytes + c * elem;
      unsigned char* d = dst + r * row_bytes + c * elem;
      if (elem == 1)
        *d = ok ? *p : 0;
      else if (elem == 2)
        *reinterpret_cast<uint16_t*>(d) = ok ? *reinterpret_cast<const uint16_t*>(p) : 0;
      else
        *reinterpret_cast<uint32_t*>(d) = ok ? *reinterpret_cast<const uint32_t*>(p) : 0u;
    }
  }
}

// Where a kernel stages the bias and the mask of one score tile (offsets into
// its dynamic shared memory, after its own tiles), with the per-(b, head)
// global layout. Sized at launch from what the call has.
struct ElemStage {
  int bias_elem;         // 0: no bias, else 2 or 4 bytes
  int bias_off, mask_off;  // byte offsets of the staged tiles (mask_off < 0: no mask)
  int bytes;             // both tiles, per stage
};

template <int kRows, int kCols>
__host__ __device__ inline ElemStage elem_stage(int base, const MaskArgs& m, const ScoreArgs& sc,
                                                int level) {
  ElemStage st{0, base, -1, 0};
  if (level >= 2 && sc.bias != nullptr) st.bias_elem = sc.bias_f32 ? 4 : 2;
  int off = base;
  if (st.bias_elem) off += elem_tile_bytes(kRows, kCols, st.bias_elem);
  if (level >= 1 && m.mask != nullptr) {
    st.mask_off = off;
    off += elem_tile_bytes(kRows, kCols, 1);
  }
  st.bytes = off - base;
  return st;
}

// The largest per-stage size elem_stage can give.
template <int kRows, int kCols>
constexpr int elem_stage_max_bytes(int level) {
  return (level >= 2 ? elem_tile_bytes(kRows, kCols, 4) : 0) +
         (level >= 1 ? elem_tile_bytes(kRows, kCols, 1) : 0);
}

// Reads of a staged [rows x kCols] tile: bias elements (r, c), (r, c + 1)
// (c even) as floats; mask bits of (r, c), (r, c + 1) (bit e: visible); single
// elements.
template <DType kDt, int kCols>
__device__ __forceinline__ float2 staged_bias_pair(const unsigned char* tile, bool f32, int r,
                                                   int c) {
  if (f32) return *reinterpret_cast<const float2*>(tile + r * elem_row_bytes(kCols, 4) + c * 4);
  return unpack2<kDt>(
      *reinterpret_cast<const uint32_t*>(tile + r * elem_row_bytes(kCols, 2) + c * 2));
}
template <int kCols>
__device__ __forceinline__ uint32_t staged_mask_pair(const unsigned char* tile, int r, int c) {
  const uint32_t v = *reinterpret_cast<const uint16_t*>(tile + r * elem_row_bytes(kCols, 1) + c);
  return ((v & 0xffu) != 0 ? 1u : 0u) | ((v & 0xff00u) != 0 ? 2u : 0u);
}
template <DType kDt, int kCols>
__device__ __forceinline__ float staged_bias(const unsigned char* tile, bool f32, int r, int c) {
  using E = typename ElemOf<kDt>::type;
  if (f32) return *reinterpret_cast<const float*>(tile + r * elem_row_bytes(kCols, 4) + c * 4);
  const E v = *reinterpret_cast<const E*>(tile + r * elem_row_bytes(kCols, 2) + c * 2);
  if constexpr (kDt == DType::kBF16)
    return __bfloat162float(v);
  else
    return __half2float(v);
}
template <int kCols>
__device__ __forceinline__ bool staged_mask(const unsigned char* tile, int r, int c) {
  return tile[r * elem_row_bytes(kCols, 1) + c] != 0;
}

// Issues the staging of the bias and mask blocks of rows [r0, r0 + kRows) x
// keys [c0, c0 + kCols) of head n, batch b (rows < valid_rows and keys <
// valid_cols are read) into the tiles at smem + st.bias_off / st.mask_off.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void stage_bias_mask(unsigned char* smem, const ElemStage& st,
                                                const MaskArgs& m, const ScoreArgs& sc,
                                                const ShapeArgs& s, int b, int n, int r0,
                                                int c0, int valid_rows, int valid_cols, int tid) {
  if (st.bias_elem) {
    const int e = st.bias_elem;
    const unsigned char* base = static_cast<const unsigned char*>(sc.bias) +
                                (b * sc.bias_stride_b + n * sc.bias_stride_n) * e;
    const int64_t row = int64_t(s.seqlen_k) * e;
    const bool aligned = reinterpret_cast<uintptr_t>(base) % 16 == 0 && row % 16 == 0;
    stage_elem_tile<kRows, kCols, kThreads>(smem + st.bias_off, base + r0 * row + int64_t(c0) * e,
                                            row, e, valid_rows, valid_cols, aligned, sc.bias, tid);
  }
  if (st.mask_off >= 0) {
    const unsigned char* base = m.mask + b * m.mask_stride_b + n * m.mask_stride_n;
    const int64_t row = s.seqlen_k;
    const bool aligned = reinterpret_cast<uintptr_t>(base) % 16 == 0 && row % 16 == 0;
    stage_elem_tile<kRows, kCols, kThreads>(smem + st.mask_off, base + r0 * row + c0, row, 1,
                                            valid_rows, valid_cols, aligned, m.mask, tid);
  }
}

}  // namespace attn
}  // namespace jaxcraft
