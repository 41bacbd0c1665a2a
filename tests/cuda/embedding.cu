// Standalone correctness + speed check of the CUDA embedding kernels against
// a CPU reference (not part of the library build). From the repo root:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -gencode=arch=compute_80,code=sm_80 \
//     -gencode=arch=compute_90a,code=sm_90a tests/cuda/embedding.cu \
//     cpp/kernels/embedding/launch_embedding.cu -o /tmp/emb_test && /tmp/emb_test
// Exit status 0 only when every case passes. Covers the forward (16-byte and
// scalar packs, every mode, fill rows), the fast backward (float32 atomics
// into dtable; 16-bit tables through the claimed scratch rows) against a
// float64 reference, and the deterministic backward bit for bit against a
// sequential float32 sum in position order, run twice.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "common/testing/standalone_buffers.h"
#include "common/testing/standalone_check.h"
#include "common/testing/standalone_data.h"
#include "common/testing/standalone_timing.h"
#include "kernels/embedding/launch.h"

using jaxcraft::DType;
using jaxcraft::EmbeddingBwdParams;
using jaxcraft::EmbeddingFwdParams;
using jaxcraft::EmbeddingMode;
using jaxcraft::embedding_index_entries;

namespace {

using namespace jaxcraft_test;

constexpr double kF32Eps = 1.0 / (1 << 24);  // float32 rounding, relative
constexpr int kTimingReps = 20;

const char* mname(EmbeddingMode m) {
  return m == EmbeddingMode::kFill ? "fill" : m == EmbeddingMode::kClip ? "clip" : "wrap";
}

// Half the spacing of the smallest subnormals: the rounding's absolute floor.
double half_subnormal(DType dt) {
  return dt == DType::kF16 ? std::ldexp(1.0, -25) : dt == DType::kBF16 ? std::ldexp(1.0, -134)
                                                                       : std::ldexp(1.0, -150);
}

// Half an ulp of the final rounding, relative.
double half_ulp(DType dt) {
  switch (dt) {
    case DType::kBF16: return 1.0 / (1 << 8);
    case DType::kF16: return 1.0 / (1 << 11);
    case DType::kF32: return kF32Eps;
  }
  return 0;
}

// The row an id reads (the contract of contract/embedding.h, written out independently).
int64_t ref_row(int64_t id, int64_t rows, EmbeddingMode m) {
  if (m == EmbeddingMode::kClip) return std::min(std::max<int64_t>(id, 0), rows - 1);
  if (m == EmbeddingMode::kWrap) return ((id % rows) + rows) % rows;
  const int64_t r = id < 0 ? id + rows : id;
  return (r >= 0 && r < rows) ? r : -1;
}

struct Case {
  DType dt;
  int64_t rows, dim, num_ids;
  EmbeddingMode mode;
  int misalign = 0;  // elements: views of table/out off 16-byte alignment (scalar path)
  double hot = 0;    // fraction of ids drawn from 3 rows (long runs, contended atomics)
};

bool run_case(const Case& c, uint64_t seed) {
  const int64_t V = c.rows, D = c.dim, N = c.num_ids;
  const size_t es = dsize(c.dt);
  Rng rng{seed};
  std::vector<uint8_t> table(V * D * es), dout(N * D * es);
  std::vector<double> table_v(V * D), dout_v(N * D);
  for (int64_t i = 0; i < V * D; ++i) table_v[i] = put(table, i, rng.normal(), c.dt);
  for (int64_t i = 0; i < N * D; ++i) dout_v[i] = put(dout, i, rng.normal(), c.dt);
  std::vector<int32_t> ids(N);
  const int64_t lim = V + V / 3 + 1;
  for (int64_t i = 0; i < N; ++i) {
    ids[i] = rng.uniform() < c.hot ? int32_t(rng.range(0, 3) * (V / 3)) : int32_t(rng.range(-lim, lim));
  }
  if (N > 2) {
    ids[0] = std::numeric_limits<int32_t>::min();
    ids[1] = std::numeric_limits<int32_t>::max();
  }
  std::vector<int64_t> rows_of(N);
  for (int64_t i = 0; i < N; ++i) rows_of[i] = ref_row(ids[i], V, c.mode);

  std::printf("%-4s %s V=%-5lld D=%-5lld N=%-5lld%s%s:", dname(c.dt), mname(c.mode), (long long)V,
              (long long)D, (long long)N, c.misalign ? " misaligned" : "", c.hot ? " hot" : "");
  bool ok = true;
  const size_t off = c.misalign * es;

  // Forward: a copy, so exact (fill rows NaN).
  {
    DeviceBuffer d_table(table.size()), d_ids(ids.data(), N * 4), d_out(N * D * es);
    CHECK(cudaMemcpy(static_cast<uint8_t*>(d_table.p) + off, table.data(), table.size(),
                     cudaMemcpyHostToDevice));
    EmbeddingFwdParams p;
    p.dtype = c.dt;
    p.rows = V;
    p.dim = D;
    p.num_ids = N;
    p.mode = c.mode;
    p.fill_value = std::numeric_limits<float>::quiet_NaN();
    p.table = static_cast<uint8_t*>(d_table.p) + off;
    p.ids = static_cast<int32_t*>(d_ids.p);
    p.out = static_cast<uint8_t*>(d_out.p) + off;
    CHECK(jaxcraft::launch_embedding_fwd(p, nullptr));
    CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> out = d_out.back(off);
    int64_t bad = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t d = 0; d < D; ++d) {
        const double got = get(out, i * D + d, c.dt);
        const bool good = rows_of[i] < 0 ? std::isnan(got) : got == table_v[rows_of[i] * D + d];
        bad += !good;
      }
    std::printf(" fwd %s", bad ? "FAIL" : "ok");
    if (bad) std::printf("(%lld wrong)", (long long)bad);
    ok &= bad == 0;
  }

