// Layer norm / RMS norm on the CPU: one pass to load a row into float32
// scratch (adding the residual), two-pass statistics over that scratch, one
// pass to write. Threaded over rows.
#include "cpu/norm.h"

#include <cmath>
#include <vector>

#include "common/host_float.h"
#include "cpu/parallel.h"

namespace jaxcraft {
namespace {

// ~64K elements per thread keeps thread start-up under a few percent.
constexpr int64_t kMinElementsPerThread = 1 << 16;

// Independent partial sums: lets the compiler vectorize reductions that a
// single serial accumulator would bind to the add latency (~4 cycles/elem).
constexpr int kLanes = 16;

template <typename Term>
float lane_sum(int64_t n, Term term) {
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

template <typename T>
void fwd_rows(const NormFwdParams& p, int64_t begin, int64_t end) {
  const int64_t C = p.cols;
  const T* x = static_cast<const T*>(p.x);
  const T* res = static_cast<const T*>(p.residual);
  T* y = static_cast<T*>(p.y);
  T* h_out = static_cast<T*>(p.h_out);
  std::vector<float> h(C);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t base = r * C;
    for (int64_t c = 0; c < C; ++c) {
      float v = to_float(x[base + c]);
      if (res) {
        // h is defined in the input dtype: round before normalizing.
        const T hv = from_float<T>(v + to_float(res[base + c]));
        h_out[base + c] = hv;
        v = to_float(hv);
      }
      h[c] = v;
    }
    const float* hv = h.data();
    const float mean = p.rms ? 0.f : lane_sum(C, [&](int64_t c) { return hv[c]; }) / C;
    // Two-pass variance over the float row: no cancellation for large means.
    const float var = lane_sum(C, [&](int64_t c) { return (hv[c] - mean) * (hv[c] - mean); }) / C;
    const float rstd = 1.f / std::sqrt(var + p.epsilon);
    if (p.mean) p.mean[r] = mean;
    p.rstd[r] = rstd;
    for (int64_t c = 0; c < C; ++c) {
      float out = (h[c] - mean) * rstd;
      if (p.scale) out *= p.scale[c];
      if (p.bias) out += p.bias[c];
      y[base + c] = from_float<T>(out);
    }
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

template <typename T>
void fwd_typed(const NormFwdParams& p, const TaskRunner* runner) {
  parallel_for(runner, p.rows, min_rows_per_thread(p.cols),
               [&](int64_t b, int64_t e) { fwd_rows<T>(p, b, e); });
}

template <typename T>
void bwd_typed(const NormBwdParams& p, const TaskRunner* runner) {
  const int64_t rows_per_partial = std::max<int64_t>(1, p.rows / std::max<int64_t>(p.num_partials, 1));
  const int64_t min_partials = std::max<int64_t>(1, min_rows_per_thread(p.cols) / rows_per_partial);
  parallel_for(runner, p.num_partials, min_partials,
               [&](int64_t b, int64_t e) { bwd_partials<T>(p, b, e); });
}

}  // namespace

void norm_fwd_cpu(const NormFwdParams& p, const TaskRunner* runner) {
  switch (p.dtype) {
    case DType::kF32: return fwd_typed<float>(p, runner);
    case DType::kBF16: return fwd_typed<bf16_t>(p, runner);
    case DType::kF16: return fwd_typed<f16_t>(p, runner);
  }
}

void norm_bwd_cpu(const NormBwdParams& p, const TaskRunner* runner) {
  switch (p.dtype) {
    case DType::kF32: return bwd_typed<float>(p, runner);
    case DType::kBF16: return bwd_typed<bf16_t>(p, runner);
    case DType::kF16: return bwd_typed<f16_t>(p, runner);
  }
}

}  // namespace jaxcraft
