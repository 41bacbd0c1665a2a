// Embedding lookup kernels. Rows are moved as packs of kN elements (one
// 16-byte access when the row width and pointers allow it, else kN = 1).
// Threads are laid out in groups of `group` (a power of two, 1..kBlockThreads)
// consecutive threads per row, so narrow rows share a warp and wide rows get
// up to a whole block; blocks walk rows grid-stride.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/convert.cuh"
#include "contract/embedding.h"

namespace jaxcraft {
namespace embedding {

constexpr int kBlockThreads = 256;
constexpr int kVecBytes = 16;  // one LDG.128 / STG.128
// Packs a thread keeps in flight per row: 2 x 16 B x 2048 threads = 64 KiB per
// SM, over the ~25 KiB per SM that HBM3's bandwidth-latency product needs.
constexpr int kPacksPerThread = 2;
// The lookup (a pure copy) keeps more in flight: at 2 packs it reached 64% of
// the H200's copy bandwidth on a 128k x 4096 table, at 8 packs 83-87%
// (docs/design.md). The backward kernels keep kPacksPerThread: their
// deterministic pass was 17-97% slower at 8.
constexpr int kLookupPacksPerThread = 8;

template <typename T>
constexpr int kVecN = kVecBytes / int(sizeof(T));

// kN elements moved together: 16-byte aligned accesses when the pack is 16
// bytes or more (a float32 pack of 8 is two of them), else element-aligned.
template <typename T, int kN>
struct alignas(sizeof(T) * kN < kVecBytes ? sizeof(T) * kN : kVecBytes) Pack {
  T v[kN];
};

// Where a thread sits: row slot `slot` of its block, lane `lane` of the row's group.
struct Layout {
  int shift;  // log2(group)
  __device__ int group() const { return 1 << shift; }
  __device__ int lane() const { return threadIdx.x & ((1 << shift) - 1); }
  // The first row of a grid-stride walk by block `block` of `blocks`, and its step.
  __device__ int64_t first(int64_t block) const {
    return block * (kBlockThreads >> shift) + (threadIdx.x >> shift);
  }
  __device__ int64_t stride(int64_t blocks) const { return blocks * (kBlockThreads >> shift); }
  __device__ int64_t first_row() const { return first(blockIdx.x); }
  __device__ int64_t row_stride() const { return stride(gridDim.x); }
};

// The backward's table pass in two phases: blocks [0, touched_blocks) write
// the rows some id reads, walking the ids (or the sorted runs), and the
// blocks after them write the zero rows. Blocks start roughly in index
// order, so the pass reads dout first and then streams pure writes: with the
// reads mixed among the writes, a 1 GiB table pass is ~10% slower on the
// H200.
struct TablePhases {
  int64_t touched_blocks;
  __device__ bool touched() const { return blockIdx.x < touched_blocks; }
  __device__ int64_t zero_block() const { return blockIdx.x - touched_blocks; }
  __device__ int64_t zero_blocks() const { return gridDim.x - touched_blocks; }
};

// The zero phase: table rows r with empty(r) become zeros.
template <typename T, int kN, class Empty>
__device__ __forceinline__ void write_zero_rows(const TablePhases& ph, const Layout& l, int64_t rows,
                                                int64_t packs, Pack<T, kN>* __restrict__ dtable,
                                                Empty empty) {
  Pack<T, kN> zero;
#pragma unroll
  for (int j = 0; j < kN; ++j) zero.v[j] = from_f32<T>(0.f);
  for (int64_t r = l.first(ph.zero_block()); r < rows; r += l.stride(ph.zero_blocks())) {
    if (!empty(r)) continue;
    for (int64_t c = l.lane(); c < packs; c += l.group()) dtable[r * packs + c] = zero;
  }
}

// Adds kN floats at p (16-byte aligned when kN == 4) without reading back:
// sm_90 has a vector reduction (one L2 request for 4 floats).
template <int kN>
__device__ __forceinline__ void red_add_scalar(float* p, const float (&v)[kN]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) atomicAdd(p + j, v[j]);  // result unused: compiles to RED
}

template <int kN>
__device__ __forceinline__ void red_add(float* p, const float (&v)[kN]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kN; j += 4)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p + j), "f"(v[j]),
                   "f"(v[j + 1]), "f"(v[j + 2]), "f"(v[j + 3])
                   : "memory");
  } else {
    red_add_scalar(p, v);
  }
