// Standalone correctness + speed check of the CUDA softmax kernels against a
// float64 CPU reference (not part of the library build). From the repo root:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -gencode=arch=compute_80,code=sm_80 \
//     -gencode=arch=compute_90a,code=sm_90a tests/cuda/softmax.cu \
//     cpp/kernels/softmax/launch_softmax.cu -o /tmp/softmax_test && /tmp/softmax_test
// Exit status 0 only when every case passes. Covers every rows-kernel
// configuration (warp per row, block per row), the stream kernel with vector
// body (wide rows, odd widths) and without (misaligned buffers), where masks
// (per row, shared, a fully masked row), -inf entries, poisoned outputs, the
// fused backward; then GB/s at the benchmark shapes (--no-timing skips them,
// --timing-only the checks).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/testing/standalone_buffers.h"
#include "common/testing/standalone_check.h"
#include "common/testing/standalone_data.h"
#include "common/testing/standalone_timing.h"
#include "kernels/softmax/launch.h"

using jaxcraft::DType;
using jaxcraft::SoftmaxBwdParams;
using jaxcraft::SoftmaxFwdParams;

namespace {

using namespace jaxcraft_test;

constexpr int kTimingReps = 20;
constexpr double kInputScale = 3.0;  // logits' spread: exp over ~e^±10

enum class Mask { kNone, kFull, kShared };

// Half an ulp of the output dtype relative to the value, plus float32 math
// (exp of arguments up to ~30 in magnitude, the sum over up to 128K terms).
double rel_tol(DType dt) {
  switch (dt) {
    case DType::kBF16: return 1.0 / (1 << 8) + 2e-5;
    case DType::kF16: return 1.0 / (1 << 11) + 2e-5;
    case DType::kF32: return 5e-5;
  }
  return 0;
}
// Absolute floor: values that round to (sub)normal zeros in f16, and the
// backward's cancellation dy - sum(dy y), relative to the row's scale.
double abs_tol(DType dt) { return dt == DType::kF16 ? 1e-7 : 1e-9; }

struct Case {
  DType dtype;
  int64_t rows, cols;
  Mask mask;
  bool misaligned;  // buffers offset by one element: the scalar stream path
};

// Device buffer of n elements of `elem` bytes, at `offset` elements past a
// 256-byte aligned allocation.
bool run_case(const Case& c, uint64_t seed) {
  const DType dt = c.dtype;
  const size_t n = size_t(c.rows * c.cols), es = dsize(dt), off = c.misaligned ? es : 0;
  Rng rng{seed};
  std::vector<uint8_t> x(n * es), dy(n * es), y(n * es, kPoison), dx(n * es, kPoison);
  std::vector<double> xd(n), dyd(n);
  for (size_t i = 0; i < n; ++i) {
    xd[i] = put(x, i, float(rng.gaussian() * kInputScale), dt);
    dyd[i] = put(dy, i, float(rng.gaussian()), dt);
  }
  // -inf entries (additive attention masks): exp gives 0, the row stays finite.
  if (n > 3) xd[n / 3] = put(x, n / 3, -std::numeric_limits<float>::infinity(), dt);
  const int64_t mask_rows = c.mask == Mask::kFull ? c.rows : (c.mask == Mask::kShared ? 1 : 0);
  std::vector<uint8_t> mask(size_t(mask_rows * c.cols));
  for (auto& m : mask) m = rng.uniform() < 0.7;
  if (c.mask == Mask::kFull && c.rows > 1)
    std::fill(mask.begin() + c.cols, mask.begin() + 2 * c.cols, 0);  // row 1: nothing kept
  if (c.mask == Mask::kShared) mask[0] = 1;

  // Outputs start poisoned; with c.misaligned every buffer is viewed one element in.
  DeviceBuffer dx_in(n * es), dmask(mask.data(), mask.size()), dy_out(n * es), ddy(n * es), ddx(n * es);
  CHECK(cudaMemcpy(dx_in.at(off), x.data(), n * es, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ddy.at(off), dy.data(), n * es, cudaMemcpyHostToDevice));

  SoftmaxFwdParams fp;
  fp.dtype = dt;
  fp.rows = c.rows;
  fp.cols = c.cols;
  fp.x = dx_in.at(off);
  fp.y = dy_out.at(off);
  if (mask_rows) {
    fp.mask = dmask.at(0);
    fp.mask_row_stride = mask_rows == 1 ? 0 : c.cols;
  }
  CHECK(launch_softmax_fwd(fp, 0));
  SoftmaxBwdParams bp;
  bp.dtype = dt;
  bp.rows = c.rows;
  bp.cols = c.cols;
  bp.y = dy_out.at(off);
  bp.dy = ddy.at(off);
  bp.dx = ddx.at(off);
  CHECK(launch_softmax_bwd(bp, 0));
  CHECK(cudaDeviceSynchronize());
  y = dy_out.back(off);
  dx = ddx.back(off);

  double worst_y = 0, worst_dx = 0;
  bool ok = true;
  for (int64_t r = 0; r < c.rows && ok; ++r) {
    const uint8_t* keep = mask_rows ? mask.data() + (mask_rows == 1 ? 0 : r * c.cols) : nullptr;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < c.cols; ++j)
      if (!keep || keep[j]) m = std::max(m, xd[r * c.cols + j]);
    for (int64_t j = 0; j < c.cols; ++j)
      if ((!keep || keep[j]) && m > -INFINITY) s += std::exp(xd[r * c.cols + j] - m);
    // Backward reference from the kernel's own y (what the op saves).
    double dot = 0, scale = 0;
    for (int64_t j = 0; j < c.cols; ++j) {
      const size_t i = size_t(r * c.cols + j);
      dot += get(y, i, dt) * dyd[i];
      scale += std::abs(get(y, i, dt) * dyd[i]);
    }
    for (int64_t j = 0; j < c.cols && ok; ++j) {
      const size_t i = size_t(r * c.cols + j);
      const bool kept = !keep || keep[j];
      const double ref = kept && m > -INFINITY ? std::exp(xd[i] - m) / s : 0.0;
      const double got = get(y, i, dt);
      const double err = std::abs(got - ref);
      worst_y = std::max(worst_y, err);
      if (!(err <= rel_tol(dt) * ref + abs_tol(dt))) {
        std::printf("  y[%lld, %lld] = %g, expected %g\n", (long long)r, (long long)j, got, ref);
        ok = false;
      }
      const double yv = get(y, i, dt);
      const double dref = yv * (dyd[i] - dot);
      const double dgot = get(dx, i, dt);
      const double derr = std::abs(dgot - dref);
      worst_dx = std::max(worst_dx, derr);
      const double dtol = rel_tol(dt) * std::abs(dref) + 4e-6 * yv * (std::abs(dyd[i]) + scale) + abs_tol(dt);
      if (!(derr <= dtol)) {
        std::printf("  dx[%lld, %lld] = %g, expected %g\n", (long long)r, (long long)j, dgot, dref);
        ok = false;
      }
    }
  }
  const char* mname = c.mask == Mask::kNone ? "none" : c.mask == Mask::kFull ? "full" : "shared";
  std::printf("%s %-4s %6lld x %-7lld mask %-6s%s  max err y %.3g dx %.3g\n", ok ? "PASS" : "FAIL",
              dname(dt), (long long)c.rows, (long long)c.cols, mname, c.misaligned ? " misaligned" : "",
              worst_y, worst_dx);
  return ok;
}

