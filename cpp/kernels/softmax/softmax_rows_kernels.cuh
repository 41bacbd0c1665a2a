// Softmax rows kernels: kGroup threads per row (a warp, or a whole block for
// wider rows), each holding kVecs 16-byte vectors, so x is read once and y
// written once (the backward: y and dy read once, dx written once). Rows
// arrive through a shared-memory ring (row_ring.cuh) `stages` deep, chosen
// by the launcher. With kSplit > 1 (sm_90+, clusters of kSplit one-row
// blocks) each CTA of a cluster holds a slice of the row, and the CTAs meet
// in distributed shared memory: the forward exchanges one (max, sum) pair
// per CTA and row (cluster_softmax_factor), the backward reduces its dot
// (cluster_reduce). The forward reduces the row max, then the sum of
// exp(x - max). Needs
// cols % (16 / sizeof(T)) == 0 and 16-byte aligned buffers.
#pragma once
#include "kernels/softmax/row_ring.cuh"
#include "kernels/softmax/softmax_common.cuh"

namespace jaxcraft {
namespace softmax {

// ------------------------------------------------------------------ forward
// The factor exp(m - M) / S that turns a CTA's exp(x - m) (m its own max)
// into the row's softmax: threads 0..kSplit-1 push the CTA's (m, sum) into
// slot `rank` of every CTA's `pairs`, and after the cluster barrier lane r
// of each warp reads pair r and the warp reduces M = max m_r and S = sum
// s_r exp(m_r - M) (warp_allreduce: the same bits in every CTA). One
// barrier per row where a max and then a sum took two. Callers alternate two `pairs` arrays by row: a CTA can push the
// next row's pair only after every CTA has arrived at this row's barrier,
// and it comes back to this array only after every CTA has read it.
template <int kSplit>
__device__ __forceinline__ float cluster_softmax_factor(float m, float s, float2* pairs) {
#if JAXCRAFT_NORM_HAS_CLUSTERS
  if (threadIdx.x < kSplit)
    *cooperative_groups::this_cluster().map_shared_rank(pairs + norm::cluster_rank<kSplit>(),
                                                        static_cast<int>(threadIdx.x)) = make_float2(m, s);
#endif
  norm::cluster_sync();
  const int lane = threadIdx.x % kWarp;
  const float2 pair = lane < kSplit ? pairs[lane] : make_float2(Max::identity(), 0.f);
  const float row_max = warp_allreduce<kSplit>(pair.x, Max{});
  // Lanes past kSplit add 0 (exp(-inf - row_max) is NaN when row_max = -inf).
  const float row_sum = warp_allreduce<kSplit>(lane < kSplit ? pair.y * expf(pair.x - row_max) : 0.f, Sum{});
  return expf(m - row_max) / row_sum;
}

// kMasked: p.mask is set (its bytes travel through the ring beside x);
// without it every element is kept and the per-element selects go away.
template <typename T, int kGroup, int kVecs, bool kMasked, int kSplit>
__global__ void __launch_bounds__(block_threads<kGroup>())
    softmax_fwd_rows_kernel(const SoftmaxFwdParams p, const int stages) {
  static_assert(kSplit == 1 || kGroup == block_threads<kGroup>(), "a cluster splits one-row blocks");
  constexpr int kN = Vec<T>::kN;
  constexpr uint32_t kAll = (1u << kN) - 1u;
  using Ring = RowRing<T, block_threads<kGroup>(), kVecs>;
  extern __shared__ __align__(kVecBytes) unsigned char ring_smem[];
  __shared__ float slots[2][kGroup / kWarp];  // the block's max, then sum
  __shared__ float2 cta_pairs[2][kSplit];     // the cluster's (max, sum) pairs, by row parity
  int parity = 0;
  const Ring ring(ring_smem);
  // kMasked: the mask's kN bytes per vector, in a ring of the same slots after x's.
  uint8_t* mask_ring = ring_smem + stages * Ring::kStageBytes;
  // Base pointers at this thread's vector 0: a row's vector i is then a
  // row offset plus the immediate Cols::offset(i).
  using Cols = norm::ThreadColumns<kGroup, kN>;
  const Cols cols = norm::thread_columns<kGroup, kSplit, kN>(p.cols, threadIdx.x % kGroup);
  const T* x = static_cast<const T*>(p.x) + cols.col0;
  T* y = static_cast<T*>(p.y) + cols.col0;
  const uint8_t* mask = kMasked ? p.mask + cols.col0 : nullptr;
  auto fetch = [&](int64_t row, int stage) {
    if (row >= p.rows) return;
    const T* xr = x + row * p.cols;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (cols.owns(i)) {
        cp_async_16(smem_u32(ring.slot(stage, i)), xr + Cols::offset(i));
        if constexpr (kMasked)
          cp_async_ca<kN>(smem_u32(mask_ring + Ring::index(stage, i) * kN),
                          mask + row * p.mask_row_stride + Cols::offset(i));
      }
    }
  };
  if constexpr (kSplit > 1) norm::cluster_sync();  // every peer runs before a remote store
  // Uniform over the block (the cluster) when kGroup > 32: the reductions
  // synchronize.
  const int64_t first = first_row<kGroup, kSplit>(), stride = row_stride<kGroup, kSplit>();
  Ring::prologue(fetch, first, stride, stages - 1);
  int stage = 0;
  for (int64_t row = first; row < p.rows; row += stride) {
    Ring::advance(fetch, row, stride, stages, stage);
    // Two phases, each one block (cluster) reduction: the row max M over
    // the kept elements, then e = exp(x - M) (kept in registers) and their
    // sum. Cheaper than merging (max, sum) pairs: a pair merge costs two
    // exps, and a 1024-thread row merged 31 of them per thread.
    float e[kVecs][kN];
    uint32_t keep[kVecs];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      keep[i] = 0;
      if (cols.owns(i)) {
        const Vec<T> v = *ring.slot(stage, i);
        keep[i] = kMasked ? mask_bits<kN>(mask_ring + Ring::index(stage, i) * kN, 0) : kAll;
#pragma unroll
        for (int j = 0; j < kN; ++j) e[i][j] = to_f32(v.v[j]);
        m = fmaxf(m, kept_max(e[i], keep[i]));
      } else {
#pragma unroll
        for (int j = 0; j < kN; ++j) e[i][j] = 0.f;
      }
    }
    // M = -inf: nothing kept (every e = 0, y = 0), or kept values all -inf
    // (NaN, as jax). M = +inf, or a NaN among the kept values, makes the
    // sum and so the row NaN, as jax.
    // kSplit > 1: e = exp(x - m) with this CTA's max m, and one cluster
    // exchange of (m, sum) pairs per row (cluster_softmax_factor) in place
    // of one for the max and one for the sum. Where m = -inf the CTA's
    // kept values are all -inf (or none): e = exp(x - inf) = 0, and the
    // pairs make the row NaN only if the whole row's are.
    m = group_reduce<kGroup>(m, slots[0], Max{});
    const float m_exp = kSplit > 1 && m == -CUDART_INF_F ? CUDART_INF_F : m;
    const float m_log2e = m_exp * kLog2e;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if constexpr (kMasked) {
#pragma unroll
        for (int j = 0; j < kN; ++j) e[i][j] = keep[i] >> j & 1u ? exp_shifted<T>(e[i][j], m_exp, m_log2e) : 0.f;
      } else if (keep[i]) {
#pragma unroll
        for (int j = 0; j < kN; ++j) e[i][j] = exp_shifted<T>(e[i][j], m_exp, m_log2e);
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) s += e[i][j];
    }
    s = group_reduce<kGroup>(s, slots[1], Sum{});
    const float factor = kSplit == 1 ? 1.f / s : cluster_softmax_factor<kSplit>(m, s, cta_pairs[parity]);
    parity ^= 1;
    T* yr = y + row * p.cols;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (cols.owns(i)) {
        // Masked-out elements are 0 even when the row kept nothing (factor = inf).
        Vec<T> out;
#pragma unroll
        for (int j = 0; j < kN; ++j)
          out.v[j] = from_f32<T>(!kMasked || keep[i] >> j & 1u ? e[i][j] * factor : 0.f);
        store_vec(yr + Cols::offset(i), out);
      }
    }
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
}