  // Backward references: float64 sums (and their magnitude), and the
  // deterministic kernel's exact arithmetic: float32 adds in position order.
  std::vector<double> ref(V * D, 0.0), mag(V * D, 0.0);
  std::vector<float> seq(V * D, 0.f);
  std::vector<int64_t> count(V, 0);
  for (int64_t i = 0; i < N; ++i) {
    if (rows_of[i] < 0) continue;
    ++count[rows_of[i]];
    for (int64_t d = 0; d < D; ++d) {
      const int64_t k = rows_of[i] * D + d;
      ref[k] += dout_v[i * D + d];
      mag[k] += std::fabs(dout_v[i * D + d]);
      seq[k] += float(dout_v[i * D + d]);
    }
  }
  std::vector<uint8_t> seq_bytes(V * D * es);
  for (int64_t k = 0; k < V * D; ++k) put(seq_bytes, k, seq[k], c.dt);
  // Stable sort of (row, position); `V` marks ids that read no row.
  std::vector<int32_t> order(N), sorted_rows(N);
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int32_t i) { return rows_of[i] < 0 ? V : rows_of[i]; };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) < key(b); });
  for (int64_t k = 0; k < N; ++k) sorted_rows[k] = int32_t(key(order[k]));

  DeviceBuffer d_dout(dout.data(), dout.size()), d_ids(ids.data(), N * 4);
  DeviceBuffer d_sorted(sorted_rows.data(), N * 4), d_order(order.data(), N * 4);
  for (bool deterministic : {false, true}) {
    DeviceBuffer d_dtable(V * D * es), d_scratch(N * D * 4), d_index(embedding_index_entries(V, N) * 4);
    EmbeddingBwdParams p;
    p.dtype = c.dt;
    p.rows = V;
    p.dim = D;
    p.num_ids = N;
    p.mode = c.mode;
    p.dout = d_dout.p;
    p.ids = static_cast<int32_t*>(d_ids.p);
    p.sorted_rows = deterministic ? static_cast<int32_t*>(d_sorted.p) : nullptr;
    p.order = deterministic ? static_cast<int32_t*>(d_order.p) : nullptr;
    p.dtable = d_dtable.p;
    p.scratch = (!deterministic && c.dt != DType::kF32) ? static_cast<float*>(d_scratch.p) : nullptr;
    p.row_index = static_cast<int32_t*>(d_index.p);
    CHECK(jaxcraft::launch_embedding_bwd(p, nullptr));
    CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> got = d_dtable.back();
    if (deterministic) {
      // Bit for bit the sequential float32 sum, and again on a second run.
      const bool same = std::memcmp(got.data(), seq_bytes.data(), got.size()) == 0;
      CHECK(cudaMemset(d_dtable.p, kPoison, d_dtable.bytes));
      CHECK(jaxcraft::launch_embedding_bwd(p, nullptr));
      CHECK(cudaDeviceSynchronize());
      const bool again = d_dtable.back() == got;
      std::printf(" bwd-det %s", same && again ? "ok" : "FAIL");
      if (!same) std::printf("(differs from the sequential float32 sum)");
      if (!again) std::printf("(two runs differ)");
      ok &= same && again;
    } else {
      double worst = 0;
      for (int64_t k = 0; k < V * D; ++k) {
        const double g = get(got, k, c.dt);
        // float32 sums of count terms in any order, then one rounding.
        const double tol = half_ulp(c.dt) * std::fabs(ref[k]) +
                           2.0 * count[k / D] * kF32Eps * mag[k] * (1 + half_ulp(c.dt)) + half_subnormal(c.dt);
        const double e = count[k / D] == 0 ? (g == 0.0 ? 0.0 : INFINITY) : std::fabs(g - ref[k]) / tol;
        if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
      }
      std::printf(" bwd-fast=%.2f%s", worst, worst <= 1.0 ? "" : "(FAIL)");
      ok &= worst <= 1.0;
    }
  }
  std::printf("  %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

// The benchmark shapes; bytes as bench/specs.py's EmbeddingSpec counts
// them: forward N rows read + written; backward the cotangent read and the
// whole dense dtable written once. The deterministic path's sort (XLA's, in
// the library) is not timed here.
void time_case(DType dt, int64_t V, int64_t D, int64_t N, double skew, int64_t hot, float copy_gbps) {
  const size_t es = dsize(dt);
  Rng rng{7};
  std::vector<int64_t> hot_rows(hot);
  for (auto& r : hot_rows) r = rng.range(0, V);
  std::vector<int32_t> ids(N);
  for (auto& id : ids) id = int32_t(rng.uniform() < skew ? hot_rows[rng.range(0, hot)] : rng.range(0, V));
  std::vector<int32_t> order(N), sorted_rows(N);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  for (int64_t k = 0; k < N; ++k) sorted_rows[k] = ids[order[k]];
  DeviceBuffer table(V * D * es), out(N * D * es), dout(N * D * es), dtable(V * D * es);
  DeviceBuffer scratch(N * D * 4), index(embedding_index_entries(V, N) * 4);
  DeviceBuffer d_ids(ids.data(), N * 4), d_sorted(sorted_rows.data(), N * 4), d_order(order.data(), N * 4);
  constexpr int kSmallValues = 0x3c;  // ~0.01 in bf16 (0x3c3c) and float32, finite sums
  CHECK(cudaMemset(table.p, kSmallValues, table.bytes));
  CHECK(cudaMemset(dout.p, kSmallValues, dout.bytes));
  EmbeddingFwdParams fp;
  fp.dtype = dt;
  fp.rows = V;
  fp.dim = D;
  fp.num_ids = N;
  fp.table = table.p;
  fp.ids = static_cast<int32_t*>(d_ids.p);
  fp.out = out.p;
  EmbeddingBwdParams bp;
  bp.dtype = dt;
  bp.rows = V;
  bp.dim = D;
  bp.num_ids = N;
  bp.dout = dout.p;
  bp.ids = fp.ids;
  bp.dtable = dtable.p;
  bp.scratch = dt == DType::kF32 ? nullptr : static_cast<float*>(scratch.p);
  bp.row_index = static_cast<int32_t*>(index.p);
  EmbeddingBwdParams dp = bp;
  dp.scratch = nullptr;
  dp.sorted_rows = static_cast<int32_t*>(d_sorted.p);
  dp.order = static_cast<int32_t*>(d_order.p);
  auto time_ms = [&](auto launch) { return mean_launch_ms(launch, kTimingReps); };
  const float fwd = time_ms([&] { return jaxcraft::launch_embedding_fwd(fp, nullptr); });
  const float fast = time_ms([&] { return jaxcraft::launch_embedding_bwd(bp, nullptr); });
  const float det = time_ms([&] { return jaxcraft::launch_embedding_bwd(dp, nullptr); });
  const double fwd_bytes = 2.0 * N * D * es + 4.0 * N;
  const double bwd_bytes = double(N + V) * D * es + 4.0 * N;
  auto gbps = [](double bytes, float ms) { return bytes / ms / 1e6; };
  std::printf("timing %s V=%lld D=%lld N=%lld %s: fwd %.1f us %.0f GB/s (%.0f%%)  "
              "bwd fast %.1f us %.0f GB/s (%.0f%%)  bwd det %.1f us %.0f GB/s (%.0f%%)\n",
              dname(dt), (long long)V, (long long)D, (long long)N, skew ? "skewed" : "uniform", fwd * 1e3,
              gbps(fwd_bytes, fwd), 100 * gbps(fwd_bytes, fwd) / copy_gbps, fast * 1e3,
              gbps(bwd_bytes, fast), 100 * gbps(bwd_bytes, fast) / copy_gbps, det * 1e3,
              gbps(bwd_bytes, det), 100 * gbps(bwd_bytes, det) / copy_gbps);
}

}  // namespace

