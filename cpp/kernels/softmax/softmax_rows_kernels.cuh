// Softmax rows kernels: kGroup threads per row (a warp, or a whole block for
// wider rows), each holding kVecs 16-byte vectors, so x is read once and y
// written once (the backward: y and dy read once, dx written once). Rows
// arrive through a shared-memory ring (row_ring.cuh) `stages` deep, chosen
// by the launcher. With kSplit > 1 (sm_90+, clusters of kSplit one-row
// blocks) each CTA of a cluster holds a slice of the row, and the CTAs meet
// in distributed shared memory: the forward exchanges one (max, sum) pair
// per CTA and row (row_softmax_factor), the backward reduces its dot
// (cluster_reduce). Needs cols % (16 / sizeof(T)) == 0 and 16-byte aligned
// buffers.
#pragma once
#include "kernels/softmax/row_ring.cuh"
#include "kernels/softmax/softmax_common.cuh"

namespace jaxcraft {
namespace softmax {

// ------------------------------------------------------------------ forward
// The factor exp(m - M) / S that turns a warp's exp(x - m) (m the warp's
// max, s their sum) into the row's softmax, M and S over the row. One block
// barrier: lane 0 of each warp publishes (m, s) in `warp_pairs` and every
// warp merges them (merge_pairs); with clusters, threads 0..kSplit-1 then
// push the CTA's pair into slot `rank` of every CTA's `cta_pairs`, and
// after the cluster barrier every warp merges those (the same bits in every
// CTA). A max and then a sum, each a block reduction, took two barriers
// before the cluster's. Callers alternate two arrays of each by row: a
// block (a CTA) writes the next row's pair only after all have passed this
// row's barrier, and comes back to this array only after all have read it.
template <int kGroup, int kSplit>
__device__ __forceinline__ float row_softmax_factor(float m, float s, float2* warp_pairs, float2* cta_pairs) {
  constexpr int kWarps = kGroup / kWarp;
  const int lane = threadIdx.x % kWarp;
  const float2 none = make_float2(-CUDART_INF_F, 0.f);
  if (lane == 0) warp_pairs[threadIdx.x / kWarp] = make_float2(m, s);
  __syncthreads();
  float2 row = merge_pairs<kWarps>(lane < kWarps ? warp_pairs[lane] : none);
  if constexpr (kSplit > 1) {
#if JAXCRAFT_NORM_HAS_CLUSTERS
    if (threadIdx.x < kSplit)
      *cooperative_groups::this_cluster().map_shared_rank(cta_pairs + norm::cluster_rank<kSplit>(),
                                                          static_cast<int>(threadIdx.x)) = row;
#endif
    norm::cluster_sync();
    row = merge_pairs<kSplit>(lane < kSplit ? cta_pairs[lane] : none);
  }
  return expf(m - row.x) / row.y;
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
  // (max, sum) pairs by row parity: the block's warps', the cluster's CTAs'.
  __shared__ float2 warp_pairs[2][kGroup / kWarp];
  __shared__ float2 cta_pairs[2][kSplit];
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
  // Eight vectors per thread (float32 rows over clusters of four 128 KB
  // slices): a one-stage ring, refilled once x is in registers (as the
  // backward's, RowRing::refill). With fewer, advance() measured within 1%
  // of the refill and 16-bit rows spilled under it.
  constexpr bool kRefill = kVecs > 4;
  Ring::prologue(fetch, first, stride, kRefill ? stages : stages - 1);
  int stage = 0;
  for (int64_t row = first; row < p.rows; row += stride) {
    if constexpr (kRefill) Ring::wait_row(stages);
    else Ring::advance(fetch, row, stride, stages, stage);
    // The warp's max m over its kept elements, e = exp(x - m) (kept in
    // registers) and their sum, then the row's factor (row_softmax_factor:
    // one block barrier, where the block's max and then its sum took two).
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
    if constexpr (kRefill) Ring::refill(fetch, row, stride, stages, stage);
    // A warp-wide row: m = -inf when nothing is kept (every e = 0, y = 0)
    // or the kept values are all -inf (exp(-inf + inf): NaN, as jax); m =
    // +inf, or a NaN among the kept values, makes the sum and so the row
    // NaN, as jax. A wider row's warp with m = -inf takes e = exp(x - inf)
    // = 0 and leaves the verdict to the factor: 0 where the row has a
    // finite max, NaN where all its kept values are -inf.
    m = warp_allreduce<kWarp>(m, Max{});
    const float m_exp = kGroup > kWarp && m == -CUDART_INF_F ? CUDART_INF_F : m;
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
    s = warp_allreduce<kWarp>(s, Sum{});
    float factor = 1.f / s;
    if constexpr (kGroup > kWarp)
      factor = row_softmax_factor<kGroup, kSplit>(m, s, warp_pairs[parity], cta_pairs[parity]);
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
        // add_dot and softmax_grad convert afresh at each use (element_pair):
        // 16-bit values stay packed across the reductions (float32 copies
        // spilled).
        dot = add_dot(yv[i], gv[i], dot);
      }
    }
    Ring::refill(fetch, row, stride, stages, stage);
    dot = cluster_reduce<kSplit>(group_reduce<kGroup>(dot, slots[parity], Sum{}), cta_slots[parity], Sum{});
    parity ^= 1;
    T* dxr = dx + row * p.cols;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (cols.owns(i)) store_vec(dxr + Cols::offset(i), softmax_grad(yv[i], gv[i], dot));
    }
    stage = stage + 1 == stages ? 0 : stage + 1;
  }
}

}  // namespace softmax
}  // namespace jaxcraft
