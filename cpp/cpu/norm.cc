// Layer norm / RMS norm on the CPU: one pass to load a row into float32
// scratch (adding the residual), two-pass statistics over that scratch, one
// pass to write. Threaded over rows; each dtype's row loops compiled for
// AVX2 + FMA and the baseline (cpu/isa_clones.h): with that, the 16-bit
// forwards ran 1.7-3.3x faster (bench/NOTES.md, forty-fifth session).
#include "cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/host_float.h"
#include "cpu/isa_clones.h"
#include "cpu/parallel.h"

namespace jaxcraft {
namespace {

// ~64K elements per thread keeps thread start-up under a few percent.
constexpr int64_t kMinElementsPerThread = 1 << 16;

// Independent partial sums: lets the compiler vectorize reductions that a
// single serial accumulator would bind to the add latency (~4 cycles/elem).
constexpr int kLanes = 16;

template <typename Term>
[[gnu::always_inline]] inline float lane_sum(int64_t n, Term term) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(c + l);
  for (; c < n; ++c) acc[0] += term(c);
  float total = 0.f;
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

int64_t min_rows_per_thread(int64_t cols) {
  return std::max<int64_t>(1, kMinElementsPerThread / std::max<int64_t>(cols, 1));
}

// y = (h - mean) rstd (* scale) (+ bias) in T: one branch-free loop per case.
template <bool kScale, bool kBias, typename T>
[[gnu::always_inline]] inline void write_normalized(const float* __restrict__ h, int64_t n,
                                                    float mean, float rstd,
                                                    const float* __restrict__ scale,
                                                    const float* __restrict__ bias,
                                                    T* __restrict__ y) {
  for (int64_t c = 0; c < n; ++c) {
    float out = (h[c] - mean) * rstd;
    if constexpr (kScale) out *= scale[c];
    if constexpr (kBias) out += bias[c];
    y[c] = from_float<T>(out);
  }
}

// h = x + res in T (h_out), and as floats (h). Distinct pointers for the
// vectorizer (x and res may be one buffer: both are only read).
template <typename T>
[[gnu::always_inline]] inline void add_residual(const T* __restrict__ x, const T* __restrict__ res,
                                                int64_t n, T* __restrict__ h_out,
                                                float* __restrict__ h) {
  for (int64_t c = 0; c < n; ++c) {
    // h is defined in the input dtype: round before normalizing. (Read back
    // from h_out: a local copy of the sum kept the loop from vectorizing.)
    h_out[c] = from_float<T>(to_float(x[c]) + to_float(res[c]));
    h[c] = to_float(h_out[c]);
  }
}

template <typename T>
[[gnu::always_inline]] inline void widen(const T* __restrict__ x, int64_t n,
                                         float* __restrict__ h) {
  for (int64_t c = 0; c < n; ++c) h[c] = to_float(x[c]);
}

template <typename T>
[[gnu::always_inline]] inline void fwd_rows(const NormFwdParams& p, int64_t begin, int64_t end) {
  const int64_t C = p.cols;
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  T* h_out = static_cast<T*>(p.h_out);
  std::vector<float> h(C);
  float* hv = h.data();
  for (int64_t r = begin; r < end; ++r) {
    const int64_t base = r * C;
    if (res) add_residual(x + base, res + base, C, h_out + base, hv);
    else widen(x + base, C, hv);
    const float mean = p.rms ? 0.f : lane_sum(C, [&](int64_t c) { return hv[c]; }) / C;
    // Two-pass variance over the float row: no cancellation for large means.
    const float var = lane_sum(C, [&](int64_t c) { return (hv[c] - mean) * (hv[c] - mean); }) / C;
    const float rstd = 1.f / std::sqrt(var + p.epsilon);
    if (p.mean) p.mean[r] = mean;
    p.rstd[r] = rstd;
    T* yr = y + base;
    if (p.scale && p.bias) write_normalized<true, true>(hv, C, mean, rstd, p.scale, p.bias, yr);
    else if (p.scale) write_normalized<true, false>(hv, C, mean, rstd, p.scale, p.bias, yr);
    else if (p.bias) write_normalized<false, true>(hv, C, mean, rstd, p.scale, p.bias, yr);
    else write_normalized<false, false>(hv, C, mean, rstd, p.scale, p.bias, yr);
  }
}

// Partial `part` owns rows part, part + P, part + 2P, ...: the same row split
// as the CUDA kernel, so both produce the same partial-sum layout.
template <typename T>
[[gnu::always_inline]] inline void bwd_partials(const NormBwdParams& p, int64_t part_begin,
                                                int64_t part_end) {
  const int64_t C = p.cols, P = p.num_partials;
  const T* dy = static_cast<const T*>(p.dy);
  const T* h = static_cast<const T*>(p.h);
  const T* dh_extra = static_cast<const T*>(p.dh_extra);
  T* dh = static_cast<T*>(p.dh);
  std::vector<float> xhat(C), g(C);
  for (int64_t part = part_begin; part < part_end; ++part) {
    float* dscale = p.dscale_partial ? p.dscale_partial + part * C : nullptr;
    float* dbias = p.dbias_partial ? p.dbias_partial + part * C : nullptr;
    if (dscale) std::fill(dscale, dscale + C, 0.f);
    if (dbias) std::fill(dbias, dbias + C, 0.f);
    for (int64_t r = part; r < p.rows; r += P) {
      const int64_t base = r * C;
      const float mean = p.mean ? p.mean[r] : 0.f;
      const float rstd = p.rstd[r];
      for (int64_t c = 0; c < C; ++c) {
        const float dyv = to_float(dy[base + c]);
        xhat[c] = (to_float(h[base + c]) - mean) * rstd;
        g[c] = p.scale ? dyv * p.scale[c] : dyv;
        if (dscale) dscale[c] += dyv * xhat[c];
        if (dbias) dbias[c] += dyv;
      }
      const float* gv = g.data();
      const float* xv = xhat.data();
      const float mean_g = p.rms ? 0.f : lane_sum(C, [&](int64_t c) { return gv[c]; }) / C;
      const float mean_gx = lane_sum(C, [&](int64_t c) { return gv[c] * xv[c]; }) / C;
      for (int64_t c = 0; c < C; ++c) {
        float d = rstd * (g[c] - mean_g - xhat[c] * mean_gx);
        if (dh_extra) d += to_float(dh_extra[base + c]);
        dh[base + c] = from_float<T>(d);
      }
    }
  }
}

// The row loops of one dtype, compiled per ISA.
#define JAXCRAFT_NORM_ROWS(T)                                                                \
  JAXCRAFT_CPU_CLONES void fwd_rows_##T(const NormFwdParams& p, int64_t begin, int64_t end) { \
    fwd_rows<T>(p, begin, end);                                                              \
  }                                                                                          \
  JAXCRAFT_CPU_CLONES void bwd_partials_##T(const NormBwdParams& p, int64_t begin,           \
                                            int64_t end) {                                   \
    bwd_partials<T>(p, begin, end);                                                          \
  }
JAXCRAFT_NORM_ROWS(float)
JAXCRAFT_NORM_ROWS(bf16_t)
JAXCRAFT_NORM_ROWS(f16_t)
#undef JAXCRAFT_NORM_ROWS

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
  switch (p.dtype) {
    case DType::kF32: return fwd_parallel(p, runner, fwd_rows_float);
    case DType::kBF16: return fwd_parallel(p, runner, fwd_rows_bf16_t);
    case DType::kF16: return fwd_parallel(p, runner, fwd_rows_f16_t);
  }
}

void norm_bwd_cpu(const NormBwdParams& p, const TaskRunner* runner) {
  switch (p.dtype) {
    case DType::kF32: return bwd_parallel(p, runner, bwd_partials_float);
    case DType::kBF16: return bwd_parallel(p, runner, bwd_partials_bf16_t);
    case DType::kF16: return bwd_parallel(p, runner, bwd_partials_f16_t);
  }
}

}  // namespace jaxcraft
