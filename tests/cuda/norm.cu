// Standalone correctness + speed check of the CUDA norm kernels against a
// float64 CPU reference (not part of the library build). From the repo root:
//   nvcc -std=c++17 -O3 -arch=sm_90a -Icpp tests/cuda/norm.cu cpp/kernels/norm/launch_norm.cu -o /tmp/nt && /tmp/nt
// Exit status 0 only when every case passes. Covers the register kernels, the
// sm_90 cluster kernels (rows wider than one block's registers) and the
// streaming fallback (unaligned rows), forward and backward. `--no-timing`
// skips the timings (for compute-sanitizer); `--time-width C` only times the
// layer norm at C columns (one case for Nsight Compute); `--timing-only`
// skips the correctness cases (bench/norm_ab.sh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/testing/standalone_buffers.h"
#include "common/testing/standalone_check.h"
#include "common/testing/standalone_data.h"
#include "common/testing/standalone_timing.h"
#include "kernels/norm/launch.h"
#include "kernels/norm/norm_warp_kernel.cuh"

using jaxcraft::DType;
using jaxcraft::NormBwdParams;
using jaxcraft::NormFwdParams;

namespace {

using namespace jaxcraft_test;

constexpr float kEpsilon = 1e-5f;
constexpr double kInputMean = 2.0;  // an offset mean exercises the two-pass variance
constexpr int kRowsPerPartial = 32;  // as jaxcraft/ops/norm.py chooses num_partials
// Accumulation in float32 over up to 64K columns (tree sums) or a few hundred
// rows (sequential sums): relative error bound per accumulated term.
constexpr double kF32Eps = 1.0 / (1 << 23);
constexpr double kStatsTol = 1e-5;
constexpr int kTimingReps = 20;

// One unit in the last place, relative, of each dtype: outputs may be off by
// the final rounding (half an ulp) plus float32 arithmetic, so one ulp bounds it.
double ulp(DType dt) {
  switch (dt) {
    case DType::kBF16: return 1.0 / (1 << 7);
    case DType::kF16: return 1.0 / (1 << 10);
    case DType::kF32: return 1e-5;  // float32 statistics over up to 64K columns
  }
  return 0;
}

struct Tensor {
  std::vector<uint8_t> bytes;
  std::vector<double> val;  // the stored values, for the reference
};

Tensor random_tensor(size_t n, DType dt, Rng& rng, double mean) {
  Tensor t{std::vector<uint8_t>(n * dsize(dt)), std::vector<double>(n)};
  for (size_t i = 0; i < n; ++i) t.val[i] = put(t.bytes, i, float(mean + rng.normal()), dt);
  return t;
}

std::vector<float> random_floats(size_t n, Rng& rng, double mean, double std) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(mean + std * rng.normal());
  return v;
}

struct Case {
  DType dt;
  int64_t rows, cols;
  bool rms, residual, scale, bias, dh_extra;
  int64_t num_partials;  // 0: as the Python side chooses
};

