// The decode-attention launcher outside JAX: correctness against a float64
// CPU reference over the kernels' paths, then (with `bench`) device timings
// of the benchmark shapes. Not part of the library (CMake skips it).
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp \
//     -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a \
//     tests/cuda/decode.cu cpp/kernels/decode/launch_decode.cu -o /tmp/decode_test
//   /tmp/decode_test          # correctness
//   /tmp/decode_test bench    # + GB/s of K + V at 32/8 heads, D128, bf16, Tq 1
//   /tmp/decode_test profile B  # the batch-B rows once each, for Nsight Compute:
//     ncu --profile-from-start off --set full -k regex:decode_split /tmp/decode_test profile 256
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/cpu/host_float.h"
#include "common/testing/standalone_check.h"
#include "common/testing/standalone_timing.h"
#include "kernels/decode/launch.h"

using namespace jaxcraft;

namespace {

struct Case {
  const char* name;
  DType dtype;
  int B, Tq, N, K, H;
  int S;              // contiguous: cache length; paged: pages per sequence * page_size
  int page_size;      // 0: contiguous
  float soft_cap = 0.f;
  int window_left = -1;
  int max_splits = 64;
  bool bad_page = false;
};

size_t elem_size(DType t) { return t == DType::kF32 ? 4 : 2; }

// Random values rounded to the element type; `host` keeps them as doubles.
std::vector<uint8_t> random_buffer(DType t, size_t n, std::mt19937& rng, std::vector<double>& host) {
  std::normal_distribution<float> dist;
  std::vector<uint8_t> bytes(n * elem_size(t));
  host.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = dist(rng);
    if (t == DType::kF32) {
      std::memcpy(&bytes[i * 4], &x, 4);
      host[i] = x;
    } else if (t == DType::kBF16) {
      const bf16_t y = from_float<bf16_t>(x);
      std::memcpy(&bytes[i * 2], &y, 2);
      host[i] = to_float(y);
    } else {
      const f16_t y = from_float<f16_t>(x);
      std::memcpy(&bytes[i * 2], &y, 2);
      host[i] = to_float(y);
    }
  }
  return bytes;
}

double read_elem(DType t, const uint8_t* p, size_t i) {
  if (t == DType::kF32) {
    float x;
    std::memcpy(&x, p + i * 4, 4);
    return x;
  }
  uint16_t bits;
  std::memcpy(&bits, p + i * 2, 2);
  return t == DType::kBF16 ? to_float(bf16_t{bits}) : to_float(f16_t{bits});
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, std::max<size_t>(host.size(), 1) * sizeof(T)));
  if (!host.empty()) CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// The definition in contract/decode.h, in float64.
std::vector<double> reference(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const std::vector<int32_t>& lengths,
                              const std::vector<int32_t>& tables, int num_pages, float scale) {
  const int G = c.N / c.K;
  const int page_size = c.page_size ? c.page_size : c.S;
  const int max_pages = c.page_size ? c.S / c.page_size : 1;
  const int64_t capacity = int64_t(max_pages) * page_size;
  std::vector<double> out(size_t(c.B) * c.Tq * c.N * c.H, 0.0);
  for (int b = 0; b < c.B; ++b) {
    const int64_t L = std::clamp<int64_t>(lengths[b], 0, capacity);
    for (int t = 0; t < c.Tq; ++t) {
      const int64_t pos = L - c.Tq + t;
      for (int n = 0; n < c.N; ++n) {
        const int kh = n / G;
        const double* qr = &q[((size_t(b) * c.Tq + t) * c.N + n) * c.H];
        std::vector<double> logits;
        std::vector<int64_t> rows;
        for (int64_t j = 0; j <= pos && j < L; ++j) {
          if (c.window_left >= 0 && j < pos - c.window_left) continue;
          int64_t page = b, offset = j;
          if (c.page_size) {
            page = tables[size_t(b) * max_pages + j / page_size];
            offset = j % page_size;
            if (page < 0 || page >= num_pages) continue;
          }
          const int64_t row = ((page * page_size + offset) * c.K + kh) * c.H;
          double dot = 0;
          for (int h = 0; h < c.H; ++h) dot += qr[h] * k[row + h];
          double x = dot * scale;
          if (c.soft_cap > 0) x = c.soft_cap * std::tanh(x / c.soft_cap);
          logits.push_back(x);
          rows.push_back(row);
        }
        if (logits.empty()) continue;
        const double mx = *std::max_element(logits.begin(), logits.end());
        double total = 0;
        double* o = &out[((size_t(b) * c.Tq + t) * c.N + n) * c.H];
        for (size_t i = 0; i < logits.size(); ++i) {
          const double w = std::exp(logits[i] - mx);
          total += w;
          for (int h = 0; h < c.H; ++h) o[h] += w * v[rows[i] + h];
        }
        for (int h = 0; h < c.H; ++h) o[h] /= total;
      }
    }
  }
  return out;
}

