// The host <-> kernel contract for softmax over the last axis (CPU and CUDA).
// Plain data only. Rows are independent; math is float32 whatever the
// storage type.
#pragma once
#include <cstdint>

#include "contract/dtype.h"

namespace jaxcraft {

// Forward, per row r of x [rows, cols] (as jax.nn.softmax(x, where=mask)):
//   m = max over kept c of x[r, c]          (kept: mask absent or mask[.., c] != 0)
//   s = sum over kept c of exp(x[r, c] - m)
//   y[r, c] = kept ? exp(x[r, c] - m) / s : 0
// A row with no kept element is all zeros; a kept -inf row gives NaN, and a
// +inf anywhere NaN for the row's kept elements (both as jax.nn.softmax).
// mask: bool bytes, row r reads mask + r * mask_row_stride: a stride of cols
// (one mask row per row) or 0 (one row shared by all), or null (all kept).
struct SoftmaxFwdParams {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  const void* x = nullptr;
  const uint8_t* mask = nullptr;
  int64_t mask_row_stride = 0;
  void* y = nullptr;
};

// Backward from the forward's output y and the cotangent dy (both [rows, cols]):
//   dx[r, c] = y[r, c] * (dy[r, c] - sum over c' of dy[r, c'] y[r, c'])
// Masked-out elements have y = 0, hence dx = 0: no mask needed.
struct SoftmaxBwdParams {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  const void* y = nullptr;
  const void* dy = nullptr;
  void* dx = nullptr;
};

}  // namespace jaxcraft
