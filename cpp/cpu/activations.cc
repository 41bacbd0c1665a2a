// gelu / bias_gelu / swiglu / geglu on the CPU: per row, convert to float32
// scratch, apply the activation in a branch-free loop over floats (which the
// compiler vectorizes: math/activation_math.h has a
// vectorizable exp and erfc polynomial), convert back. Threaded over rows;
// the bias gradient as per-partial float32 sums in row order.
#include "cpu/activations.h"

#include <algorithm>
#include <vector>

#include "common/cpu/host_float.h"
#include "cpu/isa_clones.h"
#include "cpu/parallel.h"
#include "cpu/row_convert.h"
#include "math/activation_math.h"

namespace jaxcraft {
namespace {

using activation::Act;

// ~64K elements per thread keeps thread start-up under a few percent.
constexpr int64_t kMinElementsPerThread = 1 << 16;

int64_t min_rows_per_thread(int64_t cols) {
  return std::max<int64_t>(1, kMinElementsPerThread / std::max<int64_t>(cols, 1));
}

// ---- the math over float rows
// One entry point per activation and direction, not templates, so that each
// can carry JAXCRAFT_CPU_CLONES (AVX2 + FMA: ~3x the baseline's throughput).

// out = f(a) (b null) or f(a) * b.
template <Activation kAct>
inline void fwd_math(const float* __restrict__ a, const float* __restrict__ b,
                     float* __restrict__ out, int64_t n) {
  if (b) {
    for (int64_t c = 0; c < n; ++c) out[c] = Act<kAct>::value(a[c]) * b[c];
  } else {
    for (int64_t c = 0; c < n; ++c) out[c] = Act<kAct>::value(a[c]);
  }
}

// From g = dy: da = g f'(a) (b null), or da = g b f'(a) and db = g f(a).
template <Activation kAct>
inline void bwd_math(const float* __restrict__ g, const float* __restrict__ a,
                     const float* __restrict__ b, float* __restrict__ da, float* __restrict__ db,
                     int64_t n) {
  if (b) {
    for (int64_t c = 0; c < n; ++c) {
      float grad;
      const float f = Act<kAct>::value_and_grad(a[c], grad);
      da[c] = g[c] * b[c] * grad;
      db[c] = g[c] * f;
    }
  } else {
    for (int64_t c = 0; c < n; ++c) {
      float grad;
      Act<kAct>::value_and_grad(a[c], grad);
      da[c] = g[c] * grad;
    }
  }
}

using FwdMath = void (*)(const float*, const float*, float*, int64_t);
using BwdMath = void (*)(const float*, const float*, const float*, float*, float*, int64_t);

#define JAXCRAFT_ROW_MATH(name, act)                                                        \
  JAXCRAFT_CPU_CLONES void name##_fwd(const float* a, const float* b, float* out, int64_t n) { \
    fwd_math<act>(a, b, out, n);                                                            \
  }                                                                                         \
  JAXCRAFT_CPU_CLONES void name##_bwd(const float* g, const float* a, const float* b,       \
                                      float* da, float* db, int64_t n) {                    \
    bwd_math<act>(g, a, b, da, db, n);                                                      \
  }
JAXCRAFT_ROW_MATH(gelu_tanh, Activation::kGeluTanh)
JAXCRAFT_ROW_MATH(gelu_erf, Activation::kGeluErf)
JAXCRAFT_ROW_MATH(silu, Activation::kSilu)
#undef JAXCRAFT_ROW_MATH

struct RowMath {
  FwdMath fwd;
  BwdMath bwd;
};

RowMath row_math(Activation act) {
  switch (act) {
    case Activation::kGeluTanh: return {gelu_tanh_fwd, gelu_tanh_bwd};
    case Activation::kGeluErf: return {gelu_erf_fwd, gelu_erf_bwd};
    case Activation::kSilu: return {silu_fwd, silu_bwd};
  }
  return {gelu_tanh_fwd, gelu_tanh_bwd};
}

