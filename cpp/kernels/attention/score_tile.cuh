// Per-element attention features for the portable (sm_80) kernels: segment
// ids, the boolean mask (mask.cuh), logit soft cap, additive bias and dropout
// (score_mods.cuh), on C-layout MMA fragments. Each kernel is instantiated
// per FeatLevel so the plain instance (lengths, causal and window masks)
// compiles exactly as without these features.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "common/philox.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_mods.cuh"
#include "kernels/attention/softmax.cuh"

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

// cap * tanh(x / cap) as cap - 2 cap / (1 + e^(2 x / cap)): one ex2.approx
// and one rcp.approx (each ~2^-22 relative), so the absolute error is about
// cap * 2^-21 (tanh.approx's 2^-11 relative error would show). Saturates
// cleanly: e = inf gives cap, e = 0 gives -cap. The forward and both
// backward kernels use this same function, so the recomputed logits match
// the ones the forward's lse was taken over.
__device__ __forceinline__ float soft_cap_fast(float x, float cap, float inv_cap) {
  const float e = fast_exp2(x * (2.f * kLog2e) * inv_cap);
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(1.f + e));
  return fmaf(-2.f * cap, r, cap);
}

// Bias elements at, at + 1 (row-adjacent keys c, c + 1) as floats, for the
// elements whose flag is set (others read as 0). One 4- or 8-byte load when
// `pair` (bias_pairs_ok and `at` even), else up to two scalar loads.
template <DType kDt>
__device__ __forceinline__ float2 load_bias_pair(const ScoreArgs& sc, long long at, bool pair,
                                                 bool v0, bool v1) {
  using E = typename ElemOf<kDt>::type;
  float2 r = make_float2(0.f, 0.f);
  if (pair) {
    if (v0 || v1) {
      if (sc.bias_f32)
        r = *reinterpret_cast<const float2*>(static_cast<const float*>(sc.bias) + at);
      else
        r = unpack2<kDt>(*reinterpret_cast<const uint32_t*>(static_cast<const E*>(sc.bias) + at));
    }
    return r;
  }
  auto one = [&](long long k) {
    if (sc.bias_f32) return static_cast<const float*>(sc.bias)[k];
    const E v = static_cast<const E*>(sc.bias)[k];
    if constexpr (kDt == DType::kBF16)
      return __bfloat162float(v);
    else
      return __half2float(v);
  };
  if (v0) r.x = one(at);
  if (v1) r.y = one(at + 1);
  return r;
}

// True when every (row start + even key) bias offset is pair-aligned.
__device__ __forceinline__ bool bias_pairs_ok(const ScoreArgs& sc, int seqlen_k) {
  const unsigned long long align = sc.bias_f32 ? 8 : 4;
  return reinterpret_cast<unsigned long long>(sc.bias) % align == 0 && seqlen_k % 2 == 0 &&
         sc.bias_stride_b % 2 == 0 && sc.bias_stride_n % 2 == 0;
}

// dbias needs atomics when several (b, n) add into one element: a broadcast
// batch or head axis (stride 0) with more than one batch row or head.
__device__ __forceinline__ bool dbias_needs_atomics(const ScoreArgs& sc, const ShapeArgs& s) {
  return (sc.bias_stride_b == 0 && s.batch > 1) || (sc.bias_stride_n == 0 && s.num_heads > 1);
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

}  // namespace attn
}  // namespace jaxcraft
