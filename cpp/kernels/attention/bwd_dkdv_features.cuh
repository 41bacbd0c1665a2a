// The portable dK/dV kernel's feature instances outside phase A: the state
// they set up once per key tile (init_dkdv_features) and, for kFeatScores,
// the write of each query tile's dS (staged by phase A) into dbias.
#pragma once
#include <cstdint>

#include "contract/dtype.h"
#include "kernels/attention/bwd_dkdv_shape.cuh"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/mask.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/score_tile.cuh"

namespace jaxcraft {
namespace attn {

// Four adjacent fp32 values (16-byte aligned); one vector reduction on sm_90.
__device__ __forceinline__ void add_quad(float* p, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), v);
#else
  atomicAdd(p, v.x);
  atomicAdd(p + 1, v.y);
  atomicAdd(p + 2, v.z);
  atomicAdd(p + 3, v.w);
#endif
}

// k_seg: the segment ids of the thread's two phase-A keys (key_r0 + g,
// + 8); how write_dbias writes (dbias_atomic; dbias_vec: four keys per
// store); inv_cap: 1 / softcap. The arguments refer to the kernel's
// variables, as a lambda's captures would.
template <int kLevel>
__device__ __forceinline__ void init_dkdv_features(const BwdArgs& a, const SeqLens& lens,
                                                   const int& b, const int& n0, const int& key_r0,
                                                   const int& g, int (&k_seg)[2],
                                                   bool& dbias_atomic, bool& dbias_vec,
                                                   float& inv_cap) {
  const ShapeArgs& sh = a.shape;
  if constexpr (kLevel != kFeatPlain) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = n0 + key_r0 + g + 8 * h;
      if (a.mask.q_segment_ids != nullptr && key < lens.kv_len)
        k_seg[h] = a.mask.kv_segment_ids[int64_t(b) * sh.seqlen_k + key];
    }
  }
  if constexpr (kLevel == kFeatScores) {
    dbias_atomic = dbias_needs_atomics(a.scores, sh);
    // Four keys per store: 16 bytes (float32) or 8 (16-bit dbias) aligned.
    dbias_vec = reinterpret_cast<uintptr_t>(a.dbias) % (a.dbias_f32 ? 16 : 8) == 0 &&
                sh.seqlen_k % 4 == 0 &&
                a.scores.bias_stride_b % 4 == 0 && a.scores.bias_stride_n % 4 == 0;
    inv_cap = a.scores.softcap > 0.f ? 1.f / a.scores.softcap : 0.f;
  }
}

// kFeatScores: query tile m0 of head's dS (staged in phase A at dsf) into
// dbias, rows of keys as 16-byte (float32) or 8-byte (16-bit) stores, or
// vector reductions; all-zero quads (hidden elements) are skipped, dbias
// being zeroed already. A 16-bit dbias has one writer per element
// (contract/attention.h). w16 and w32 take the quads stored element-wise
// (16-bit, float32); they are the step loop's (bwd_dkdv_kernel.cuh says why).
template <DType kDt, class Sh>
__device__ __forceinline__ void write_dbias(const BwdArgs& a, const SeqLens& lens,
                                            float* const& dsf, const bool& dbias_atomic,
                                            const bool& dbias_vec, const int& b, const int& head,
                                            const int& m0, const int& n0, const int& tid,
                                            float (&w16)[4], float (&w32)[4]) {
  constexpr int kBM = Sh::kBlockM, kBN = Sh::kBlockN, kThreads = Sh::kThreads;
  const ShapeArgs& sh = a.shape;
  using E = typename ElemOf<kDt>::type;
  constexpr int kChunks = kBN / 4;
  const int rows = min(kBM, lens.q_len - m0), keys = min(kBN, lens.kv_len - n0);
  const int64_t at0 = b * a.scores.bias_stride_b + head * a.scores.bias_stride_n +
                      int64_t(m0) * sh.seqlen_k + n0;
  for (int idx = tid; idx < kBM * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 4;
    if (r >= rows || c >= keys) continue;
    const float4 v = *reinterpret_cast<const float4*>(dsf + r * dbias_stride<Sh>() + c);
    if (v.x == 0.f && v.y == 0.f && v.z == 0.f && v.w == 0.f) continue;
    const int64_t at = at0 + int64_t(r) * sh.seqlen_k + c;
    if (!a.dbias_f32) {
      E* dst = static_cast<E*>(a.dbias) + at;
      if (dbias_vec && c + 4 <= keys) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<kDt>(v.x, v.y), pack2<kDt>(v.z, v.w));
      } else {
        w16[0] = v.x;
        w16[1] = v.y;
        w16[2] = v.z;
        w16[3] = v.w;
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (c + e < keys) dst[e] = static_cast<E>(w16[e]);
      }
      continue;
    }
    float* dst = static_cast<float*>(a.dbias) + at;
    if (dbias_vec && c + 4 <= keys) {
      if (dbias_atomic)
        add_quad(dst, v);
      else
        *reinterpret_cast<float4*>(dst) = v;
    } else {
      w32[0] = v.x;
      w32[1] = v.y;
      w32[2] = v.z;
      w32[3] = v.w;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (c + e < keys && w32[e] != 0.f) {
          if (dbias_atomic)
            atomicAdd(dst + e, w32[e]);
          else
            dst[e] = w32[e];
        }
    }
  }
}

}  // namespace attn
}  // namespace jaxcraft