// ----------------------------------------------------------------- backward
// y and dy stay in registers from the dot to dx, and their stage refills as
// soon as the dot has used them (RowRing::refill): `stages` rows in flight
// where RowRing::advance keeps stages - 1, and the widest rows (f32 128K
// columns, 128 KB of y and dy per CTA of the cluster) run on a one-stage
// ring. H100, against advance() in the same process: bf16 [4k, 128k]
// 1142 -> 1108 us, f32 [16k, 32k] 2230 -> 2178, f32 [16k, 4k] 306 -> 299.
template <typename T, int kGroup, int kVecs, int kSplit>
__global__ void __launch_bounds__(block_threads<kGroup>())
    softmax_bwd_rows_kernel(const SoftmaxBwdParams p, const int stages) {
  static_assert(kSplit == 1 || kGroup == block_threads<kGroup>(), "a cluster splits one-row blocks");
  constexpr int kN = Vec<T>::kN;
  using Ring = RowRing<T, block_threads<kGroup>(), kVecs>;
  extern __shared__ __align__(kVecBytes) unsigned char ring_smem[];
  __shared__ float slots[2][kGroup / kWarp];  // by row parity (group_reduce)
  __shared__ float cta_slots[2][kSplit];
  const Ring y_ring(ring_smem), dy_ring(ring_smem + stages * Ring::kStageBytes);
  using Cols = norm::ThreadColumns<kGroup, kN>;  // as in the forward
  const Cols cols = norm::thread_columns<kGroup, kSplit, kN>(p.cols, threadIdx.x % kGroup);
  const T* y = static_cast<const T*>(p.y) + cols.col0;
  const T* dy = static_cast<const T*>(p.dy) + cols.col0;
  T* dx = static_cast<T*>(p.dx) + cols.col0;
  auto fetch = [&](int64_t row, int stage) {
    if (row >= p.rows) return;
    const int64_t r = row * p.cols;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (cols.owns(i)) {
        cp_async_16(smem_u32(y_ring.slot(stage, i)), y + r + Cols::offset(i));
        cp_async_16(smem_u32(dy_ring.slot(stage, i)), dy + r + Cols::offset(i));
      }
    }
  };
  if constexpr (kSplit > 1) norm::cluster_sync();  // every peer runs before a remote store
  const int64_t first = first_row<kGroup, kSplit>(), stride = row_stride<kGroup, kSplit>();
  Ring::prologue(fetch, first, stride, stages);
  int stage = 0, parity = 0;
  for (int64_t row = first; row < p.rows; row += stride) {
    Ring::wait_row(stages);
    Vec<T> yv[kVecs], gv[kVecs];
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (cols.owns(i)) {
        yv[i] = *y_ring.slot(stage, i);
        gv[i] = *dy_ring.slot(stage, i);
        // element_pair converts afresh at each use: 16-bit values stay
        // packed across the reductions (float32 copies spilled).
#pragma unroll
        for (int k = 0; k < kN / 2; ++k) {
          const float2 yk = element_pair(yv[i], k), gk = element_pair(gv[i], k);
          dot += yk.x * gk.x;
          dot += yk.y * gk.y;
        }
      }
    }
    Ring::refill(fetch, row, stride, stages, stage);
    dot = cluster_reduce<kSplit>(group_reduce<kGroup>(dot, slots[parity], Sum{}), cta_slots[parity], Sum{});
    parity ^= 1;
    T* dxr = dx + row * p.cols;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (cols.owns(i)) {
        Vec<T> out;
#pragma unroll
        for (int k = 0; k < kN / 2; ++k) {
          const float2 yk = element_pair(yv[i], k), gk = element_pair(gv[i], k);
          out.v[2 * k] = from_f32<T>(yk.x * (gk.x - dot));
          out.v[2 * k + 1] = from_f32<T>(yk.y * (gk.y - dot));
        }
        store_vec(dxr + Cols::offset(i), out);
      }
    }
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
}

}  // namespace softmax
}  // namespace jaxcraft