// Forward: read x, write y (2 passes of rows x cols); backward: read y and
// dy, write dx (3 passes). `masked`: the forward only, with one mask row
// (all kept) shared by every row, whose bytes ride in the ring beside x.
void time_case(DType dt, int64_t rows, int64_t cols, float copy, bool masked = false) {
  const size_t bytes = size_t(rows * cols) * dsize(dt);
  void *x, *y, *g, *d;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMalloc(&g, bytes));
  CHECK(cudaMalloc(&d, bytes));
  CHECK(cudaMemset(x, 0, bytes));
  CHECK(cudaMemset(g, 0, bytes));
  uint8_t* mask = nullptr;
  if (masked) {
    CHECK(cudaMalloc(&mask, cols));
    CHECK(cudaMemset(mask, 1, cols));
  }
  SoftmaxFwdParams fp;
  fp.dtype = dt;
  fp.rows = rows;
  fp.cols = cols;
  fp.x = x;
  fp.y = y;
  fp.mask = mask;
  SoftmaxBwdParams bp;
  bp.dtype = dt;
  bp.rows = rows;
  bp.cols = cols;
  bp.y = y;
  bp.dy = g;
  bp.dx = d;
  for (int pass = 0; pass < (masked ? 1 : 2); ++pass) {
    const bool bwd = pass == 1;
    const double sec = 1e-3 * mean_launch_ms(
        [&] { return bwd ? launch_softmax_bwd(bp, 0) : launch_softmax_fwd(fp, 0); }, kTimingReps);
    const double gbps = (bwd ? 3.0 : 2.0) * bytes / sec / 1e9;
    std::printf("  %-4s %6lld x %-7lld %s %8.1f us %7.0f GB/s %5.1f%% of copy\n", dname(dt),
                (long long)rows, (long long)cols, bwd ? "bwd" : masked ? "fwd masked" : "fwd", sec * 1e6,
                gbps, 100 * gbps / copy);
  }
  if (mask) CHECK(cudaFree(mask));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  CHECK(cudaFree(g));
  CHECK(cudaFree(d));
}

}  // namespace

