// The host <-> kernel contract for the activation ops (CPU and CUDA): gelu,
// bias_gelu, swiglu and geglu. Plain data only. Rows are independent; math is
// float32 whatever the storage type.
#pragma once
#include <cstdint>

#include "contract/dtype.h"

namespace jaxcraft {

// f(h) of one element. Gated ops apply it to the first half of each row.
enum class Activation : int32_t {
  kGeluTanh = 0,  // 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))
  kGeluErf = 1,   // 0.5 h (1 + erf(h / sqrt 2))
  kSilu = 2,      // h sigmoid(h)
};

// Forward.
//   ungated: y[r, c] = f(x[r, c] + bias[c])      x, y: [rows, cols]
//   gated:   y[r, c] = f(x[r, c]) * x[r, cols + c]  x: [rows, 2 cols], y: [rows, cols]
// bias: [cols] float32 or null (zero); never set when gated.
struct ActivationFwdParams {
  DType dtype = DType::kF32;
  Activation activation = Activation::kGeluTanh;
  bool gated = false;
  int64_t rows = 0, cols = 0;  // cols: of the output
  const void* x = nullptr;
  const float* bias = nullptr;
  void* y = nullptr;
};

// Backward of the forward above, from dy [rows, cols]:
//   ungated: dx = dy * f'(x + bias)                          dx: [rows, cols]
//   gated:   dx[:, :cols] = dy * b * f'(a), dx[:, cols:] = dy * f(a)
// With dbias_partial (ungated only), the bias gradient, the column sums of
// dy * f'(x + bias) in float32 before rounding, is written as `num_partials`
// deterministic partial sums [num_partials, cols]: partial p covers the rows
// [p * R, min(rows, (p + 1) * R)), R = partial_rows(rows, num_partials). The
// caller adds the partials up (a small second reduction).
struct ActivationBwdParams {
  DType dtype = DType::kF32;
  Activation activation = Activation::kGeluTanh;
  bool gated = false;
  int64_t rows = 0, cols = 0;  // cols: of dy
  const void* dy = nullptr;
  const void* x = nullptr;
  const float* bias = nullptr;
  void* dx = nullptr;
  float* dbias_partial = nullptr;  // null: no bias gradient wanted
  int64_t num_partials = 1;
};

// Rows per partial sum of the bias gradient (the last partials may be short or empty).
inline int64_t partial_rows(int64_t rows, int64_t num_partials) {
  return num_partials > 0 ? (rows + num_partials - 1) / num_partials : rows;
}

}  // namespace jaxcraft
