// Layer norm / RMS norm on the CPU, threaded over rows. Per row: load it
// into float32 scratch (adding the residual, rounded to the dtype as h is
// defined), two-pass statistics over the scratch, normalize it in place,
// store it. The conversions are whole-row calls (cpu/row_convert.h: F16C
// for float16) and the float loops are compiled for AVX2 + FMA and the
// baseline (cpu/isa_clones.h).
#include "cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "common/cpu/host_float.h"
#include "cpu/isa_clones.h"
#include "cpu/lane_reduce.h"
#include "cpu/parallel.h"
#include "cpu/row_convert.h"

namespace jaxcraft {
namespace {

using cpu::lane_sum;
using cpu::load_row;
using cpu::store_row;

// ~64K elements per thread keeps thread start-up under a few percent.
constexpr int64_t kMinElementsPerThread = 1 << 16;

int64_t min_rows_per_thread(int64_t cols) {
  return std::max<int64_t>(1, kMinElementsPerThread / std::max<int64_t>(cols, 1));
}

// h = (h - mean) rstd (* scale) (+ bias) in place: one branch-free loop per case.
template <bool kScale, bool kBias>
[[gnu::always_inline]] inline void normalize(float* __restrict__ h, int64_t n, float mean,
                                             float rstd, const float* __restrict__ scale,
                                             const float* __restrict__ bias) {
  for (int64_t c = 0; c < n; ++c) {
    float out = (h[c] - mean) * rstd;
    if constexpr (kScale) out *= scale[c];
    if constexpr (kBias) out += bias[c];
    h[c] = out;
  }
}

// The forward's float work on row r (in h): its statistics, then the row
// normalized in place.
JAXCRAFT_CPU_CLONES void normalize_row(const NormFwdParams& p, int64_t r, float* __restrict__ h) {
  const int64_t n = p.cols;
  const float mean = p.rms ? 0.f : lane_sum(n, [&](int64_t c) { return h[c]; }) / n;
  // Two-pass variance over the float row: no cancellation for large means.
  const float var = lane_sum(n, [&](int64_t c) { return (h[c] - mean) * (h[c] - mean); }) / n;
  const float rstd = 1.f / std::sqrt(var + p.epsilon);
  if (p.mean) p.mean[r] = mean;
  p.rstd[r] = rstd;
  if (p.scale && p.bias) normalize<true, true>(h, n, mean, rstd, p.scale, p.bias);
  else if (p.scale) normalize<true, false>(h, n, mean, rstd, p.scale, p.bias);
  else if (p.bias) normalize<false, true>(h, n, mean, rstd, p.scale, p.bias);
  else normalize<false, false>(h, n, mean, rstd, p.scale, p.bias);
}

JAXCRAFT_CPU_CLONES void add_row(float* __restrict__ h, const float* __restrict__ r, int64_t n) {
  for (int64_t c = 0; c < n; ++c) h[c] += r[c];
}

template <typename T>
void fwd_rows(const NormFwdParams& p, int64_t begin, int64_t end) {
  const int64_t C = p.cols;
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  T* h_out = static_cast<T*>(p.h_out);
  constexpr bool kFloat = std::is_same_v<T, float>;
  // float32 rows are normalized in y itself (a pass less), 16-bit ones in
  // scratch; float32 residual rows are read where they are.
  std::vector<float> scratch(kFloat ? 0 : C), res_row(res && !kFloat ? C : 0);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t base = r * C;
    float* h = scratch.data();
    if constexpr (kFloat) h = y + base;
    load_row(x + base, C, h);
    if (res) {
      add_row(h, cpu::float_row(res + base, C, res_row.data()), C);
      store_row(h, C, h_out + base);
      // h is defined in the input dtype: rounded before it is normalized.
      if constexpr (!kFloat) load_row(h_out + base, C, h);
    }
    normalize_row(p, r, h);
    if constexpr (!kFloat) store_row(h, C, y + base);
  }
}

// The backward's float work on row r: from dy (in g) and h (in xhat), dh
// into g; the row's terms added to dscale and dbias (null: not wanted).
JAXCRAFT_CPU_CLONES void bwd_row(const NormBwdParams& p, int64_t r, float* __restrict__ g,
                                 float* __restrict__ xhat, const float* __restrict__ dh_extra,
                                 float* __restrict__ dscale, float* __restrict__ dbias) {
  const int64_t n = p.cols;
  const float mean = p.mean ? p.mean[r] : 0.f;
  const float rstd = p.rstd[r];
  for (int64_t c = 0; c < n; ++c) {
    const float dyv = g[c];
    xhat[c] = (xhat[c] - mean) * rstd;
    g[c] = p.scale ? dyv * p.scale[c] : dyv;
    if (dscale) dscale[c] += dyv * xhat[c];
    if (dbias) dbias[c] += dyv;
  }
  const float mean_g = p.rms ? 0.f : lane_sum(n, [&](int64_t c) { return g[c]; }) / n;
  const float mean_gx = lane_sum(n, [&](int64_t c) { return g[c] * xhat[c]; }) / n;
  for (int64_t c = 0; c < n; ++c) {
    float d = rstd * (g[c] - mean_g - xhat[c] * mean_gx);
    if (dh_extra) d += dh_extra[c];
    g[c] = d;
  }
}

// Partial `part` owns rows part, part + P, part + 2P, ...: the same row split
// as the CUDA kernel, so both produce the same partial-sum layout.
template <typename T>
void bwd_partials(const NormBwdParams& p, int64_t part_begin, int64_t part_end) {
  const int64_t C = p.cols, P = p.num_partials;
  const T* dy = static_cast<const T*>(p.dy);
  const T* h = static_cast<const T*>(p.h);
  const T* dh_extra = static_cast<const T*>(p.dh_extra);
  T* dh = static_cast<T*>(p.dh);
  constexpr bool kFloat = std::is_same_v<T, float>;
  // float32 rows compute dh in dh itself, 16-bit ones in scratch.
  std::vector<float> scratch(kFloat ? 0 : C), xhat(C), extra(dh_extra && !kFloat ? C : 0);
  for (int64_t part = part_begin; part < part_end; ++part) {
    float* dscale = p.dscale_partial ? p.dscale_partial + part * C : nullptr;
    float* dbias = p.dbias_partial ? p.dbias_partial + part * C : nullptr;
    if (dscale) std::fill(dscale, dscale + C, 0.f);
    if (dbias) std::fill(dbias, dbias + C, 0.f);
    for (int64_t r = part; r < p.rows; r += P) {
      const int64_t base = r * C;
      float* g = scratch.data();
      if constexpr (kFloat) g = dh + base;
      load_row(dy + base, C, g);
      load_row(h + base, C, xhat.data());
      const float* extra_row =
          dh_extra ? cpu::float_row(dh_extra + base, C, extra.data()) : nullptr;
      bwd_row(p, r, g, xhat.data(), extra_row, dscale, dbias);
      if constexpr (!kFloat) store_row(g, C, dh + base);
    }
  }
}

void fwd_parallel(const NormFwdParams& p, const TaskRunner* runner,
                  void (*rows)(const NormFwdParams&, int64_t, int64_t)) {
  parallel_for(runner, p.rows, min_rows_per_thread(p.cols),
               [&](int64_t b, int64_t e) { rows(p, b, e); });
}

void bwd_parallel(const NormBwdParams& p, const TaskRunner* runner,
                  void (*partials)(const NormBwdParams&, int64_t, int64_t)) {
  const int64_t rows_per_partial = std::max<int64_t>(1, p.rows / std::max<int64_t>(p.num_partials, 1));
  const int64_t min_partials = std::max<int64_t>(1, min_rows_per_thread(p.cols) / rows_per_partial);
  parallel_for(runner, p.num_partials, min_partials,
               [&](int64_t b, int64_t e) { partials(p, b, e); });
}

}  // namespace

void norm_fwd_cpu(const NormFwdParams& p, const TaskRunner* runner) {
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return fwd_parallel(p, runner, fwd_rows<decltype(x)>); });
}

void norm_bwd_cpu(const NormBwdParams& p, const TaskRunner* runner) {
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return bwd_parallel(p, runner, bwd_partials<decltype(x)>); });
}

}  // namespace jaxcraft
