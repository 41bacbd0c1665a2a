// Row sums for the register-resident kernels: kGroup threads of a block share
// a row, and with kSplit > 1 the row is further split over the kSplit CTAs of a
// thread-block cluster (sm_90+), whose partial sums meet in distributed shared
// memory. Every CTA adds the same partials in rank order, so all of them see
// bit-identical statistics, and the sums are deterministic.
#pragma once
#include <cooperative_groups.h>

#include "kernels/norm/norm_common.cuh"

// Clusters and distributed shared memory exist from sm_90 on; the host pass
// sees the declarations too (it launches, but never runs, the kernels).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define JAXCRAFT_NORM_HAS_CLUSTERS 1
#else
#define JAXCRAFT_NORM_HAS_CLUSTERS 0
#endif

namespace jaxcraft {
namespace norm {

// Whether the code being compiled can use thread-block clusters. Cluster
// kernels compile to nothing on older targets: the host launches them only
// where the loaded image was built for sm_90+.
constexpr bool kClustersCompiled = JAXCRAFT_NORM_HAS_CLUSTERS;

// Threads per block: small groups pack several rows into one block so that a
// block keeps >= 8 warps of loads in flight.
constexpr int kMinBlock = 256;

template <int kGroup>
__host__ __device__ constexpr int block_threads() {
  return kGroup > kMinBlock ? kGroup : kMinBlock;
}

// Thread-block clusters of up to 8 CTAs are portable (larger ones need an opt-in).
constexpr int kMaxSplit = 8;

// This CTA's rank within its cluster of kSplit (0 without clusters).
template <int kSplit>
__device__ __forceinline__ int cluster_rank() {
  if constexpr (kSplit == 1) {
    return 0;
  } else {
#if JAXCRAFT_NORM_HAS_CLUSTERS
    return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
    __trap();  // unreachable: the host never launches cluster kernels below sm_90
    return 0;
#endif
  }
}

// The columns one thread holds: this CTA's slice of the row is a run of
// vectors, and vector i of thread `lane` is vector lane + i * kGroup of the
// slice (consecutive lanes read consecutive 16-byte vectors: coalesced).
template <int kGroup, int kN>
struct ThreadColumns {
  int64_t col0;  // the column of this thread's vector 0
  int left;      // vectors of the slice from that one on (<= 0: none)
  __device__ bool owns(int i) const { return i * kGroup < left; }
  // Columns from vector 0 to vector i: a constant, so per-row addresses
  // are a base pointer plus immediates.
  __device__ static constexpr int64_t offset(int i) { return int64_t(i) * kGroup * kN; }
  __device__ int64_t col(int i) const { return col0 + offset(i); }
};

// The CTA's slice: the whole row, or with kSplit > 1 the rank-th of kSplit
// balanced slices (none longer than ceil(vectors / kSplit); the last ones may
// be empty).
template <int kGroup, int kSplit, int kN>
__device__ __forceinline__ ThreadColumns<kGroup, kN> thread_columns(int64_t cols, int lane) {
  const int64_t vectors = cols / kN;
  const int64_t per = (vectors + kSplit - 1) / kSplit;
  const int64_t begin = cluster_rank<kSplit>() * per;
  const int64_t end = begin + per < vectors ? begin + per : vectors;
  const int64_t first = (begin < vectors ? begin : vectors) + lane;
  return {first * kN, static_cast<int>(end - first)};
}

__device__ __forceinline__ void cluster_sync() {
#if JAXCRAFT_NORM_HAS_CLUSTERS
  cooperative_groups::this_cluster().sync();
#else
  __trap();  // unreachable: the host never launches cluster kernels below sm_90
#endif
}

// Sums kValues per-thread values over a row, one call per row (or per pass over
// it). Two buffers alternate between calls: a thread that races ahead into the
// next call writes the other buffer, and it cannot come round to this one again
// before every thread has passed the next call's barrier, i.e. finished reading
// this call's values. So no barrier is needed between rows.
template <int kGroup, int kSplit, int kValues>
class RowSum {
  static_assert(kSplit == 1 || kGroup == block_threads<kGroup>(),
                "a cluster splits blocks that hold one row");
  static_assert(kSplit <= kMaxSplit, "cluster larger than the portable size");
  static constexpr int kBuffers = 2;

 public:
  // One buffer's worth: per-warp sums of this block, then one slot per source rank.
  struct Buffer {
    float warps[block_threads<kGroup>() / kWarp * kValues];
    float ctas[kSplit][kValues];
  };
  struct Shared {
    Buffer buffers[kBuffers];
  };

  // With kSplit > 1, every thread of every CTA of the cluster constructs one
  // (its barrier guarantees that all peers run before anyone writes to their
  // shared memory).
  __device__ __forceinline__ explicit RowSum(Shared& smem)
      : cur_(&smem.buffers[0]), other_(&smem.buffers[1]) {
    if constexpr (kSplit > 1) cluster_sync();
  }

  __device__ __forceinline__ void operator()(float (&v)[kValues]) {
    group_sums<kGroup>(v, cur_->warps);
    if constexpr (kSplit > 1) {
      // Push: thread r stores this CTA's totals into rank r's slot (remote stores
      // do not stall; the barrier's release/acquire publishes them). Reads are
      // then local, and no CTA touches a peer's memory after the last barrier,
      // so CTAs may exit without one more.
      const int rank = cluster_rank<kSplit>();
      if (threadIdx.x < kSplit) {
#if JAXCRAFT_NORM_HAS_CLUSTERS
        float* slot = cooperative_groups::this_cluster().map_shared_rank(
            cur_->ctas[rank], static_cast<int>(threadIdx.x));
#pragma unroll
        for (int k = 0; k < kValues; ++k) slot[k] = v[k];
#endif
      }
      cluster_sync();
#pragma unroll
      for (int k = 0; k < kValues; ++k) {
        float total = 0.f;
#pragma unroll
        for (int r = 0; r < kSplit; ++r) total += cur_->ctas[r][k];
        v[k] = total;
      }
    }
    Buffer* const used = cur_;
    cur_ = other_;
    other_ = used;
  }

 private:
  Buffer* cur_;
  Buffer* other_;
};

}  // namespace norm
}  // namespace jaxcraft