int main(int argc, char** argv) {
  // --no-timing, --timing-only, or --cols=N: the checks of width N only (a
  // short case list for the sanitizers).
  const char* mode = argc > 1 ? argv[1] : "";
  const int64_t only_cols = std::strncmp(mode, "--cols=", 7) == 0 ? std::atoll(mode + 7) : 0;
  const bool timing = std::strcmp(mode, "--no-timing") != 0 && only_cols == 0;
  const bool checks = std::strcmp(mode, "--timing-only") != 0;
  int device = 0, major = 0, minor = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  std::printf("device sm_%d%d\n", major, minor);

  // (rows, cols): one element; odd and prime widths (stream kernel, vector
  // body between scalar head and tail); every rows-kernel group (32 .. 1024
  // threads per row, bf16: 8 columns per vector); past the register limit
  // (stream kernel, 256 and 1024 threads per row); a ~50K vocabulary and a
  // 128K one (sm_90: clusters of 2-16 blocks; the unmasked 16-bit forward
  // four warp-kernel blocks); more rows than one grid covers (grid-stride),
  // and more rows than the resident blocks (clusters) of the rows kernels
  // hold (each walks several rows through its ring, masked at 2048 and 65536
  // columns); a width the warp-per-row forward covers with partly filled
  // lanes (3000); 40 rows of 128K columns (f32 backward: clusters of
  // four-vector blocks, each walking rows through a one-stage ring); 131080
  // columns (16 bits: the same four-vector clusters backward, eight
  // warp-kernel blocks forward; f32: past them, streamed); 6000 columns (the
  // 16-bit forward on four warps, partly filled); 100000 columns (f32
  // forward: clusters of four eight-vector blocks, partly filled); 262144
  // columns (16 bits: the forward on eight warp-kernel CTAs per row, masked
  // on eight 1024-thread ones; f32: streamed); 10000 and 20000 columns (the
  // 16-bit forward on eight warps of 8 and of 16 vectors per lane, float32
  // 10000 on four warps of 32; partly filled).
  const int64_t kShapes[][2] = {{1, 1},     {3, 7},       {5, 8},       {2, 257},    {67, 96},
                                {9, 1000},  {4, 2048},    {3, 4096},    {3, 4097},   {2, 8192},
                                {2, 16384}, {2, 32768},   {2, 50257},   {2, 131072}, {70000, 16},
                                {5000, 2048}, {3000, 4096}, {400, 16384}, {400, 32768},
                                {300, 65536}, {7, 3000},    {40, 131072}, {3, 131080}, {5, 6000},
                                {7, 100000}, {3, 262144}, {5, 10000}, {3, 20000}};
  const DType kTypes[] = {DType::kBF16, DType::kF32, DType::kF16};
  std::vector<Case> cases;
  for (DType dt : kTypes)
    for (const auto& s : kShapes)
      for (Mask m : {Mask::kNone, Mask::kFull, Mask::kShared}) {
        if (dt == DType::kF16 && (s[1] == 50257 || s[1] == 16384)) continue;
        const bool masked_shape = (s[1] < 32768 && s[0] <= 100) || s[1] == 2048 ||
                                  s[1] >= 65536 || (dt == DType::kBF16 && s[1] == 50257);
        if (m != Mask::kNone && !masked_shape) continue;
        cases.push_back({dt, s[0], s[1], m, false});
      }
  for (int64_t cols : {64, 4096, 40000}) {
    cases.push_back({DType::kBF16, 5, cols, Mask::kNone, true});
    cases.push_back({DType::kF32, 5, cols, Mask::kFull, true});
  }
  bool all_ok = true;
  uint64_t seed = 1;
  if (checks)
    for (const Case& c : cases)
      if (only_cols == 0 || c.cols == only_cols) all_ok &= run_case(c, seed++);

  if (timing) {
    const float copy = copy_bandwidth_gbps(kTimingReps);
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy);
    for (DType dt : {DType::kBF16, DType::kF32}) {
      time_case(dt, 16384, 4096, copy);
      time_case(dt, 16384, 8192, copy);
      time_case(dt, 16384, 16384, copy);
      time_case(dt, 16384, 32768, copy);
      time_case(dt, 4096, 131072, copy);
      time_case(dt, 4096, 131072, copy, /*masked=*/true);  // bf16: eight 512-thread CTAs per row
    }
    time_case(DType::kBF16, 8192, 65536, copy);   // forward: clusters of two warp-kernel blocks
    time_case(DType::kBF16, 2048, 262144, copy);  // 512 KiB rows: the four-vector backward
  }
  std::printf("%s\n", all_ok ? "ALL PASS" : "SOME FAILED");
  return all_ok ? 0 : 1;
}
