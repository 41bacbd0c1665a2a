// The host <-> kernel contract for layer norm and RMS norm (CPU and CUDA).
// Plain data only. Rows are independent; statistics are per row, in float32.
#pragma once
#include <cstdint>

#include "contract/dtype.h"

namespace jaxcraft {

// Forward: h = x (+ residual, rounded to dtype); y = norm(h) * scale + bias.
//   x, residual, y, h_out : [rows, cols] in `dtype`
//   scale, bias           : [cols] float32 or null (unit scale / zero bias)
//   mean, rstd            : [rows] float32, saved for the backward pass
//                           (mean is null for RMS norm)
struct NormFwdParams {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  float epsilon = 1e-6f;
  bool rms = false;
  const void* x = nullptr;
  const void* residual = nullptr;  // null: no residual add
  const float* scale = nullptr;
  const float* bias = nullptr;
  void* y = nullptr;
  void* h_out = nullptr;  // written only when residual is set
  float* mean = nullptr;
  float* rstd = nullptr;
};

// Backward of y = norm(h) * scale + bias, plus dh_extra (the cotangent of the
// h output when a residual was fused): dh = d norm / dh + dh_extra.
// Parameter gradients are written as `num_partials` deterministic partial
// sums [num_partials, cols] (the kernel may leave some of them zeros: it runs
// no more row walkers than fit on the GPU at once). The caller adds them up
// (a small second reduction).
struct NormBwdParams {
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  bool rms = false;
  const void* dy = nullptr;
  const void* h = nullptr;
  const float* scale = nullptr;  // null: unit scale
  const float* mean = nullptr;   // null for RMS norm
  const float* rstd = nullptr;
  const void* dh_extra = nullptr;  // null: none
  void* dh = nullptr;
  float* dscale_partial = nullptr;  // null: no scale gradient wanted
  float* dbias_partial = nullptr;   // null: no bias gradient wanted
  int64_t num_partials = 1;
};

}  // namespace jaxcraft
