// Standalone correctness + speed check of the CUDA activation kernels (gelu,
// bias_gelu, swiglu, geglu) against a float64 CPU reference (not part of the
// library build). From the repo root:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -gencode=arch=compute_80,code=sm_80 \
//     -gencode=arch=compute_90a,code=sm_90a tests/cuda/activations.cu \
//     cpp/kernels/activations/launch_activations.cu -o /tmp/act_test && /tmp/act_test
// Exit status 0 only when every case passes. Covers the vector and scalar
// (odd widths, misaligned buffers) paths, narrow rows (several rows per
// block, folded bias sums), more partial sums than rows or than gridDim.y,
// the far tails, and bitwise reproducibility of the backward.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <vector>

#include "common/testing/standalone_buffers.h"
#include "common/testing/standalone_check.h"
#include "common/testing/standalone_data.h"
#include "common/testing/standalone_timing.h"
#include "kernels/activations/launch.h"

using jaxcraft::Activation;
using jaxcraft::ActivationBwdParams;
using jaxcraft::ActivationFwdParams;
using jaxcraft::DType;

namespace {

using namespace jaxcraft_test;

constexpr int kRowsPerPartial = 64;  // as jaxcraft/ops/activations.py chooses num_partials
constexpr int kMaxPartials = 1024;
constexpr double kF32Eps = 1.0 / (1 << 23);
constexpr int kTimingReps = 20;
// Inputs: normal * kInputScale reaches the tails; a few fixed far-tail values.
constexpr double kInputScale = 2.0;
constexpr float kTailValues[] = {0.f, -12.f, 12.f, -30.f, 30.f, -1e4f, 1e4f, -0.5f};
constexpr float kF16Tail = 100.f;  // float16 overflows at 65504

// Relative error bound of an output: the final rounding (half an ulp of the
// dtype) plus float32 math; for float32, exp's argument z (|z| < 90) carries
// |z| ulp of rounding into the result. Plus an absolute floor for values
// that round to (sub)normal zeros.
double rel_tol(DType dt) {
  switch (dt) {
    case DType::kBF16: return 1.0 / (1 << 8) + 1e-5;
    case DType::kF16: return 1.0 / (1 << 11) + 1e-5;
    case DType::kF32: return 2e-5;
  }
  return 0;
}
constexpr double kF32Math = 2e-5;  // the float32 bound above
double abs_tol(DType dt) { return dt == DType::kF16 ? 6e-8 : 1e-30; }

// f(h) and f'(h) in float64, through sigmoid / erfc (no tail cancellation).
// f(h) and f'(h); *dmag is the sum of |terms| of f'(h). Near f'(h) = 0 the
// terms cancel, so the kernel's float32 error there scales with *dmag, not
// with |f'(h)|.
void act64(Activation act, double h, double* f, double* d, double* dmag) {
  auto sigmoid = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
  switch (act) {
    case Activation::kGeluTanh: {
      const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
      const double z = 2 * k0 * (h + k1 * h * h * h);
      const double s = sigmoid(z);
      *f = h * s;
      *d = s + h * s * sigmoid(-z) * 2 * k0 * (1 + 3 * k1 * h * h);
      *dmag = s + std::fabs(*d - s);
      return;
    }
    case Activation::kGeluErf: {
      const double cdf = 0.5 * std::erfc(-h / std::sqrt(2.0));
      *f = h * cdf;
      *d = cdf + h * std::exp(-0.5 * h * h) / std::sqrt(2 * M_PI);
      *dmag = cdf + std::fabs(*d - cdf);
      return;
    }
    case Activation::kSilu: {
      const double s = sigmoid(h);
      *f = h * s;
      *d = s + h * s * (1 - s);
      *dmag = s + std::fabs(*d - s);
      return;
    }
  }
}

struct Case {
  DType dt;
  Activation act;
  bool gated, bias;
  int64_t rows, cols;     // cols: of the output
  int64_t num_partials;   // 0: as the Python side chooses
  bool misalign;          // x / dx one element past a 16-byte boundary: scalar path
};

const char* op_name(const Case& c) {
  if (c.gated) return c.act == Activation::kSilu ? "swiglu" : c.act == Activation::kGeluTanh ? "geglu" : "geglu-erf";
  if (c.bias) return c.act == Activation::kGeluTanh ? "bias_gelu" : "bias_gelu-erf";
  return c.act == Activation::kGeluTanh ? "gelu" : "gelu-erf";
}

bool run_case(const Case& c, uint64_t seed) {
  const int64_t R = c.rows, C = c.cols, W = c.gated ? 2 * C : C;
  const size_t n_in = size_t(R) * W, n_out = size_t(R) * C, es = dsize(c.dt);
  const size_t off = c.misalign ? 1 : 0;  // elements
  const int64_t partials =
      c.num_partials ? c.num_partials
                     : std::clamp<int64_t>((R + kRowsPerPartial - 1) / kRowsPerPartial, 1, kMaxPartials);
  Rng rng{seed};
  std::vector<uint8_t> x_bytes((n_in + off) * es), dy_bytes(n_out * es);
  std::vector<double> x(n_in), dy(n_out);
  for (size_t i = 0; i < n_in; ++i) {
    float v = i < std::size(kTailValues) ? kTailValues[i] : float(kInputScale * rng.normal());
    if (c.dt == DType::kF16) v = std::clamp(v, -kF16Tail, kF16Tail);  // f(a) * b stays finite
    x[i] = put(x_bytes, i + off, v, c.dt);
  }
  for (size_t i = 0; i < n_out; ++i) dy[i] = put(dy_bytes, i, rng.normal(), c.dt);
  std::vector<float> bias(c.bias ? C : 0);
  for (auto& b : bias) b = float(0.5 * rng.normal());

  DeviceBuffer d_x(x_bytes.data(), x_bytes.size()), d_dy(dy_bytes.data(), dy_bytes.size());
  DeviceBuffer d_bias(bias.data(), bias.size() * 4), d_y(n_out * es), d_dx((n_in + off) * es);
  DeviceBuffer d_part(c.bias ? size_t(partials) * C * 4 : 0);
  ActivationFwdParams fp;
  fp.dtype = c.dt;
  fp.activation = c.act;
  fp.gated = c.gated;
  fp.rows = R;
  fp.cols = C;
  fp.x = static_cast<char*>(d_x.p) + off * es;
  fp.bias = c.bias ? static_cast<const float*>(d_bias.p) : nullptr;
  fp.y = d_y.p;
  CHECK(jaxcraft::launch_activation_fwd(fp, nullptr));
  ActivationBwdParams bp;
  bp.dtype = c.dt;
  bp.activation = c.act;
  bp.gated = c.gated;
  bp.rows = R;
  bp.cols = C;
  bp.dy = d_dy.p;
  bp.x = fp.x;
  bp.bias = fp.bias;
  bp.dx = static_cast<char*>(d_dx.p) + off * es;
  bp.dbias_partial = c.bias ? static_cast<float*>(d_part.p) : nullptr;
  bp.num_partials = partials;
  CHECK(jaxcraft::launch_activation_bwd(bp, nullptr));
  CHECK(cudaDeviceSynchronize());

  const std::vector<uint8_t> y = d_y.back(), dx = d_dx.back(off * es), part = d_part.back();
  std::vector<float> part_f(part.size() / 4);
  if (!part.empty()) std::memcpy(part_f.data(), part.data(), part.size());
  Err ey, edx, edb;
  const double rt = rel_tol(c.dt), at = abs_tol(c.dt);
  std::vector<double> dbias(C, 0), dbias_abs(C, 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < C; ++j) {
      const size_t o = size_t(r) * C + j, a = size_t(r) * W + j;
      double f, d, dmag;
      act64(c.act, x[a] + (c.bias ? bias[j] : 0.0), &f, &d, &dmag);
      // f' in float32 math: kF32Math of the terms' magnitude (see act64).
      const double dterm = kF32Math * dmag;
      if (c.gated) {
        const double b = x[a + C];
        ey.add(get(y, o, c.dt), f * b, rt * std::fabs(f * b) + at);
        edx.add(get(dx, a, c.dt), dy[o] * b * d, rt * std::fabs(dy[o] * b * d) + std::fabs(dy[o] * b) * dterm + at);
        edx.add(get(dx, a + C, c.dt), dy[o] * f, rt * std::fabs(dy[o] * f) + at);
      } else {
        ey.add(get(y, o, c.dt), f, rt * std::fabs(f) + at);
        edx.add(get(dx, a, c.dt), dy[o] * d, rt * std::fabs(dy[o] * d) + std::fabs(dy[o]) * dterm + at);
        dbias[j] += dy[o] * d;
        dbias_abs[j] += std::fabs(dy[o]) * dmag;  // >= |dy f'|, and f''s own error scale
      }
    }
  bool ok = true;
  std::printf("%-4s %-13s rows=%-6lld cols=%-6lld partials=%-6lld%s:", dname(c.dt), op_name(c),
              (long long)R, (long long)C, (long long)(c.bias ? partials : 0),
              c.misalign ? " misaligned" : "");
  report("y", ey, &ok);
  report("dx", edx, &ok);
  if (c.bias) {
    // Each term in float32 math (kF32Math of its magnitude), summed in
    // float32 over a partial's rows (sequential, then a fold), then in float64 here.
    const double rows_bound = double(jaxcraft::partial_rows(R, partials) + 1);
    for (int64_t j = 0; j < C; ++j) {
      double got = 0;
      for (int64_t q = 0; q < partials; ++q) got += part_f[size_t(q) * C + j];
      edb.add(got, dbias[j], (kF32Math + 4 * rows_bound * kF32Eps) * dbias_abs[j] + 1e-30);
    }
    report("dbias", edb, &ok);
  }
  // Bitwise reproducibility: the backward again into fresh (poisoned) outputs.
  {
    DeviceBuffer d_dx2((n_in + off) * es), d_part2(d_part.bytes);
    ActivationBwdParams bp2 = bp;
    bp2.dx = static_cast<char*>(d_dx2.p) + off * es;
    bp2.dbias_partial = c.bias ? static_cast<float*>(d_part2.p) : nullptr;
    CHECK(jaxcraft::launch_activation_bwd(bp2, nullptr));
    CHECK(cudaDeviceSynchronize());
    const bool same = d_dx2.back(off * es) == dx && d_part2.back() == part;
    std::printf(" repro=%s", same ? "ok" : "DIFF(FAIL)");
    ok &= same;
  }
  std::printf("  %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

// The benchmark shapes, bf16. Bytes = what must cross HBM once:
//   forward:  x read + y written (+ bias);
//   backward: x and dy read, dx written (+ bias, + partial sums written).
void time_case(Activation act, bool gated, bool has_bias, int64_t R, int64_t C, float copy_gbps) {
  const int64_t W = gated ? 2 * C : C;
  const size_t n_in = size_t(R) * W, n_out = size_t(R) * C, es = 2;
  const int64_t partials = std::clamp<int64_t>((R + kRowsPerPartial - 1) / kRowsPerPartial, 1, kMaxPartials);
  DeviceBuffer d_x(n_in * es), d_y(n_out * es), d_dy(n_out * es), d_dx(n_in * es);
  DeviceBuffer d_bias(has_bias ? C * 4 : 0), d_part(has_bias ? size_t(partials) * C * 4 : 0);
  jaxcraft_test::fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(d_x.p), n_in, 1u);
  jaxcraft_test::fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(d_dy.p), n_out, 2u);
  if (has_bias) jaxcraft_test::fill_random<<<64, 256>>>(static_cast<float*>(d_bias.p), size_t(C), 3u);
  CHECK(cudaGetLastError());
  ActivationFwdParams fp;
  fp.dtype = DType::kBF16;
  fp.activation = act;
  fp.gated = gated;
  fp.rows = R;
  fp.cols = C;
  fp.x = d_x.p;
  fp.bias = has_bias ? static_cast<const float*>(d_bias.p) : nullptr;
  fp.y = d_y.p;
  ActivationBwdParams bp;
  bp.dtype = DType::kBF16;
  bp.activation = act;
  bp.gated = gated;
  bp.rows = R;
  bp.cols = C;
  bp.dy = d_dy.p;
  bp.x = d_x.p;
  bp.bias = fp.bias;
  bp.dx = d_dx.p;
  bp.dbias_partial = has_bias ? static_cast<float*>(d_part.p) : nullptr;
  bp.num_partials = partials;
  auto time_ms = [&](auto launch) { return mean_launch_ms(launch, kTimingReps); };
  const float fwd_ms = time_ms([&] { return jaxcraft::launch_activation_fwd(fp, nullptr); });
  const float bwd_ms = time_ms([&] { return jaxcraft::launch_activation_bwd(bp, nullptr); });
  const double bias_bytes = has_bias ? 4.0 * C : 0.0;
  const double fwd_bytes = double(n_in + n_out) * es + bias_bytes;
  const double bwd_bytes = double(2 * n_in + n_out) * es + bias_bytes + (has_bias ? 4.0 * partials * C : 0.0);
  const double fwd_gbps = fwd_bytes / fwd_ms / 1e6, bwd_gbps = bwd_bytes / bwd_ms / 1e6;
  Case c{DType::kBF16, act, gated, has_bias, R, C, 0, false};
  std::printf("timing bf16 %-13s [%lld, %lld]: fwd %7.1f us %5.0f GB/s (%3.0f%% of copy)  "
              "bwd %7.1f us %5.0f GB/s (%3.0f%% of copy)\n",
              op_name(c), (long long)R, (long long)W, fwd_ms * 1e3, fwd_gbps, 100 * fwd_gbps / copy_gbps,
              bwd_ms * 1e3, bwd_gbps, 100 * bwd_gbps / copy_gbps);
}

}  // namespace