int main(int argc, char** argv) {
  // --timing-only: skip the checks (profiling the benchmark shapes);
  // --no-timing: the checks only (the sanitizers).
  const char* mode = argc > 1 ? argv[1] : "";
  const bool checks = std::strcmp(mode, "--timing-only") != 0;
  const bool timing = std::strcmp(mode, "--no-timing") != 0;
  int device = 0, major = 0, minor = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  std::printf("device sm_%d%d\n", major, minor);

  std::vector<Case> cases;
  const DType kTypes[] = {DType::kBF16, DType::kF32, DType::kF16};
  const EmbeddingMode kModes[] = {EmbeddingMode::kFill, EmbeddingMode::kClip, EmbeddingMode::kWrap};
  // D: 1, primes, pack multiples (4 f32 / 8 16-bit), wide rows (a whole block
  // per row, several packs per thread); N: 1 id, more ids than rows.
  const int64_t kDims[] = {1, 7, 8, 64, 257, 1000, 4096};
  for (DType dt : kTypes)
    for (EmbeddingMode m : kModes)
      for (int64_t D : kDims) {
        if (dt == DType::kF16 && m != EmbeddingMode::kFill) continue;  // shares bf16's code
        cases.push_back({dt, 37, D, D >= 1000 ? 300 : 1000, m});
      }
  for (DType dt : kTypes) {
    cases.push_back({dt, 5, 64, 1, EmbeddingMode::kFill});
    cases.push_back({dt, 1, 16, 50, EmbeddingMode::kWrap});
    cases.push_back({dt, 1000, 520, 2000, EmbeddingMode::kFill, 0, 0.9});  // long runs
    cases.push_back({dt, 37, 64, 200, EmbeddingMode::kClip, 1});           // scalar path
  }
  // More ids than the table pass's first phase has blocks for (65536 x 8):
  // its grid-stride rounds, every row hot (~600 ids each).
  for (DType dt : {DType::kBF16, DType::kF32}) cases.push_back({dt, 1000, 8, 600000, EmbeddingMode::kWrap});
  bool all_ok = true;
  uint64_t seed = 1;
  if (checks)
    for (const Case& c : cases) all_ok &= run_case(c, seed++);

  if (timing) {
    const float copy = copy_bandwidth_gbps(kTimingReps);
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy);
    for (DType dt : {DType::kBF16, DType::kF32}) {
      time_case(dt, 131072, 4096, 16384, 0.0, 100, copy);
      time_case(dt, 131072, 4096, 16384, 0.9, 100, copy);
      time_case(dt, 32768, 1024, 16384, 0.0, 100, copy);
      time_case(dt, 32768, 1024, 16384, 0.9, 100, copy);
    }
  }

  std::printf("%s\n", all_ok ? "ALL PASS" : "SOME FAILED");
  return all_ok ? 0 : 1;
}
