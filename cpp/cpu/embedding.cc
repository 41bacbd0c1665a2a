// Embedding lookup on the CPU. Forward: row copies, threaded over ids.
// Backward: the ids grouped by table row (a stable counting sort, or the
// caller's sort), then each table row summed in float32 in ascending id
// position order and written once: deterministic, threaded over table rows,
// no two threads touch one row.
#include "cpu/embedding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/cpu/host_float.h"
#include "cpu/parallel.h"
#include "cpu/row_convert.h"

namespace jaxcraft {
namespace {

// ~64K elements per thread keeps thread start-up under a few percent.
constexpr int64_t kMinElementsPerThread = 1 << 16;

int64_t min_rows_per_thread(int64_t dim) {
  return std::max<int64_t>(1, kMinElementsPerThread / std::max<int64_t>(dim, 1));
}

template <typename T>
void fwd_ids(const EmbeddingFwdParams& p, int64_t begin, int64_t end) {
  const int64_t D = p.dim;
  const T* table = static_cast<const T*>(p.table);
  T* out = static_cast<T*>(p.out);
  const T fill = from_float<T>(p.fill_value);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t r = embedding_row(p.ids[i], p.rows, p.mode);
    T* dst = out + i * D;
    if (r < p.rows) {
      std::memcpy(dst, table + r * D, sizeof(T) * D);
    } else {
      std::fill(dst, dst + D, fill);
    }
  }
}

// Rows [begin, end) of dtable from the runs starts[r]..starts[r + 1] of `order`.
template <typename T>
void bwd_rows(const EmbeddingBwdParams& p, const int32_t* starts, const int32_t* order,
              int64_t begin, int64_t end) {
  const int64_t D = p.dim;
  const T* dout = static_cast<const T*>(p.dout);
  T* dtable = static_cast<T*>(p.dtable);
  std::vector<float> acc(D);
  for (int64_t r = begin; r < end; ++r) {
    T* dst = dtable + r * D;
    if (starts[r] == starts[r + 1]) {
      std::memset(dst, 0, sizeof(T) * D);  // +0 in every dtype
      continue;
    }
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t k = starts[r]; k < starts[r + 1]; ++k) {
      const T* src = dout + int64_t(order[k]) * D;
      for (int64_t c = 0; c < D; ++c) acc[c] += to_float(src[c]);
    }
    cpu::store_row(acc.data(), D, dst);
  }
}

template <typename T>
void fwd_typed(const EmbeddingFwdParams& p, const TaskRunner* runner) {
  parallel_for(runner, p.num_ids, min_rows_per_thread(p.dim),
               [&](int64_t b, int64_t e) { fwd_ids<T>(p, b, e); });
}

template <typename T>
void bwd_typed(const EmbeddingBwdParams& p, const TaskRunner* runner) {
  const int64_t V = p.rows, N = p.num_ids;
  std::vector<int32_t> own_starts, own_order;
  int32_t* starts = p.row_index;  // its first V + 1 entries
  if (!starts) {
    own_starts.resize(V + 1);
    starts = own_starts.data();
  }
  const int32_t* order = p.order;
  if (p.sorted_rows) {
    // The caller's stable sort: run r starts at the first sorted row >= r.
    for (int64_t r = 0; r <= V; ++r)
      starts[r] = int32_t(std::lower_bound(p.sorted_rows, p.sorted_rows + N, int32_t(r)) -
                          p.sorted_rows);
  } else {
    // Counting sort by table row, stable: positions ascend within a row.
    std::vector<int32_t> rows(N);
    std::fill(starts, starts + V + 1, 0);
    for (int64_t i = 0; i < N; ++i) {
      rows[i] = int32_t(embedding_row(p.ids[i], V, p.mode));
      if (rows[i] < V) ++starts[rows[i] + 1];
    }
    for (int64_t r = 0; r < V; ++r) starts[r + 1] += starts[r];
    own_order.resize(starts[V]);
    std::vector<int32_t> next(starts, starts + V);
    for (int64_t i = 0; i < N; ++i)
      if (rows[i] < V) own_order[next[rows[i]]++] = int32_t(i);
    order = own_order.data();
  }
  parallel_for(runner, V, min_rows_per_thread(p.dim),
               [&](int64_t b, int64_t e) { bwd_rows<T>(p, starts, order, b, e); });
}

}  // namespace

void embedding_fwd_cpu(const EmbeddingFwdParams& p, const TaskRunner* runner) {
  if (p.num_ids == 0 || p.dim == 0 || p.rows < 1) return;
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return fwd_typed<decltype(x)>(p, runner); });
}

void embedding_bwd_cpu(const EmbeddingBwdParams& p, const TaskRunner* runner) {
  if (p.rows == 0 || p.dim == 0) return;
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return bwd_typed<decltype(x)>(p, runner); });
}

}  // namespace jaxcraft
