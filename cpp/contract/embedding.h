// The host <-> kernel contract for the embedding lookup (CPU and CUDA).
// Plain data only. The table is [rows, dim]; ids are int32, any number of them.
#pragma once
#include <cstdint>

#include "contract/dtype.h"

#if defined(__CUDACC__)
#define JAXCRAFT_HOST_DEVICE __host__ __device__
#else
#define JAXCRAFT_HOST_DEVICE
#endif

namespace jaxcraft {

// How an id outside [0, rows) is read, as jnp.take's `mode` (jaxcraft/ops/embedding.py):
//   kFill: a negative id counts from the end once (id + rows); still outside
//          [0, rows): the output row is `fill_value`, and the backward drops it.
//   kClip: clamped to [0, rows - 1] (negative ids read row 0).
//   kWrap: id mod rows, the result in [0, rows).
enum class EmbeddingMode : int32_t { kFill = 0, kClip = 1, kWrap = 2 };

// The table row an id reads, or `rows` when it reads none (kFill out of range).
// rows >= 1.
JAXCRAFT_HOST_DEVICE inline int64_t embedding_row(int32_t id, int64_t rows, EmbeddingMode mode) {
  const int64_t i = id;
  switch (mode) {
    case EmbeddingMode::kClip: return i < 0 ? 0 : (i >= rows ? rows - 1 : i);
    case EmbeddingMode::kWrap: {
      const int64_t m = i % rows;
      return m < 0 ? m + rows : m;
    }
    default: {
      const int64_t r = i < 0 ? i + rows : i;
      return (r < 0 || r >= rows) ? rows : r;
    }
  }
}

// Forward: out[i, :] = table[embedding_row(ids[i]), :], or fill_value.
//   table : [rows, dim] in `dtype`;  ids : [num_ids] int32;  out : [num_ids, dim]
struct EmbeddingFwdParams {
  DType dtype = DType::kF32;
  int64_t rows = 0, dim = 0, num_ids = 0;
  EmbeddingMode mode = EmbeddingMode::kFill;
  float fill_value = 0.f;  // already rounded to `dtype` by the caller
  const void* table = nullptr;
  const int32_t* ids = nullptr;
  void* out = nullptr;
};

// Backward: dtable[r, :] = sum of dout[i, :] over the ids i that read row r,
// accumulated in float32 and rounded once to `dtype`; rows no id reads are 0.
//   dout : [num_ids, dim] in `dtype`;  ids : [num_ids] int32;  dtable : [rows, dim]
// Two ways (CUDA), chosen by `sorted_rows`:
//  - sorted_rows == null (fast): the ids that read table row r are counted
//    and chained (the row's head is the last of them to arrive, each id
//    links to the one before it). A row read by at most kEmbeddingChain ids
//    is summed in float32 along its chain by the pass that writes it. A row
//    read more often (a hot row) is summed first by float32 red.adds of all
//    its ids: in place in a float32 dtable, else in `scratch` row `anchor`
//    ([num_ids, dim], 16-bit tables only), the anchor being the id that
//    arrived (kEmbeddingChain + 1)-th and zeroed those sums. The pass writes
//    every other table row once: zeros, the only id's dout row (an exact
//    copy), or the chain's or the scratch row's rounded sum.
//  - sorted_rows != null (deterministic, bit-identical across runs):
//    sorted_rows[k] = embedding_row(ids[order[k]]) in ascending order, equal
//    rows by ascending position (a stable sort; `rows` marks dropped ids).
//    row_index[r] becomes the first k with sorted_rows[k] >= r, and each table
//    row sums its run of dout rows in that order. No atomics.
// The CPU always sums in ascending position order (its own counting sort when
// sorted_rows is null), so both of its paths are deterministic.
struct EmbeddingBwdParams {
  DType dtype = DType::kF32;
  int64_t rows = 0, dim = 0, num_ids = 0;
  EmbeddingMode mode = EmbeddingMode::kFill;
  const void* dout = nullptr;
  const int32_t* ids = nullptr;
  const int32_t* sorted_rows = nullptr;  // null: the fast (atomic) path
  const int32_t* order = nullptr;        // with sorted_rows
  void* dtable = nullptr;
  float* scratch = nullptr;     // [num_ids, dim]: fast path, 16-bit dtypes (else null)
  int32_t* row_index = nullptr; // [embedding_index_entries(rows, num_ids)] int32 scratch
};

// The row_index scratch's length: the runs' starts (deterministic) or the
// rows' heads (fast) [rows + 1]; the fast path's counts [rows], anchors
// [rows] and chain links [num_ids].
JAXCRAFT_HOST_DEVICE constexpr int64_t embedding_index_entries(int64_t rows, int64_t num_ids) {
  return 3 * rows + 1 + num_ids;
}

// The longest chain the fast path's table pass walks: the walk's loads wait
// on each other (one L2 round trip per id), while a hot row's adds run in
// parallel; a chain of thousands of ids would stall its group.
constexpr int kEmbeddingChain = 32;

}  // namespace jaxcraft
