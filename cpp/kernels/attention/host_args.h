// Host-side validation of the attention contract and its conversion to the
// 32-bit kernel arguments. Shared by launch_fwd.cu and launch_bwd.cu.
#pragma once
#include <cstdint>
#include <cstdio>

#include "contract/attention.h"
#include "kernels/attention/kernel_args.h"
#include "kernels/attention/tile_config.h"
#include "math/philox.h"

namespace jaxcraft {
namespace attn {

// |offset| up to 2^28 (kAttentionCudaMaxSeqLen) and windows below 2^29 keep
// every index sum in mask.cuh inside int32; a window of 2^29 or more reaches
// past every key anyway and becomes unbounded.
constexpr int64_t kMaxSeqLen = kAttentionCudaMaxSeqLen;
constexpr int64_t kMaxWindow = int64_t(1) << 29;

inline bool to_kernel_args(const AttentionShape& s, const AttentionMask& m, ShapeArgs* sa,
                           MaskArgs* ma) {
  if (m.offset > kMaxSeqLen || m.offset < -kMaxSeqLen) return false;
  auto window = [](int64_t w) { return w < 0 || w >= kMaxWindow ? -1 : static_cast<int>(w); };
  *sa = ShapeArgs{static_cast<int>(s.batch),     static_cast<int>(s.seqlen_q),
                  static_cast<int>(s.seqlen_k),  static_cast<int>(s.num_heads),
                  static_cast<int>(s.num_kv_heads), static_cast<int>(s.head_dim)};
  *ma = MaskArgs{m.causal ? 1 : 0,         static_cast<int>(m.offset),
                 window(m.window_left),    window(m.window_right),
                 m.q_lengths,              m.kv_lengths,
                 m.q_segment_ids,          m.kv_segment_ids,
                 m.segment_key_range,      m.segment_query_range,
                 m.mask,                   m.mask_stride_b,
                 m.mask_stride_n};
  return true;
}

inline ScoreArgs to_score_args(const AttentionScores& s) {
  const bool dropout = s.dropout_key != nullptr && s.dropout_rate > 0.f;
  return ScoreArgs{s.softcap > 0.f ? s.softcap : 0.f,
                   s.bias,
                   s.bias_f32 ? 1 : 0,
                   s.bias_stride_b,
                   s.bias_stride_n,
                   dropout ? s.dropout_key : nullptr,
                   dropout ? dropout_threshold(s.dropout_rate) : 0u,
                   dropout ? 1.f / (1.f - s.dropout_rate) : 1.f,
                   s.dropout_broadcast ? 1 : 0};
}

}  // namespace attn
}  // namespace jaxcraft