bool run_case(const Case& c, uint64_t seed) {
  const int64_t R = c.rows, C = c.cols;
  const size_t n = size_t(R) * C, es = dsize(c.dt);
  const int64_t default_partials = (R + kRowsPerPartial - 1) / kRowsPerPartial;
  const int64_t partials = c.num_partials ? c.num_partials : default_partials;
  Rng rng{seed};
  const Tensor x = random_tensor(n, c.dt, rng, kInputMean);
  const Tensor res = random_tensor(c.residual ? n : 0, c.dt, rng, 0.0);
  const std::vector<float> scale = random_floats(c.scale ? C : 0, rng, 1.0, 0.1);
  const std::vector<float> bias = random_floats(c.bias ? C : 0, rng, 0.0, 0.1);
  const Tensor dy = random_tensor(n, c.dt, rng, 0.0);
  const Tensor extra = random_tensor(c.dh_extra ? n : 0, c.dt, rng, 0.0);

  // Reference forward, float64 (h rounds to the dtype, as the kernel defines it).
  std::vector<uint8_t> h_bytes(n * es);
  std::vector<double> h(n), mean(R), rstd(R);
  for (size_t i = 0; i < n; ++i)
    h[i] = c.residual ? put(h_bytes, i, float(x.val[i] + res.val[i]), c.dt) : x.val[i];
  for (int64_t r = 0; r < R; ++r) {
    const double* row = &h[size_t(r) * C];
    double m = 0, var = 0;
    if (!c.rms) {
      for (int64_t j = 0; j < C; ++j) m += row[j];
      m /= C;
    }
    for (int64_t j = 0; j < C; ++j) var += (row[j] - m) * (row[j] - m);
    mean[r] = m;
    rstd[r] = 1.0 / std::sqrt(var / C + kEpsilon);
  }

  DeviceBuffer d_x(x.bytes.data(), n * es), d_res(res.bytes.data(), res.bytes.size());
  DeviceBuffer d_scale(scale.data(), scale.size() * 4), d_bias(bias.data(), bias.size() * 4);
  DeviceBuffer d_y(n * es), d_h(c.residual ? n * es : 0), d_mean(R * 4), d_rstd(R * 4);
  NormFwdParams fp;
  fp.dtype = c.dt;
  fp.rows = R;
  fp.cols = C;
  fp.epsilon = kEpsilon;
  fp.rms = c.rms;
  fp.x = d_x.p;
  fp.residual = c.residual ? d_res.p : nullptr;
  fp.scale = c.scale ? static_cast<float*>(d_scale.p) : nullptr;
  fp.bias = c.bias ? static_cast<float*>(d_bias.p) : nullptr;
  fp.y = d_y.p;
  fp.h_out = c.residual ? d_h.p : nullptr;
  fp.mean = c.rms ? nullptr : static_cast<float*>(d_mean.p);
  fp.rstd = static_cast<float*>(d_rstd.p);
  CHECK(jaxcraft::launch_norm_fwd(fp, nullptr));
  CHECK(cudaDeviceSynchronize());

  bool ok = true;
  std::printf("%-4s rows=%-4lld cols=%-6lld %s%s%s%s%s partials=%-3lld:", dname(c.dt),
              (long long)R, (long long)C, c.rms ? "rms  " : "layer", c.residual ? " +res" : "",
              c.scale ? " +scale" : "", c.bias ? " +bias" : "", c.dh_extra ? " +dh_extra" : "",
              (long long)partials);
  {
    const std::vector<uint8_t> y = d_y.back();
    const std::vector<float> got_mean = d_mean.back<float>(), got_rstd = d_rstd.back<float>();
    Err ey, eh, em, er;
    for (int64_t r = 0; r < R; ++r) {
      if (!c.rms) em.add(got_mean[r], mean[r], kStatsTol);
      er.add(got_rstd[r], rstd[r], kStatsTol * rstd[r]);
      for (int64_t j = 0; j < C; ++j) {
        const size_t i = size_t(r) * C + j;
        double ref = (h[i] - mean[r]) * rstd[r];
        if (c.scale) ref *= scale[j];
        if (c.bias) ref += bias[j];
        ey.add(get(y, i, c.dt), ref, ulp(c.dt) * std::max(1.0, std::fabs(ref)));
      }
    }
    report("y", ey, &ok);
    if (c.residual) {
      const std::vector<uint8_t> got_h = d_h.back();
      for (size_t i = 0; i < n; ++i) eh.add(get(got_h, i, c.dt), h[i], kF32Eps);
      report("h", eh, &ok);
    }
    if (!c.rms) report("mean", em, &ok);
    report("rstd", er, &ok);
  }

  // Backward from the reference statistics rounded to float32 (the kernel's inputs).
  std::vector<float> mean_f(mean.begin(), mean.end()), rstd_f(rstd.begin(), rstd.end());
  DeviceBuffer d_hin(h_bytes.data(), c.residual ? n * es : 0);
  DeviceBuffer d_dy(dy.bytes.data(), n * es), d_extra(extra.bytes.data(), extra.bytes.size());
  DeviceBuffer d_mean_in(mean_f.data(), R * 4), d_rstd_in(rstd_f.data(), R * 4);
  DeviceBuffer d_dh(n * es), d_dscale(size_t(partials) * C * 4), d_dbias(size_t(partials) * C * 4);
  NormBwdParams bp;
  bp.dtype = c.dt;
  bp.rows = R;
  bp.cols = C;
  bp.rms = c.rms;
  bp.dy = d_dy.p;
  bp.h = c.residual ? d_hin.p : d_x.p;
  bp.scale = c.scale ? static_cast<float*>(d_scale.p) : nullptr;
  bp.mean = c.rms ? nullptr : static_cast<float*>(d_mean_in.p);
  bp.rstd = static_cast<float*>(d_rstd_in.p);
  bp.dh_extra = c.dh_extra ? d_extra.p : nullptr;
  bp.dh = d_dh.p;
  bp.dscale_partial = static_cast<float*>(d_dscale.p);
  bp.dbias_partial = c.bias ? static_cast<float*>(d_dbias.p) : nullptr;
  bp.num_partials = partials;
  CHECK(jaxcraft::launch_norm_bwd(bp, nullptr));
  CHECK(cudaDeviceSynchronize());
  {
    const std::vector<uint8_t> dh = d_dh.back();
    const std::vector<float> ds = d_dscale.back<float>(), db = d_dbias.back<float>();
    std::vector<double> dscale(C, 0), dbias(C, 0), dscale_abs(C, 0), dbias_abs(C, 0), xhat(C);
    Err edh, eds, edb;
    for (int64_t r = 0; r < R; ++r) {
      double sum_g = 0, sum_gx = 0;
      for (int64_t j = 0; j < C; ++j) {
        const size_t i = size_t(r) * C + j;
        xhat[j] = (h[i] - (c.rms ? 0.0 : double(mean_f[r]))) * double(rstd_f[r]);
        const double g = dy.val[i] * (c.scale ? scale[j] : 1.0);
        sum_g += g;
        sum_gx += g * xhat[j];
        dscale[j] += dy.val[i] * xhat[j];
        dbias[j] += dy.val[i];
        dscale_abs[j] += std::fabs(dy.val[i] * xhat[j]);
        dbias_abs[j] += std::fabs(dy.val[i]);
      }
      const double mean_g = c.rms ? 0.0 : sum_g / C, mean_gx = sum_gx / C;
      for (int64_t j = 0; j < C; ++j) {
        const size_t i = size_t(r) * C + j;
        const double g = dy.val[i] * (c.scale ? scale[j] : 1.0);
        double ref = rstd_f[r] * (g - mean_g - xhat[j] * mean_gx);
        if (c.dh_extra) ref += extra.val[i];
        edh.add(get(dh, i, c.dt), ref, ulp(c.dt) * std::max(1.0, std::fabs(ref)));
      }
    }
    // Sequential float32 sums over the rows of a partial, then float64 here.
    const double rows_bound = double((R + partials - 1) / partials + 1);
    for (int64_t j = 0; j < C; ++j) {
      double got_s = 0, got_b = 0;
      for (int64_t q = 0; q < partials; ++q) {
        got_s += ds[size_t(q) * C + j];
        if (c.bias) got_b += db[size_t(q) * C + j];
      }
      const double tol_s = 4 * rows_bound * kF32Eps * dscale_abs[j] + kF32Eps;
      eds.add(got_s, dscale[j], tol_s);
      if (c.bias) edb.add(got_b, dbias[j], 4 * rows_bound * kF32Eps * dbias_abs[j] + kF32Eps);
    }
    report("dh", edh, &ok);
    report("dscale", eds, &ok);
    if (c.bias) report("dbias", edb, &ok);
  }
  std::printf("  %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

// Speed at the benchmark's shapes (bench/specs.py NORM_SPECS: 64 MB of bf16
// x, 512 to 65536 columns): scale (and for layer norm bias); bytes = what
// must cross HBM once, as the benchmark counts them: forward x (and the
// residual) read, y (and h) written; backward dy, h (and dh_extra) read, dh
// written, the dscale/dbias partial rows not counted.
void time_case(int64_t C, bool rms, bool residual, float copy_gbps) {
  const int64_t R = (int64_t(64) << 20) / (2 * C);
  const size_t n = size_t(R) * C, es = 2;
  const int64_t partials = std::min<int64_t>(1024, (R + kRowsPerPartial - 1) / kRowsPerPartial);
  Rng rng{1};
  const Tensor x = random_tensor(n, DType::kBF16, rng, kInputMean);
  const std::vector<float> ones(C, 1.f);
  DeviceBuffer d_x(x.bytes.data(), n * es), d_dy(x.bytes.data(), n * es), d_r(x.bytes.data(), n * es);
  DeviceBuffer d_y(n * es), d_dh(n * es), d_h(n * es);
  DeviceBuffer d_scale(ones.data(), C * 4), d_bias(ones.data(), C * 4), d_mean(R * 4), d_rstd(R * 4);
  DeviceBuffer d_ds(size_t(partials) * C * 4), d_db(size_t(partials) * C * 4);
  NormFwdParams fp;
  fp.dtype = DType::kBF16;
  fp.rows = R;
  fp.cols = C;
  fp.rms = rms;
  fp.x = d_x.p;
  fp.residual = residual ? d_r.p : nullptr;
  fp.h_out = residual ? d_h.p : nullptr;
  fp.scale = static_cast<float*>(d_scale.p);
  fp.bias = rms ? nullptr : static_cast<float*>(d_bias.p);
  fp.y = d_y.p;
  fp.mean = rms ? nullptr : static_cast<float*>(d_mean.p);
  fp.rstd = static_cast<float*>(d_rstd.p);
  NormBwdParams bp;
  bp.dtype = DType::kBF16;
  bp.rows = R;
  bp.cols = C;
  bp.rms = rms;
  bp.dy = d_dy.p;
  bp.h = d_x.p;
  bp.scale = fp.scale;
  bp.mean = fp.mean;
  bp.rstd = fp.rstd;
  bp.dh_extra = residual ? d_r.p : nullptr;
  bp.dh = d_dh.p;
  bp.dscale_partial = static_cast<float*>(d_ds.p);
  bp.dbias_partial = rms ? nullptr : static_cast<float*>(d_db.p);
  bp.num_partials = partials;
  auto time_ms = [&](auto launch) { return mean_launch_ms(launch, kTimingReps); };
  const float fwd_ms = time_ms([&] { return jaxcraft::launch_norm_fwd(fp, nullptr); });
  const float bwd_ms = time_ms([&] { return jaxcraft::launch_norm_bwd(bp, nullptr); });
  const double fwd_gbps = (residual ? 4.0 : 2.0) * n * es / fwd_ms / 1e6;
  const double bwd_gbps = (residual ? 4.0 : 3.0) * n * es / bwd_ms / 1e6;
  std::printf("timing bf16 %-5s%s [%6lld, %5lld]: fwd %6.1f us %5.0f GB/s (%3.0f%% of copy)  "
              "bwd %6.1f us %5.0f GB/s (%3.0f%% of copy)\n",
              rms ? "rms" : "layer", residual ? "+res" : "    ", (long long)R, (long long)C, fwd_ms * 1e3,
              fwd_gbps, 100 * fwd_gbps / copy_gbps, bwd_ms * 1e3, bwd_gbps, 100 * bwd_gbps / copy_gbps);
}

}  // namespace

int main(int argc, char** argv) {
  const bool timing = !(argc > 1 && std::strcmp(argv[1], "--no-timing") == 0);
  const bool timing_only = argc > 1 && std::strcmp(argv[1], "--timing-only") == 0;
  if (argc > 2 && std::strcmp(argv[1], "--time-width") == 0) {
    time_case(std::atoll(argv[2]), false, false, copy_bandwidth_gbps(kTimingReps));
    return 0;
  }
  int device = 0, major = 0, minor = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  cudaFuncAttributes attrs;
  CHECK(cudaFuncGetAttributes(&attrs, jaxcraft::norm::norm_fwd_warp_kernel<float, 256, 16, 8>));
  std::printf("device sm_%d%d; cluster kernel image: ptx %d, binary %d (clusters used: %s)\n",
              major, minor, attrs.ptxVersion, attrs.binaryVersion,
              major >= 9 && attrs.ptxVersion >= 90 ? "yes" : "no");

  // Column counts: the forward's warp kernel from one lane per row (8) to
  // parts of warps (200, 1000: row tails inside a lane's vectors, rows past
  // the last one in a warp) and whole warps (2056 .. 32768), and its cluster
  // kernels on sm_90 (bf16 65536, f32 32768 and 65536); the backward's
  // register kernels (<= 8192 bf16) and cluster kernels on sm_90 (8200 ..
  // 65536); streaming (8193: not a whole number of 16-byte vectors; 65536
  // f32 backward: wider than 8 CTAs x 1024 vectors; clusters on older GPUs).
  const int64_t kCols[] = {8, 200, 1000, 2056, 4096, 8192 + 8, 8193, 16384, 32768, 65536};
  const int64_t kRows[] = {5, 64, 300};
  const DType kTypes[] = {DType::kBF16, DType::kF32, DType::kF16};
  std::vector<Case> cases;
  for (DType dt : kTypes)
    for (int64_t C : kCols)
      for (int64_t R : kRows) {
        if (dt == DType::kF16 && R != kRows[1]) continue;  // f16 shares bf16's code paths
        if (dt != DType::kBF16 && C == 8193) continue;
        cases.push_back({dt, R, C, false, true, true, true, true, 0});
        // More partials than rows: clusters with no rows must still write zeros.
        cases.push_back({dt, R, C, true, false, true, false, false, R == kRows[0] ? 2 * R : 0});
        // More partials than blocks or clusters fit at once: the rows past the grid are zeros.
        if (R == kRows[2] && C <= 16384) cases.push_back({dt, R, C, false, false, true, true, false, 1024});
      }
  bool all_ok = true;
  uint64_t seed = 1;
  if (!timing_only)
    for (const Case& c : cases) all_ok &= run_case(c, seed++);

  const float copy = timing ? copy_bandwidth_gbps(kTimingReps) : 0.f;
  if (timing) std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy);
  for (int64_t C = 512; C <= 65536; C *= 2)
    for (bool rms : {false, true})
      for (bool residual : {false, true})
        if (timing) time_case(C, rms, residual, copy);

  if (!timing_only) std::printf("%s\n", all_ok ? "ALL PASS" : "SOME FAILED");
  return all_ok ? 0 : 1;
}