bool run_case(const Case& c, std::mt19937& rng) {
  const int G = c.N / c.K;
  (void)G;
  const bool paged = c.page_size > 0;
  const int page_size = paged ? c.page_size : c.S;
  const int max_pages = paged ? c.S / c.page_size : 1;
  const int num_pages = paged ? c.B * max_pages + 3 : c.B;
  const size_t q_elems = size_t(c.B) * c.Tq * c.N * c.H;
  const size_t kv_elems = size_t(num_pages) * page_size * c.K * c.H;
  std::vector<double> q, k, v;
  auto q_bytes = random_buffer(c.dtype, q_elems, rng, q);
  auto k_bytes = random_buffer(c.dtype, kv_elems, rng, k);
  auto v_bytes = random_buffer(c.dtype, kv_elems, rng, v);

  // Lengths: 0, 1, full, past the capacity, and random.
  std::vector<int32_t> lengths(c.B);
  const int capacity = max_pages * page_size;
  const int fixed[] = {0, 1, capacity, capacity + 17};
  for (int b = 0; b < c.B; ++b)
    lengths[b] = b < 4 ? fixed[b] : std::uniform_int_distribution<int>(0, capacity)(rng);
  std::vector<int32_t> tables;
  if (paged) {
    std::vector<int32_t> perm(num_pages);
    for (int i = 0; i < num_pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    tables.assign(perm.begin(), perm.begin() + size_t(c.B) * max_pages);
    if (c.bad_page && max_pages > 1) {
      tables[1] = -5;                           // sequence 0
      tables[size_t(max_pages) * (c.B - 1)] = num_pages + 100;  // last sequence, first page
    }
  }
  // NaN in every cache row no query may see (past a sequence's length, and
  // the pages no table names): a kernel that lets such a row into P V, even
  // with a zero weight, returns NaN.
  {
    std::vector<bool> visible(size_t(num_pages) * page_size, false);
    for (int b = 0; b < c.B; ++b)
      for (int j = 0; j < std::min(lengths[b], capacity); ++j) {
        const int64_t page = paged ? tables[size_t(b) * max_pages + j / page_size] : b;
        if (page >= 0 && page < num_pages) visible[size_t(page) * page_size + j % page_size] = true;
      }
    const uint32_t nan32 = 0x7fc00000u;
    const uint16_t nan16 = c.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00;
    const size_t row_elems = size_t(c.K) * c.H;
    for (size_t row = 0; row < visible.size(); ++row) {
      if (visible[row]) continue;
      for (size_t e = row * row_elems; e < (row + 1) * row_elems; ++e) {
        for (auto* bytes : {&k_bytes, &v_bytes}) {
          if (elem_size(c.dtype) == 4) std::memcpy(&(*bytes)[e * 4], &nan32, 4);
          else std::memcpy(&(*bytes)[e * 2], &nan16, 2);
        }
      }
    }
  }
  const float scale = 1.f / std::sqrt(float(c.H));
  const auto ref = reference(c, q, k, v, lengths, tables, num_pages, scale);

  const size_t esize = elem_size(c.dtype);
  void *dq = device_copy(q_bytes), *dk = device_copy(k_bytes), *dv = device_copy(v_bytes);
  int32_t* dlen = device_copy(lengths);
  int32_t* dtab = paged ? device_copy(tables) : nullptr;
  void* dout = nullptr;
  float *dpo = nullptr, *dpl = nullptr;
  const size_t rows = size_t(c.B) * c.Tq * c.N;
  CHECK(cudaMalloc(&dout, q_elems * esize));
  CHECK(cudaMemset(dout, 0xff, q_elems * esize));  // NaN poison: unwritten outputs show
  if (c.max_splits > 0) {
    CHECK(cudaMalloc(&dpo, c.max_splits * rows * c.H * sizeof(float)));
    CHECK(cudaMalloc(&dpl, c.max_splits * rows * sizeof(float)));
    CHECK(cudaMemset(dpo, 0xff, c.max_splits * rows * c.H * sizeof(float)));
    CHECK(cudaMemset(dpl, 0xff, c.max_splits * rows * sizeof(float)));
  }

  DecodeParams p;
  p.dtype = c.dtype;
  p.batch = c.B;
  p.seqlen_q = c.Tq;
  p.num_heads = c.N;
  p.num_kv_heads = c.K;
  p.head_dim = c.H;
  p.paged = paged;
  p.num_pages = num_pages;
  p.page_size = page_size;
  p.max_pages = max_pages;
  p.scale = scale;
  p.soft_cap = c.soft_cap;
  p.window_left = c.window_left;
  p.q = dq;
  p.k = dk;
  p.v = dv;
  p.kv_lengths = dlen;
  p.block_tables = dtab;
  p.o = dout;
  p.partial_o = dpo;
  p.partial_lse = dpl;
  p.max_splits = c.max_splits;
  CHECK(launch_decode_attention(p, 0));
  CHECK(cudaDeviceSynchronize());

  std::vector<uint8_t> out(q_elems * esize);
  CHECK(cudaMemcpy(out.data(), dout, out.size(), cudaMemcpyDeviceToHost));
  const double tol = c.dtype == DType::kF32 ? 2e-5 : (c.dtype == DType::kF16 ? 3e-3 : 2e-2);
  double worst = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < q_elems; ++i) {
    const double got = read_elem(c.dtype, out.data(), i);
    const double err = std::fabs(got - ref[i]) / std::max(1.0, std::fabs(ref[i]));
    if (!(err <= tol)) {  // NaN fails too
      if (bad++ == 0) first_bad = i;
    }
    if (std::isfinite(err)) worst = std::max(worst, err);
  }
  std::printf("%-34s max rel err %.2e (tol %.0e) %s", c.name, worst, tol, bad ? "FAIL" : "ok");
  if (bad) {
    const size_t row = first_bad / c.H;
    std::printf("  %zu bad, first at b=%zu t=%zu n=%zu h=%zu: got %g want %g", bad,
                row / (size_t(c.Tq) * c.N), row / c.N % c.Tq, row % c.N, first_bad % c.H,
                read_elem(c.dtype, out.data(), first_bad), ref[first_bad]);
  }
  std::printf("\n");
  for (void* ptr : {dq, dk, dv, static_cast<void*>(dlen), static_cast<void*>(dtab), dout,
                    static_cast<void*>(dpo), static_cast<void*>(dpl)})
    if (ptr) CHECK(cudaFree(ptr));
  return bad == 0;
}