#else
  red_add_scalar(p, v);
#endif
}

template <typename T, int kN>
__device__ __forceinline__ void unpack(const Pack<T, kN>& in, float (&out)[kN]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) out[j] = to_f32(in.v[j]);
}

// Adds kPacksPerThread packs of the dout row starting at pack `at` (from
// pack c0 in steps of `group`) into acc in float32.
template <typename T, int kN>
__device__ __forceinline__ void add_row(const Pack<T, kN>* __restrict__ dout, int64_t at, int64_t packs,
                                        int64_t c0, int group, float (&acc)[kPacksPerThread][kN]) {
#pragma unroll
  for (int u = 0; u < kPacksPerThread; ++u) {
    if (c0 + u * group < packs) {
      float v[kN];
      unpack(dout[at + c0 + u * group], v);
#pragma unroll
      for (int e = 0; e < kN; ++e) acc[u][e] += v[e];
    }
  }
}

// Adds the n (>= 1) dout rows of a chain, from `head` along `next`, into acc
// in float32: kPacksPerThread packs of each, from pack c0 in steps of
// `group`. The next link is read while this row's packs are in flight.
template <typename T, int kN>
__device__ __forceinline__ void add_chain(const Pack<T, kN>* __restrict__ dout, int64_t packs,
                                          int64_t c0, int group, int32_t n, int32_t head,
                                          const int32_t* __restrict__ next,
                                          float (&acc)[kPacksPerThread][kN]) {
  int32_t row = head;
  for (int32_t j = 0; j < n; ++j) {
    const int32_t following = j + 1 < n ? next[row] : 0;
    add_row(dout, int64_t(row) * packs, packs, c0, group, acc);
    row = following;
  }
}

// Writes acc (kPacksPerThread packs from c0, as add_chain), rounded, into the table row at dst.
template <typename T, int kN>
__device__ __forceinline__ void store_rounded(Pack<T, kN>* dst, int64_t packs, int64_t c0,
                                              int group, const float (&acc)[kPacksPerThread][kN]) {
#pragma unroll
  for (int u = 0; u < kPacksPerThread; ++u) {
    if (c0 + u * group < packs) {
      Pack<T, kN> out;
#pragma unroll
      for (int e = 0; e < kN; ++e) out.v[e] = from_f32<T>(acc[u][e]);
      dst[c0 + u * group] = out;
    }
  }
}

// Ids a first-phase block of the table pass takes per round (block_pick):
// 4 and 8 were equally fast on the H200, 16 and 32 up to 7% slower
// (float32 tables: fewer rows in flight per SM).
constexpr int kTouchedIds = 8;

// Warp 0 tests up to 32 consecutive ids (or sorted positions) from i0 at
// once, so that their index loads are in flight together; keep(i, j) says
// whether the block works on id i (and may leave what it needs in shared
// slots [j]). Every thread of the block gets the mask of kept lanes j.
template <class Keep>
__device__ __forceinline__ uint32_t block_pick(int64_t i0, int64_t n, int count, Keep keep) {
  __shared__ uint32_t picked;
  if (threadIdx.x < 32) {
    const int64_t i = i0 + threadIdx.x;
    const bool k = int(threadIdx.x) < count && i < n && keep(i, int(threadIdx.x));
    const uint32_t mask = __ballot_sync(0xffffffffu, k);
    if (threadIdx.x == 0) picked = mask;
  }
  __syncthreads();
  return picked;
}

