// Softmax on the CPU, threaded over rows. Per row: one online pass converts
// the row to float32 scratch and replaces each element by exp(x - m_k), m_k
// the running maximum of its chunk of kChunk elements, while the row's
// maximum m and sum s are kept up to date (s rescaled by exp(m_old - m_new)
// when the maximum grows); then one write pass scales chunk k by
// exp(m_k - m) / s. One exp per element, read once, written once.
#include "cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu/host_float.h"
#include "cpu/blocked.h"
#include "cpu/isa_clones.h"
#include "cpu/lane_reduce.h"
#include "cpu/parallel.h"
#include "cpu/row_convert.h"

namespace jaxcraft {
namespace {

// ~64K elements per thread keeps thread start-up under a few percent.
constexpr int64_t kMinElementsPerThread = 1 << 16;
// Elements per running-maximum update: long enough that the per-chunk
// rescale (two scalar exps) is noise, short enough to stay in L1 as it is
// written and summed.
constexpr int64_t kChunk = 256;
using cpu::exp_keep_nan;
using cpu::exp_shift_sum;
using cpu::kNegInf;
using cpu::lane_sum;
using cpu::load_row;
using cpu::max_of;
using cpu::store_row;

int64_t min_rows_per_thread(int64_t cols) {
  return std::max<int64_t>(1, kMinElementsPerThread / std::max<int64_t>(cols, 1));
}

JAXCRAFT_CPU_CLONES float dot(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  return lane_sum(n, [&](int64_t c) { return a[c] * b[c]; });
}

template <typename T>
void fwd_rows(const SoftmaxFwdParams& p, int64_t begin, int64_t end) {
  const int64_t C = p.cols, chunks = (C + kChunk - 1) / kChunk;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  std::vector<float> e(C), shift(chunks);
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * C;
    const uint8_t* keep = p.mask ? p.mask + r * p.mask_row_stride : nullptr;
    float m = kNegInf, s = 0.f;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t c0 = k * kChunk, n = std::min(kChunk, C - c0);
      float* ek = e.data() + c0;
      load_row(xr + c0, n, ek);
      if (keep)
        for (int64_t c = 0; c < n; ++c)
          if (!keep[c0 + c]) ek[c] = kNegInf;  // masked: exp(-inf - shift) = 0
      const float cm = max_of(ek, n);
      // A chunk with nothing kept (or all -inf) adds 0, not exp(-inf - -inf).
      shift[k] = cm == kNegInf ? 0.f : cm;
      const float cs = exp_shift_sum(ek, n, shift[k]);
      if (cm > m) {
        s = s * exp_keep_nan(m - cm) + cs;  // m = -inf: s * 0 (0, or NaN kept)
        m = cm;
      } else if (cm != kNegInf) {
        s += cs * exp_keep_nan(cm - m);
      } else {
        s += cs;  // 0, or NaN from a NaN element (propagated as jax.nn does)
      }
    }
    // m = -inf (nothing finite kept): kept elements get 0 * inf = NaN, as in
    // jax.nn.softmax's exp(-inf - -inf); masked-out ones 0 below.
    const float inv = 1.f / s;
    T* yr = y + r * C;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t c0 = k * kChunk, n = std::min(kChunk, C - c0);
      const float f = exp_keep_nan(shift[k] - m) * inv;
      for (int64_t c = c0; c < c0 + n; ++c) e[c] = keep && !keep[c] ? 0.f : e[c] * f;
    }
    store_row(e.data(), C, yr);
  }
}

template <typename T>
void bwd_rows(const SoftmaxBwdParams& p, int64_t begin, int64_t end) {
  const int64_t C = p.cols;
  const T* y = static_cast<const T*>(p.y);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  std::vector<float> yf(C), g(C);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t base = r * C;
    load_row(y + base, C, yf.data());
    load_row(dy + base, C, g.data());
    const float d = dot(yf.data(), g.data(), C);
    for (int64_t c = 0; c < C; ++c) yf[c] *= g[c] - d;
    store_row(yf.data(), C, dx + base);
  }
}

template <typename T>
void fwd_typed(const SoftmaxFwdParams& p, const TaskRunner* runner) {
  parallel_for(runner, p.rows, min_rows_per_thread(p.cols),
               [&](int64_t b, int64_t e) { fwd_rows<T>(p, b, e); });
}

template <typename T>
void bwd_typed(const SoftmaxBwdParams& p, const TaskRunner* runner) {
  parallel_for(runner, p.rows, min_rows_per_thread(p.cols),
               [&](int64_t b, int64_t e) { bwd_rows<T>(p, b, e); });
}

}  // namespace

void softmax_fwd_cpu(const SoftmaxFwdParams& p, const TaskRunner* runner) {
  if (p.rows == 0 || p.cols == 0) return;
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return fwd_typed<decltype(x)>(p, runner); });
}

void softmax_bwd_cpu(const SoftmaxBwdParams& p, const TaskRunner* runner) {
  if (p.rows == 0 || p.cols == 0) return;
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return bwd_typed<decltype(x)>(p, runner); });
}

}  // namespace jaxcraft
