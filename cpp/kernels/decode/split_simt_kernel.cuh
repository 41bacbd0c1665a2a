// Split-K decode attention on CUDA cores, for float32 caches (tensor cores
// have no float32 inputs; TF32 would lose float32 accuracy).
//
// One CTA = (sequence b, KV head kh, split, chunk of kRows query rows). A
// key row is spread over kLanesPerKey lanes (16 bytes each); the CTA's lane
// groups ("slots") stream disjoint keys, kUnroll consecutive keys at a time
// (their loads all in flight together), each slot with its own online
// softmax over all kRows rows, so every K/V vector is loaded once for the
// whole chunk. The slots' states are merged at the end (epilogue.cuh).
#pragma once
#include "kernels/decode/device.cuh"
#include "kernels/decode/epilogue.cuh"

namespace jaxcraft {
namespace decode {

template <int kHeadDim>
struct SimtConfig {
  static constexpr int kThreads = 128;
  static constexpr int kVec = kCpAsyncBytes / int(sizeof(float));
  static constexpr int kVecsPerRow = kHeadDim / kVec;
  static constexpr int kLanesPerKey = kVecsPerRow < kWarpSize ? kVecsPerRow : kWarpSize;
  static constexpr int kVecsPerLane = kVecsPerRow / kLanesPerKey;
  static constexpr int kSlots = kThreads / kLanesPerKey;
  // Registers: q and the accumulator hold kRows x kVecsPerLane x 4 floats each;
  // 8 rows at D <= 128 and 4 at D256 keep both near 32 registers.
  static constexpr int kRows = kHeadDim <= 128 ? 8 : 4;
  // 2 x kUnroll x kVecsPerLane 16-byte loads in flight per lane.
  static constexpr int kUnroll = 4;
  static constexpr int kBlockN = kSlots * kUnroll;  // keys per CTA step (and per split unit)
  using Epi = Epilogue<float, kSlots, kRows, kHeadDim, kThreads>;
  static_assert(kVecsPerRow % kLanesPerKey == 0, "lanes split a row evenly");
};

template <int kHeadDim>
__global__ void __launch_bounds__(SimtConfig<kHeadDim>::kThreads, 1)
    decode_split_simt_kernel(const __grid_constant__ DecodeArgs a) {
  using Cfg = SimtConfig<kHeadDim>;
  constexpr int kRows = Cfg::kRows, kUnroll = Cfg::kUnroll, kVecs = Cfg::kVecsPerLane;
  constexpr int kLanes = Cfg::kLanesPerKey;
  __shared__ __align__(16) float s_o[Cfg::Epi::kSmemBytes / sizeof(float)];
  __shared__ typename Cfg::Epi::Stats stats;

  const DecodeParams& p = a.p;
  wait_for_prior_grid();  // launched as a dependent, as the MMA kernel
  allow_dependent_grids();
  int64_t cta = blockIdx.x;
  const int chunk = static_cast<int>(cta % a.row_chunks);
  cta /= a.row_chunks;
  const int split = static_cast<int>(cta % a.num_splits);
  cta /= a.num_splits;
  const int kh = static_cast<int>(cta % p.num_kv_heads);
  const int b = static_cast<int>(cta / p.num_kv_heads);
  const int row0 = chunk * kRows;

  const SeqSpan span = seq_span(p, b);
  int tile_begin, tile_end;
  split_tiles<Cfg::kBlockN>(span, split, a.num_splits, tile_begin, tile_end);
  const int head_dim = static_cast<int>(p.head_dim);
  const int64_t kv_row_elems = p.num_kv_heads * p.head_dim;
  const float* k = static_cast<const float*>(p.k) + static_cast<int64_t>(kh) * head_dim;
  const float* v = static_cast<const float*>(p.v) + static_cast<int64_t>(kh) * head_dim;

  const int slot = threadIdx.x / kLanes, slot_lane = threadIdx.x % kLanes;
  // This lane's dims: vectors slot_lane + i * kLanes of each row.
  auto dim_of = [&](int i) { return (slot_lane + i * kLanes) * Cfg::kVec; };

  const int group_rows = static_cast<int>(p.seqlen_q * a.group.divisor);
  float4 q[kRows][kVecs];
  RowWindow windows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    windows[r] = row_window(a, span, row0 + r);
    const bool row_ok = row0 + r < group_rows;
    const float* src = static_cast<const float*>(p.q) + (row_ok ? q_offset(a, b, kh, row0 + r) : 0);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      q[r][i] = row_ok && dim_of(i) < head_dim ? *reinterpret_cast<const float4*>(src + dim_of(i))
                                                : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }

  float4 acc[kRows][kVecs];
  float row_max[kRows], row_sum[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    row_max[r] = kNegInf;
    row_sum[r] = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) acc[r][i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int j0 = tile * Cfg::kBlockN + slot * kUnroll;
    float4 kv[kUnroll][kVecs], vv[kUnroll][kVecs];
    bool key_ok[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u;
      const int row = j < span.length ? cache_row(a, page_of(a, b, j), j) : -1;
      key_ok[u] = row >= 0;
      const int64_t off = static_cast<int64_t>(row) * kv_row_elems;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const bool ok = key_ok[u] && dim_of(i) < head_dim;
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        kv[u][i] = ok ? *reinterpret_cast<const float4*>(k + off + dim_of(i)) : zero;
        vv[u][i] = ok ? *reinterpret_cast<const float4*>(v + off + dim_of(i)) : zero;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float logits[kUnroll];
      float tile_max = kNegInf;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < kVecs; ++i) {
          dot += q[r][i].x * kv[u][i].x + q[r][i].y * kv[u][i].y + q[r][i].z * kv[u][i].z +
                 q[r][i].w * kv[u][i].w;
        }
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset /= 2)
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        const int j = j0 + u;
        const bool visible = key_ok[u] && j >= windows[r].lo && j <= windows[r].hi;
        logits[u] = visible ? scaled_logit(p, dot) : kNegInf;
        tile_max = fmaxf(tile_max, logits[u]);
      }
      const float new_max = fmaxf(row_max[r], tile_max);
      const float base = new_max == kNegInf ? 0.f : new_max;  // no key yet: exp2 -> 0, not NaN
      const float correction = exp2f(row_max[r] - base);
      row_max[r] = new_max;
      row_sum[r] *= correction;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        acc[r][i].x *= correction;
        acc[r][i].y *= correction;
        acc[r][i].z *= correction;
        acc[r][i].w *= correction;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float w = exp2f(logits[u] - base);
        row_sum[r] += w;
#pragma unroll
        for (int i = 0; i < kVecs; ++i) {
          acc[r][i].x += w * vv[u][i].x;
          acc[r][i].y += w * vv[u][i].y;
          acc[r][i].z += w * vv[u][i].z;
          acc[r][i].w += w * vv[u][i].w;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
      *reinterpret_cast<float4*>(Cfg::Epi::o_slot(s_o, slot, r) + dim_of(i)) = acc[r][i];
    if (slot_lane == 0) {
      stats.max[slot * kRows + r] = row_max[r];
      stats.sum[slot * kRows + r] = row_sum[r];
    }
  }
  Cfg::Epi::run(a, b, kh, split, row0, s_o, stats);
}

}  // namespace decode
}  // namespace jaxcraft
