// Online softmax over C-layout score fragments, in base 2: the softmax scale
// carries a factor log2(e), so every exponential is one ex2.
#pragma once
#include <cmath>

#include "kernels/attention/mma_sm80.cuh"
#include "math/fast_math.h"

namespace jaxcraft {
namespace attn {

// The running max only moves (and O is only rescaled) once some row's max
// has grown by more than this many powers of two: until then probabilities
// are taken against the stale max, so they can reach 2^8, which 16-bit P,
// fp32 row sums and the fp32 O accumulator all hold without loss. The result
// is the same softmax (the epilogue divides by a sum taken against the same
// max), and on typical inputs every tile after the first few skips the
// rescale, one FMUL per O element per tile.
constexpr float kRescaleLog2Threshold = 8.f;

// kSlabs 16-row slabs: s[m][j] holds slab m's raw scores (masked ones -inf)
// for key tile j; rows g and g + 8 of the fragment are h = 0 and 1. Scores
// are scaled inside the exponent, exp2(s * scale_log2 - max), one FFMA per
// score; scale_log2 must be > 0 (the caller pre-scales otherwise), so the
// raw row max is also the scaled one. Replaces s with unnormalized
// probabilities and adds them to row_sum. row_max is kept scaled; row_sum
// stays a per-lane partial (reduced once in the epilogue). Returns whether
// the max moved; then the output accumulator must be multiplied by `corr`
// (rescale_rows), which the caller may defer while an MMA still adds into it.
// kRowSums = false leaves row_sum alone: the caller sums the probabilities
// elsewhere (the Hopper forward at head dim 64, in the P V product), and its
// sums are rescaled with the accumulator.
template <bool kRowSums = true, int kSlabs, int kKeyTiles>
__device__ __forceinline__ bool online_softmax_step(float (&s)[kSlabs][kKeyTiles][4],
                                                    float (&row_max)[kSlabs][2],
                                                    float (&row_sum)[kSlabs][2],
                                                    float (&corr)[kSlabs][2], float scale_log2) {
  float tile_max[kSlabs][2];
  bool grew = false;
#pragma unroll
  for (int m = 0; m < kSlabs; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) mx = fmaxf(mx, fmaxf(s[m][j][2 * h], s[m][j][2 * h + 1]));
      tile_max[m][h] = quad_max(mx) * scale_log2;
      // -inf + threshold stays -inf: a row's first visible key always moves it.
      grew |= tile_max[m][h] > row_max[m][h] + kRescaleLog2Threshold;
    }
  }
  // Warp-uniform decision, so the caller's rescale is a non-divergent branch.
  const bool rescale = __any_sync(0xffffffffu, grew);
  if (rescale) {
#pragma unroll
    for (int m = 0; m < kSlabs; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mx = fmaxf(tile_max[m][h], row_max[m][h]);
        // A row that has seen only masked keys keeps max -inf; exp2(-inf -
        // -inf) would be NaN, and its factor is irrelevant (sum and O are 0).
        corr[m][h] = mx == -INFINITY ? 1.f : fast_exp2(row_max[m][h] - mx);
        row_max[m][h] = mx;
        if (kRowSums) row_sum[m][h] *= corr[m][h];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kSlabs; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Still -inf only if every key so far was masked; then so are these
      // scores, and subtracting 0 keeps exp2(-inf) = 0 rather than NaN.
      const float base = row_max[m][h] == -INFINITY ? 0.f : row_max[m][h];
      float sum = row_sum[m][h];
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
        s[m][j][2 * h] = fast_exp2(fmaf(s[m][j][2 * h], scale_log2, -base));
        s[m][j][2 * h + 1] = fast_exp2(fmaf(s[m][j][2 * h + 1], scale_log2, -base));
        if (kRowSums) sum += s[m][j][2 * h] + s[m][j][2 * h + 1];
      }
      if (kRowSums) row_sum[m][h] = sum;
    }
  }
  return rescale;
}

template <int kSlabs, int kAccTiles>
__device__ __forceinline__ void rescale_rows(float (&acc)[kSlabs][kAccTiles][4],
                                             const float (&corr)[kSlabs][2]) {
#pragma unroll
  for (int m = 0; m < kSlabs; ++m)
#pragma unroll
    for (int j = 0; j < kAccTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] *= corr[m][e / 2];
}

// online_softmax_step with the accumulator rescaled at once.
template <int kSlabs, int kKeyTiles, int kAccTiles>
__device__ __forceinline__ void online_softmax(float (&s)[kSlabs][kKeyTiles][4],
                                               float (&acc)[kSlabs][kAccTiles][4],
                                               float (&row_max)[kSlabs][2],
                                               float (&row_sum)[kSlabs][2], float scale_log2) {
  float corr[kSlabs][2];
  if (online_softmax_step(s, row_max, row_sum, corr, scale_log2)) rescale_rows(acc, corr);
}

}  // namespace attn
}  // namespace jaxcraft