int main(int argc, char** argv) {
  const bool timing = !(argc > 1 && std::strcmp(argv[1], "--no-timing") == 0);
  int device = 0, major = 0, minor = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  std::printf("device sm_%d%d\n", major, minor);

  struct Op {
    Activation act;
    bool gated, bias;
  };
  const Op kOps[] = {{Activation::kGeluTanh, false, false}, {Activation::kGeluErf, false, false},
                     {Activation::kGeluTanh, false, true},  {Activation::kGeluErf, false, true},
                     {Activation::kSilu, true, false},      {Activation::kGeluTanh, true, false},
                     {Activation::kGeluErf, true, false}};
  // (rows, cols, partials): one element; odd widths (scalar path); one vector
  // per row (256 rows per block); narrow rows folded over many thread rows;
  // a row over two blocks; wide rows; more partials than rows (empty ones
  // must be zeros).
  const int64_t kShapes[][3] = {{1, 1, 0},    {3, 7, 0},   {5, 8, 0},     {2, 257, 0}, {64, 96, 0},
                                {300, 24, 0}, {130, 1000, 0}, {33, 4096, 0}, {4, 14336, 0}, {5, 16, 8}};
  const DType kTypes[] = {DType::kBF16, DType::kF32, DType::kF16};
  std::vector<Case> cases;
  for (DType dt : kTypes)
    for (const Op& op : kOps)
      for (const auto& s : kShapes) {
        if (dt == DType::kF16 && s[1] != 7 && s[1] != 96 && s[1] != 4096) continue;  // bf16's paths
        cases.push_back({dt, op.act, op.gated, op.bias, s[0], s[1], s[2], false});
      }
  // Misaligned buffers (scalar path at whole-vector widths); partial sums past
  // gridDim.y's limit (grid-stride over chunks).
  cases.push_back({DType::kBF16, Activation::kGeluTanh, false, true, 40, 64, 0, true});
  cases.push_back({DType::kBF16, Activation::kSilu, true, false, 40, 64, 0, true});
  cases.push_back({DType::kBF16, Activation::kGeluTanh, false, true, 70000, 8, 70000, false});

  bool all_ok = true;
  uint64_t seed = 1;
  for (const Case& c : cases) all_ok &= run_case(c, seed++);

  if (timing) {
    const float copy = copy_bandwidth_gbps(kTimingReps);
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy);
    for (int64_t C : {4096, 14336}) {
      time_case(Activation::kGeluTanh, false, false, 16384, C, copy);
      time_case(Activation::kGeluTanh, false, true, 16384, C, copy);
    }
    time_case(Activation::kGeluErf, false, false, 16384, 14336, copy);
    time_case(Activation::kGeluErf, false, true, 16384, 14336, copy);
    time_case(Activation::kSilu, true, false, 16384, 14336, copy);
    time_case(Activation::kGeluTanh, true, false, 16384, 14336, copy);
    time_case(Activation::kGeluErf, true, false, 16384, 14336, copy);
  }
  std::printf("%s\n", all_ok ? "ALL PASS" : "SOME FAILED");
  return all_ok ? 0 : 1;
}