// The read-only ceiling: every 16-byte vector of a and b read once, kUnroll
// pairs in flight per thread; the xor keeps the loads alive.
template <int kUnroll>
__global__ void read_all(const uint4* a, const uint4* b, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      x[u] = __ldcs(a + i + u * stride);
      y[u] = __ldcs(b + i + u * stride);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      acc ^= x[u].x ^ x[u].y ^ x[u].z ^ x[u].w ^ y[u].x ^ y[u].y ^ y[u].z ^ y[u].w;
  }
  for (; i < n; i += stride) acc ^= a[i].x ^ b[i].x;
  if (acc == 0x9e3779b9u) *sink = acc;
}

// GB/s of K + V read (2 B S K D bytes) at 32/8 heads, D128, bf16, Tq = 1;
// at 8 x 32k also the read-only ceiling over the same bytes.
// Times the benchmark rows. `profile_batch` > 0: only the rows of that
// batch, each cache layout launched once more between cudaProfilerStart and
// cudaProfilerStop (for `ncu --profile-from-start off`), no timings.
void bench(int profile_batch = 0) {
  struct Shape { int B, S; };
  const Shape shapes[] = {{1, 131072}, {8, 32768}, {64, 4096}, {256, 1024}};
  // Pages of 64 keys (the JAX benchmark's) and of 16 (vLLM's default).
  const int N = 32, K = 8, H = 128, kMaxSplits = 128, kIters = 20;
  std::mt19937 rng(7);
  for (const Shape& s : shapes) {
    if (profile_batch > 0 && s.B != profile_batch) continue;
    const size_t kv_elems = size_t(s.B) * s.S * K * H;
    const size_t kv_bytes = 2 * kv_elems * 2;
    void *q, *o, *k, *v;
    float *po, *pl;
    int32_t *len, *tab;
    CHECK(cudaMalloc(&q, size_t(s.B) * N * H * 2));
    CHECK(cudaMalloc(&o, size_t(s.B) * N * H * 2));
    CHECK(cudaMalloc(&k, kv_elems * 2));
    CHECK(cudaMalloc(&v, kv_elems * 2));
    jaxcraft_test::fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q), size_t(s.B) * N * H, 1u);
    jaxcraft_test::fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(k), kv_elems, 2u);
    jaxcraft_test::fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(v), kv_elems, 3u);
    CHECK(cudaGetLastError());
    if (s.B == 8 && profile_batch == 0) {
      uint32_t* sink;
      CHECK(cudaMalloc(&sink, sizeof(uint32_t)));
      int sms = 0;
      CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      float best = 1e30f;
      const auto* k4 = static_cast<const uint4*>(k);
      const auto* v4 = static_cast<const uint4*>(v);
      for (auto* read : {&read_all<4>, &read_all<8>})
        for (int per_sm : {4, 8, 16})
          best = std::min(best, jaxcraft_test::mean_launch_ms([&] {
            read<<<sms * per_sm, 256>>>(k4, v4, kv_elems / 8, sink);
            return cudaGetLastError();
          }, kIters));
      std::printf("read-only ceiling (same bytes)   %8.1f us %7.0f GB/s\n", best * 1e3,
                  kv_bytes / (best / 1e3) / 1e9);
      CHECK(cudaFree(sink));
    }
    CHECK(cudaMalloc(&po, size_t(kMaxSplits) * s.B * N * H * 4));
    CHECK(cudaMalloc(&pl, size_t(kMaxSplits) * s.B * N * 4));
    std::vector<int32_t> lengths(s.B, s.S);
    len = device_copy(lengths);
    for (int page : {0, 64, 16}) {  // 0: contiguous
      const bool paged = page > 0;
      const int pages = paged ? s.B * s.S / page : s.B;
      std::vector<int32_t> perm(pages);
      for (int i = 0; i < pages; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      tab = device_copy(perm);
      DecodeParams p;
      p.dtype = DType::kBF16;
      p.batch = s.B;
      p.seqlen_q = 1;
      p.num_heads = N;
      p.num_kv_heads = K;
      p.head_dim = H;
      p.paged = paged;
      p.num_pages = pages;
      p.page_size = paged ? page : s.S;
      p.max_pages = paged ? s.S / page : 1;
      p.scale = 1.f / std::sqrt(float(H));
      p.q = q;
      p.k = k;
      p.v = v;
      p.kv_lengths = len;
      p.block_tables = paged ? tab : nullptr;
      p.o = o;
      p.partial_o = po;
      p.partial_lse = pl;
      p.max_splits = kMaxSplits;
      const std::string name = paged ? "paged" + std::to_string(page) : "contiguous";
      if (profile_batch > 0) {
        CHECK(launch_decode_attention(p, 0));  // warm-up
        CHECK(cudaProfilerStart());
        CHECK(launch_decode_attention(p, 0));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaProfilerStop());
        std::printf("%4d x %6d %-10s profiled\n", s.B, s.S, name.c_str());
        CHECK(cudaFree(tab));
        continue;
      }
      const double sec = jaxcraft_test::mean_launch_ms([&] { return launch_decode_attention(p, 0); }, kIters) / 1e3;
      std::printf("%4d x %6d %-10s %8.1f us %7.0f GB/s\n", s.B, s.S, name.c_str(), sec * 1e6,
                  kv_bytes / sec / 1e9);
      CHECK(cudaFree(tab));
    }
    for (void* ptr : {q, o, k, v, static_cast<void*>(po), static_cast<void*>(pl),
                      static_cast<void*>(len)})
      CHECK(cudaFree(ptr));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::string(argv[1]) == "profile") {  // profile B: no correctness cases
    bench(std::atoi(argv[2]));
    return 0;
  }
  std::mt19937 rng(1234);
  const Case cases[] = {
      {"bf16 d128 gqa contiguous", DType::kBF16, 6, 1, 32, 8, 128, 700, 0},
      {"bf16 d128 gqa contiguous 1 split", DType::kBF16, 6, 1, 32, 8, 128, 700, 0, 0.f, -1, 0},
      {"f16 d64 mqa tq3 paged8", DType::kF16, 5, 3, 8, 1, 64, 1024, 8},
      {"bf16 d128 paged16 bad pages", DType::kBF16, 5, 2, 8, 2, 128, 512, 16, 0.f, -1, 64, true},
      {"f16 d128 paged32 bad pages, 1 split", DType::kF16, 6, 1, 16, 4, 128, 640, 32, 0.f, -1, 0,
       true},
      {"bf16 d256 tq16 g8 (8 row chunks)", DType::kBF16, 4, 16, 16, 2, 256, 640, 64},
      {"bf16 d80 padded, window 37", DType::kBF16, 5, 4, 8, 2, 80, 300, 0, 0.f, 37},
      {"f16 d128 soft cap, paged 24", DType::kF16, 5, 2, 4, 4, 128, 480, 24, 3.f},
      {"bf16 d40 (half k16 slice)", DType::kBF16, 4, 1, 4, 2, 40, 130, 0},
      {"bf16 d128 long, few CTAs", DType::kBF16, 4, 1, 8, 1, 128, 20000, 256},
      {"bf16 d136 paged 128", DType::kBF16, 4, 2, 8, 2, 136, 512, 128},
      {"f16 d128 paged64 bad pages, window 150", DType::kF16, 5, 1, 16, 4, 128, 640, 64, 0.f, 150,
       64, true},
      {"bf16 d64 paged128 bad pages, 1 split", DType::kBF16, 5, 2, 8, 2, 64, 768, 128, 0.f, -1, 0,
       true},
      {"f16 d128 paged 40, window 70", DType::kF16, 5, 1, 16, 4, 128, 800, 40, 0.f, 70},
      {"bf16 d256 paged8 bad pages, window 45", DType::kBF16, 4, 2, 8, 2, 256, 320, 8, 0.f, 45, 64,
       true},
      {"f16 d64 tq4 paged32 bad pages", DType::kF16, 5, 4, 16, 2, 64, 704, 32, 0.f, -1, 64, true},
      {"f32 d128 gqa contiguous", DType::kF32, 6, 1, 32, 8, 128, 700, 0},
      {"f32 d64 tq5 paged8 window 9", DType::kF32, 5, 5, 8, 2, 64, 400, 8, 0.f, 9},
      {"f32 d256 mqa tq3 (3 row chunks)", DType::kF32, 4, 3, 4, 1, 256, 520, 0, 2.f},
      {"f32 d48 long, bad pages", DType::kF32, 4, 2, 4, 2, 48, 6000, 32, 0.f, -1, 64, true},
  };
  bool ok = true;
  for (const Case& c : cases) ok &= run_case(c, rng);
  std::printf(ok ? "all cases passed\n" : "FAILURES\n");
  if (argc > 1 && std::string(argv[1]) == "bench") bench();
  return ok ? 0 : 1;
}