// Hands the picked lanes to the block's row slots in turn: slot s takes the
// s-th, (s + slots)-th, ... set bit of mask.
template <class Each>
__device__ __forceinline__ void for_each_picked(uint32_t mask, const Layout& l, Each each) {
  const int slots = kBlockThreads >> l.shift, slot = threadIdx.x >> l.shift;
  for (int k = 0; mask != 0u; ++k) {
    const int j = __ffs(mask) - 1;
    mask &= mask - 1;
    if (k % slots == slot) each(j);
  }
}

// ------------------------------------------------------------------ forward
// Group g copies table row embedding_row(ids[i]) to out row i (or the fill).
template <typename T, int kN>
__global__ void __launch_bounds__(kBlockThreads) lookup_kernel(EmbeddingFwdParams p, Layout l) {
  using P = Pack<T, kN>;
  const int64_t packs = p.dim / kN;
  const P* __restrict__ table = static_cast<const P*>(p.table);
  P* __restrict__ out = static_cast<P*>(p.out);
  P fill;
#pragma unroll
  for (int j = 0; j < kN; ++j) fill.v[j] = from_f32<T>(p.fill_value);
  const int group = l.group();
  for (int64_t i = l.first_row(); i < p.num_ids; i += l.row_stride()) {
    const int64_t r = embedding_row(p.ids[i], p.rows, p.mode);
    P* dst = out + i * packs;
    if (r >= p.rows) {
      for (int64_t c = l.lane(); c < packs; c += group) dst[c] = fill;
      continue;
    }
    const P* src = table + r * packs;
    for (int64_t c0 = l.lane(); c0 < packs; c0 += group * kLookupPacksPerThread) {
      P v[kLookupPacksPerThread];
#pragma unroll
      for (int u = 0; u < kLookupPacksPerThread; ++u)
        if (c0 + u * group < packs) v[u] = src[c0 + u * group];
#pragma unroll
      for (int u = 0; u < kLookupPacksPerThread; ++u)
        if (c0 + u * group < packs) dst[c0 + u * group] = v[u];
    }
  }
}

// ------------------------------------------------------- fast backward (atomics)
// The fast path's index, in row_index (contract/embedding.h).
struct ChainIndex {
  int32_t *head, *count, *anchor, *next;
  __device__ explicit ChainIndex(const EmbeddingBwdParams& p)
      : head(p.row_index),
        count(p.row_index + p.rows + 1),
        anchor(p.row_index + 2 * p.rows + 1),
        next(p.row_index + 3 * p.rows + 1) {}
};

// Where a hot table row r (anchor: the id that made it hot) is summed in
// float32: float32 tables in the table's own row, 16-bit ones in the
// anchor's scratch row.
template <typename T>
__device__ __forceinline__ float* hot_sums(const EmbeddingBwdParams& p, int64_t r, int64_t anchor) {
  if constexpr (sizeof(T) == sizeof(float)) return static_cast<float*>(p.dtable) + r * p.dim;
  else return p.scratch + anchor * p.dim;
}

// Step 1 of 3: count the ids that read each table row (the counts zeroed
// by the launcher) and chain them: the row's head becomes this id, which
// links to the head before it (the first id's link is never followed, so
// the heads need no zeroing). The id that makes the row hot becomes its
// anchor and zeroes the row's float32 sums (hot_sums) for step 2.
template <typename T, int kN>
__global__ void __launch_bounds__(kBlockThreads) claim_rows_kernel(EmbeddingBwdParams p) {
  using F = Pack<float, kN>;
  const ChainIndex x(p);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.num_ids;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = embedding_row(p.ids[i], p.rows, p.mode);
    if (r >= p.rows) continue;
    x.next[i] = atomicExch(x.head + r, int32_t(i));
    if (atomicAdd(x.count + r, 1) == kEmbeddingChain) {
      F zero;
#pragma unroll
      for (int j = 0; j < kN; ++j) zero.v[j] = 0.f;
      F* sums = reinterpret_cast<F*>(hot_sums<T>(p, r, i));
      for (int64_t c = 0; c < p.dim / kN; ++c) sums[c] = zero;
      x.anchor[r] = int32_t(i);
    }
  }
}

