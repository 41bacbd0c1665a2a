// The host <-> kernel contract for the embedding lookup (CPU and CUDA).
// Plain data only. The table is [rows, dim]; ids are int32, any number of them.
#pragma once
#include <cstdint>

#include "common/dtype.h"

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
//  - sorted_rows == null (fast): float32 atomics. float32 tables add straight
//    into dtable. 16-bit tables: row_index[rows + r] counts the ids that read
//    row r and row_index[r] names one of them (its owner); a row read more
//    than once is summed in float32 `scratch` row owner ([num_ids, dim]);
//    then one pass over the table writes every row: zeros, the owner's dout
//    row (read once: an exact copy), or the rounded scratch sum.
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
  int32_t* row_index = nullptr; // [2 * rows + 1] int32 scratch
};

}  // namespace jaxcraft