// ---- rows in the storage type
using cpu::load_row;
using cpu::store_row;

template <typename T>
void fwd_rows(const ActivationFwdParams& p, FwdMath math, int64_t begin, int64_t end) {
  const int64_t C = p.cols, in_stride = p.gated ? 2 * C : C;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  std::vector<float> a(C), b(p.gated ? C : 0), out(C);
  for (int64_t r = begin; r < end; ++r) {
    load_row(x + r * in_stride, C, a.data());
    if (p.gated) load_row(x + r * in_stride + C, C, b.data());
    if (p.bias)
      for (int64_t c = 0; c < C; ++c) a[c] += p.bias[c];
    math(a.data(), p.gated ? b.data() : nullptr, out.data(), C);
    store_row(out.data(), C, y + r * C);
  }
}

// Rows [begin, end); with `dbias` (ungated), adds each row's float32
// gradient into it in row order.
template <typename T>
void bwd_rows(const ActivationBwdParams& p, BwdMath math, int64_t begin, int64_t end,
              float* dbias) {
  const int64_t C = p.cols, in_stride = p.gated ? 2 * C : C;
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  T* dx = static_cast<T*>(p.dx);
  std::vector<float> g(C), a(C), b(p.gated ? C : 0), da(C), db(p.gated ? C : 0);
  for (int64_t r = begin; r < end; ++r) {
    load_row(dy + r * C, C, g.data());
    load_row(x + r * in_stride, C, a.data());
    if (p.gated) load_row(x + r * in_stride + C, C, b.data());
    if (p.bias)
      for (int64_t c = 0; c < C; ++c) a[c] += p.bias[c];
    math(g.data(), a.data(), p.gated ? b.data() : nullptr, da.data(), db.data(), C);
    if (dbias)
      for (int64_t c = 0; c < C; ++c) dbias[c] += da[c];
    store_row(da.data(), C, dx + r * in_stride);
    if (p.gated) store_row(db.data(), C, dx + r * in_stride + C);
  }
}

template <typename T>
void fwd_typed(const ActivationFwdParams& p, const TaskRunner* runner) {
  const FwdMath math = row_math(p.activation).fwd;
  parallel_for(runner, p.rows, min_rows_per_thread(p.cols),
               [&](int64_t b, int64_t e) { fwd_rows<T>(p, math, b, e); });
}

template <typename T>
void bwd_typed(const ActivationBwdParams& p, const TaskRunner* runner) {
  const BwdMath math = row_math(p.activation).bwd;
  if (!p.dbias_partial) {
    parallel_for(runner, p.rows, min_rows_per_thread(p.cols),
                 [&](int64_t b, int64_t e) { bwd_rows<T>(p, math, b, e, nullptr); });
    return;
  }
  // Threaded over partials: each owns its rows and its row of sums.
  const int64_t R = partial_rows(p.rows, p.num_partials);
  const int64_t min_partials = std::max<int64_t>(1, min_rows_per_thread(p.cols) / std::max<int64_t>(R, 1));
  parallel_for(runner, p.num_partials, min_partials, [&](int64_t pb, int64_t pe) {
    for (int64_t part = pb; part < pe; ++part) {
      float* sums = p.dbias_partial + part * p.cols;
      std::fill(sums, sums + p.cols, 0.f);
      const int64_t begin = std::min(p.rows, part * R), end = std::min(p.rows, begin + R);
      bwd_rows<T>(p, math, begin, end, sums);
    }
  });
}

}  // namespace

void activation_fwd_cpu(const ActivationFwdParams& p, const TaskRunner* runner) {
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return fwd_typed<decltype(x)>(p, runner); });
}

void activation_bwd_cpu(const ActivationBwdParams& p, const TaskRunner* runner) {
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return bwd_typed<decltype(x)>(p, runner); });
}

}  // namespace jaxcraft