// Ids a block of step 2 takes: the first kAccumulateIds lanes of warp 0
// read their ids' counts at once, and only the hot rows' ids are added.
// (One block per id spent ~20 us of block launches on 16k ids, nearly all
// of them cold; a block per 16 ids still spreads a hot row's adds widely.)
constexpr int kAccumulateIds = 16;

// Step 2: every id of a hot row adds its dout row into the row's float32
// sums (hot_sums).
template <typename T, int kN>
__global__ void __launch_bounds__(kBlockThreads) accumulate_kernel(EmbeddingBwdParams p, Layout l) {
  using P = Pack<T, kN>;
  const int64_t packs = p.dim / kN;
  const P* __restrict__ dout = static_cast<const P*>(p.dout);
  const ChainIndex x(p);
  __shared__ int32_t hot_row[kAccumulateIds], hot_anchor[kAccumulateIds];
  for (int64_t i0 = int64_t(blockIdx.x) * kAccumulateIds; i0 < p.num_ids;
       i0 += int64_t(gridDim.x) * kAccumulateIds) {
    const uint32_t mask = block_pick(i0, p.num_ids, kAccumulateIds, [&](int64_t i, int j) {
      const int64_t r = embedding_row(p.ids[i], p.rows, p.mode);
      if (r >= p.rows || x.count[r] <= kEmbeddingChain) return false;
      hot_row[j] = int32_t(r);
      hot_anchor[j] = x.anchor[r];
      return true;
    });
    for_each_picked(mask, l, [&](int j) {
      float* dst = hot_sums<T>(p, hot_row[j], hot_anchor[j]);
      const int64_t src = (i0 + j) * packs;
      for (int64_t c = l.lane(); c < packs; c += l.group()) {
        float v[kN];
        unpack(dout[src + c], v);
        red_add(dst + c * kN, v);
      }
    });
    __syncthreads();  // the shared slots are rewritten next round
  }
}

// Step 3: every table row once, in two phases (TablePhases). The rows some
// id reads, each by its head id: the head's dout row (one id: the float32
// sum of one term is that term), the sum along the row's chain, or the hot
// row's sums, rounded (float32 tables: already in place). Then zeros.
template <typename T, int kN>
__global__ void __launch_bounds__(kBlockThreads) finalize_kernel(EmbeddingBwdParams p, Layout l,
                                                                 TablePhases ph) {
  using P = Pack<T, kN>;
  using F = Pack<float, kN>;
  constexpr bool kF32 = sizeof(T) == sizeof(float);
  const int64_t packs = p.dim / kN;
  P* __restrict__ dtable = static_cast<P*>(p.dtable);
  const ChainIndex x(p);
  if (!ph.touched()) {
    write_zero_rows(ph, l, p.rows, packs, dtable, [&](int64_t r) { return x.count[r] == 0; });
    return;
  }
  const P* __restrict__ dout = static_cast<const P*>(p.dout);
  const int group = l.group();
  __shared__ int32_t own_row[kTouchedIds], own_n[kTouchedIds], own_anchor[kTouchedIds];
  for (int64_t i0 = int64_t(blockIdx.x) * kTouchedIds; i0 < p.num_ids;
       i0 += ph.touched_blocks * kTouchedIds) {
    const uint32_t mask = block_pick(i0, p.num_ids, kTouchedIds, [&](int64_t i, int j) {
      const int64_t r = embedding_row(p.ids[i], p.rows, p.mode);
      if (r >= p.rows) return false;
      const int32_t head = x.head[r], n = x.count[r];
      if (head != i || (kF32 && n > kEmbeddingChain)) return false;  // float32 hot rows: in place
      own_row[j] = int32_t(r);
      own_n[j] = n;
      if (n > kEmbeddingChain) own_anchor[j] = x.anchor[r];
      return true;
    });
    for_each_picked(mask, l, [&](int j) {
      const int64_t i = i0 + j, n = own_n[j];
      P* dst = dtable + int64_t(own_row[j]) * packs;
      if (n > kEmbeddingChain) {
        const F* sums = reinterpret_cast<const F*>(hot_sums<T>(p, own_row[j], own_anchor[j]));
        for (int64_t c = l.lane(); c < packs; c += group) {
          P out;
#pragma unroll
          for (int e = 0; e < kN; ++e) out.v[e] = from_f32<T>(sums[c].v[e]);
          dst[c] = out;
        }
      } else if (n > 1) {
        for (int64_t c0 = l.lane(); c0 < packs; c0 += group * kPacksPerThread) {
          float acc[kPacksPerThread][kN] = {};
          add_chain(dout, packs, c0, group, int32_t(n), int32_t(i), x.next, acc);
          store_rounded(dst, packs, c0, group, acc);
        }
      } else {
        for (int64_t c = l.lane(); c < packs; c += group) dst[c] = dout[i * packs + c];
      }
    });
    __syncthreads();  // the shared slots are rewritten next round
  }
}

