// gelu / bias_gelu / swiglu / geglu on the CPU: one pass over each row,
// float32 math (kernels/activations/activation_math.h), threaded over rows;
// the bias gradient as per-partial float32 sums in row order.
#include "cpu/activations.h"

#include <algorithm>
#include <vector>

#include "common/host_float.h"
#include "cpu/parallel.h"
#include "kernels/activations/activation_math.h"

namespace jaxcraft {
namespace {

using activation::Act;

// ~64K elements per thread keeps thread start-up under a few percent.
constexpr int64_t kMinElementsPerThread = 1 << 16;

int64_t min_rows_per_thread(int64_t cols) {
  return std::max<int64_t>(1, kMinElementsPerThread / std::max<int64_t>(cols, 1));
}

template <typename T, Activation kAct>
void fwd_rows(const ActivationFwdParams& p, int64_t begin, int64_t end) {
  const int64_t C = p.cols, in_stride = p.gated ? 2 * C : C;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  for (int64_t r = begin; r < end; ++r) {
    const T* a = x + r * in_stride;
    T* out = y + r * C;
    if (p.gated) {
      const T* b = a + C;
      for (int64_t c = 0; c < C; ++c)
        out[c] = from_float<T>(Act<kAct>::value(to_float(a[c])) * to_float(b[c]));
    } else if (p.bias) {
      for (int64_t c = 0; c < C; ++c) out[c] = from_float<T>(Act<kAct>::value(to_float(a[c]) + p.bias[c]));
    } else {
      for (int64_t c = 0; c < C; ++c) out[c] = from_float<T>(Act<kAct>::value(to_float(a[c])));
    }
  }
}

// Rows [begin, end); with `dbias` (ungated), adds each row's float32
// gradient into it in row order.
template <typename T, Activation kAct>
void bwd_rows(const ActivationBwdParams& p, int64_t begin, int64_t end, float* dbias) {
  const int64_t C = p.cols, in_stride = p.gated ? 2 * C : C;
  const T* dy = static_cast<const T*>(p.dy);
  const T* x = static_cast<const T*>(p.x);
  T* dx = static_cast<T*>(p.dx);
  for (int64_t r = begin; r < end; ++r) {
    const T* a = x + r * in_stride;
    const T* g = dy + r * C;
    T* da = dx + r * in_stride;
    if (p.gated) {
      const T* b = a + C;
      T* db = da + C;
      for (int64_t c = 0; c < C; ++c) {
        float grad;
        const float f = Act<kAct>::value_and_grad(to_float(a[c]), grad);
        const float gv = to_float(g[c]);
        da[c] = from_float<T>(gv * to_float(b[c]) * grad);
        db[c] = from_float<T>(gv * f);
      }
    } else {
      for (int64_t c = 0; c < C; ++c) {
        float grad;
        Act<kAct>::value_and_grad(to_float(a[c]) + (p.bias ? p.bias[c] : 0.f), grad);
        const float d = to_float(g[c]) * grad;
        if (dbias) dbias[c] += d;
        da[c] = from_float<T>(d);
      }
    }
  }
}

template <typename T, Activation kAct>
void fwd_typed(const ActivationFwdParams& p, const TaskRunner* runner) {
  parallel_for(runner, p.rows, min_rows_per_thread(p.cols),
               [&](int64_t b, int64_t e) { fwd_rows<T, kAct>(p, b, e); });
}

template <typename T, Activation kAct>
void bwd_typed(const ActivationBwdParams& p, const TaskRunner* runner) {
  if (!p.dbias_partial) {
    parallel_for(runner, p.rows, min_rows_per_thread(p.cols),
                 [&](int64_t b, int64_t e) { bwd_rows<T, kAct>(p, b, e, nullptr); });
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
      bwd_rows<T, kAct>(p, begin, end, sums);
    }
  });
}

// dtype -> activation.
template <template <typename, Activation> class Fn, typename Params>
void dispatch(const Params& p, const TaskRunner* runner) {
  auto with_type = [&](auto type_tag) {
    using T = decltype(type_tag);
    switch (p.activation) {
      case Activation::kGeluTanh: return Fn<T, Activation::kGeluTanh>::run(p, runner);
      case Activation::kGeluErf: return Fn<T, Activation::kGeluErf>::run(p, runner);
      case Activation::kSilu: return Fn<T, Activation::kSilu>::run(p, runner);
    }
  };
  switch (p.dtype) {
    case DType::kF32: return with_type(float{});
    case DType::kBF16: return with_type(bf16_t{});
    case DType::kF16: return with_type(f16_t{});
  }
}

template <typename T, Activation kAct>
struct Fwd {
  static void run(const ActivationFwdParams& p, const TaskRunner* r) { fwd_typed<T, kAct>(p, r); }
};
template <typename T, Activation kAct>
struct Bwd {
  static void run(const ActivationBwdParams& p, const TaskRunner* r) { bwd_typed<T, kAct>(p, r); }
};

}  // namespace

void activation_fwd_cpu(const ActivationFwdParams& p, const TaskRunner* runner) {
  dispatch<Fwd>(p, runner);
}

void activation_bwd_cpu(const ActivationBwdParams& p, const TaskRunner* runner) {
  dispatch<Bwd>(p, runner);
}

}  // namespace jaxcraft