// -------------------------------------------------- deterministic backward
// row_index[r] = first k with sorted_rows[k] >= r, for r in [0, rows]: one
// binary search per thread (sorted_rows is small and stays in L2).
__global__ void __launch_bounds__(kBlockThreads) segment_bounds_kernel(EmbeddingBwdParams p) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r <= p.rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = p.num_ids;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (p.sorted_rows[mid] < r) lo = mid + 1; else hi = mid;
    }
    p.row_index[r] = int32_t(lo);
  }
}

// Each table row sums its run of dout rows in sorted (= position) order,
// float32, and writes the row once (zeros for an empty run): every dtable
// element is one fixed sequence of adds, so the result is bit-identical
// from run to run. Two phases (TablePhases): the runs, each by the block
// slot of its first sorted position, then the zero rows.
template <typename T, int kN>
__global__ void __launch_bounds__(kBlockThreads) segment_sum_kernel(EmbeddingBwdParams p, Layout l,
                                                                    TablePhases ph) {
  using P = Pack<T, kN>;
  const int64_t packs = p.dim / kN;
  P* __restrict__ dtable = static_cast<P*>(p.dtable);
  if (!ph.touched()) {
    write_zero_rows(ph, l, p.rows, packs, dtable,
                    [&](int64_t r) { return p.row_index[r] == p.row_index[r + 1]; });
    return;
  }
  const P* __restrict__ dout = static_cast<const P*>(p.dout);
  const int group = l.group();
  __shared__ int32_t run_row[kTouchedIds], run_end[kTouchedIds];
  for (int64_t k0 = int64_t(blockIdx.x) * kTouchedIds; k0 < p.num_ids;
       k0 += ph.touched_blocks * kTouchedIds) {
    const uint32_t mask = block_pick(k0, p.num_ids, kTouchedIds, [&](int64_t k, int j) {
      const int64_t r = p.sorted_rows[k];
      if (r >= p.rows || (k > 0 && p.sorted_rows[k - 1] == r)) return false;  // not a run's start
      run_row[j] = int32_t(r);
      run_end[j] = p.row_index[r + 1];
      return true;
    });
    for_each_picked(mask, l, [&](int j) {
      const int64_t begin = k0 + j, end = run_end[j];
      for (int64_t c0 = l.lane(); c0 < packs; c0 += group * kPacksPerThread) {
        float acc[kPacksPerThread][kN] = {};
        // No stores in the loop: the compiler may run the unrolled loads ahead.
#pragma unroll 4
        for (int64_t k = begin; k < end; ++k) add_row(dout, int64_t(p.order[k]) * packs, packs, c0, group, acc);
        store_rounded(dtable + int64_t(run_row[j]) * packs, packs, c0, group, acc);
      }
    });
    __syncthreads();  // the shared slots are rewritten next round
  }
}

}  // namespace embedding
}  // namespace jaxcraft
