// Standalone correctness + speed check of the CUDA attention kernels against
// a float64 CPU reference (not part of the library build). From the repo root:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a -Icpp cpp/kernels/attention/standalone_test.cu cpp/kernels/attention/launch_fwd.cu cpp/kernels/attention/launch_bwd.cu cpp/kernels/attention/instances_hdim*.cu -o /tmp/attn_test && /tmp/attn_test
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/standalone_check.h"
#include "kernels/attention/bwd_dkdv_kernel.cuh"
#include "kernels/attention/fwd_kernel.cuh"
#include "kernels/attention/launch.h"
#include "kernels/attention/sm90/bwd_kernel.cuh"
#include "kernels/attention/sm90/fwd_kernel.cuh"

using jaxcraft::DType;


namespace {

constexpr double kTol = 2e-2;       // relative L2 error bound for 16-bit inputs
constexpr double kLseTol = 1e-2;    // absolute, natural-log units
constexpr int kTimingReps = 20;

struct Case {
  int B, T, S, N, K, H;
  bool causal;
  long long offset, wl, wr;
  std::vector<int> q_len, kv_len;  // empty: full
  DType dt;
  std::string name;
};

uint16_t to_bits(float x, DType dt) {
  if (dt == DType::kBF16) {
    __nv_bfloat16 h = __float2bfloat16(x);
    return *reinterpret_cast<uint16_t*>(&h);
  }
  __half h = __float2half(x);
  return *reinterpret_cast<uint16_t*>(&h);
}
float from_bits(uint16_t b, DType dt) {
  if (dt == DType::kBF16) return __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&b));
  return __half2float(*reinterpret_cast<__half*>(&b));
}

struct Tensor16 {
  std::vector<uint16_t> bits;
  std::vector<double> val;  // the rounded values, for the reference
};

Tensor16 random_tensor(size_t n, DType dt, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  Tensor16 t;
  t.bits.resize(n);
  t.val.resize(n);
  for (size_t i = 0; i < n; ++i) {
    t.bits[i] = to_bits(dist(rng), dt);
    t.val[i] = from_bits(t.bits[i], dt);
  }
  return t;
}

bool visible(const Case& c, int b, int i, int j) {
  if (!c.kv_len.empty() && j >= c.kv_len[b]) return false;
  const long long d = i + c.offset;
  if (c.causal && j > d) return false;
  if (c.wl >= 0 && j < d - c.wl) return false;
  if (c.wr >= 0 && j > d + c.wr) return false;
  return true;
}

struct Ref {
  std::vector<double> o, lse, dq, dk, dv;
};

// One (b, n) head of forward and backward in float64; dk/dv go to private
// buffers (summed over the GQA group by the caller).
void ref_head(const Case& c, int b, int n, double scale, const Tensor16& q, const Tensor16& k,
              const Tensor16& v, const Tensor16& d_o, Ref* r, std::vector<double>* dk,
              std::vector<double>* dv) {
  const int T = c.T, S = c.S, N = c.N, K = c.K, H = c.H, kh = n / (N / K);
  auto qi = [&](int i) { return &q.val[((size_t(b) * T + i) * N + n) * H]; };
  auto gi = [&](int i) { return &d_o.val[((size_t(b) * T + i) * N + n) * H]; };
  auto kj = [&](int j) { return &k.val[((size_t(b) * S + j) * K + kh) * H]; };
  auto vj = [&](int j) { return &v.val[((size_t(b) * S + j) * K + kh) * H]; };
  std::vector<double> p(S), dp(S);
  for (int i = 0; i < T; ++i) {
    double* o = &r->o[((size_t(b) * T + i) * N + n) * H];
    double* dq = &r->dq[((size_t(b) * T + i) * N + n) * H];
    double& lse = r->lse[(size_t(b) * N + n) * T + i];
    lse = -INFINITY;
    const bool row_ok = c.q_len.empty() || i < c.q_len[b];
    double m = -INFINITY;
    for (int j = 0; j < S; ++j) {
      p[j] = -INFINITY;
      if (!row_ok || !visible(c, b, i, j)) continue;
      double s = 0;
      for (int h = 0; h < H; ++h) s += qi(i)[h] * kj(j)[h];
      p[j] = s * scale;
      m = std::max(m, p[j]);
    }
    if (m == -INFINITY) continue;  // o, dq stay zero
    double l = 0;
    for (int j = 0; j < S; ++j) l += p[j] == -INFINITY ? 0 : std::exp(p[j] - m);
    lse = m + std::log(l);
    for (int j = 0; j < S; ++j) p[j] = p[j] == -INFINITY ? 0 : std::exp(p[j] - m) / l;
    for (int j = 0; j < S; ++j)
      if (p[j] != 0)
        for (int h = 0; h < H; ++h) o[h] += p[j] * vj(j)[h];
    double delta = 0;
    for (int h = 0; h < H; ++h) delta += gi(i)[h] * o[h];
    for (int j = 0; j < S; ++j) {
      if (p[j] == 0) continue;
      double s = 0;
      for (int h = 0; h < H; ++h) s += gi(i)[h] * vj(j)[h];
      const double ds = p[j] * (s - delta);
      for (int h = 0; h < H; ++h) {
        dq[h] += scale * ds * kj(j)[h];
        (*dk)[size_t(j) * H + h] += scale * ds * qi(i)[h];
        (*dv)[size_t(j) * H + h] += p[j] * gi(i)[h];
      }
    }
  }
}

Ref reference(const Case& c, double scale, const Tensor16& q, const Tensor16& k,
              const Tensor16& v, const Tensor16& d_o) {
  Ref r;
  const size_t nq = size_t(c.B) * c.T * c.N * c.H, nk = size_t(c.B) * c.S * c.K * c.H;
  r.o.assign(nq, 0);
  r.dq.assign(nq, 0);
  r.lse.assign(size_t(c.B) * c.N * c.T, 0);
  r.dk.assign(nk, 0);
  r.dv.assign(nk, 0);
  std::vector<std::vector<double>> dk(c.B * c.N), dv(c.B * c.N);
  std::vector<std::thread> pool;
  for (int b = 0; b < c.B; ++b)
    for (int n = 0; n < c.N; ++n) {
      dk[b * c.N + n].assign(size_t(c.S) * c.H, 0);
      dv[b * c.N + n].assign(size_t(c.S) * c.H, 0);
      pool.emplace_back(ref_head, std::cref(c), b, n, scale, std::cref(q), std::cref(k),
                        std::cref(v), std::cref(d_o), &r, &dk[b * c.N + n], &dv[b * c.N + n]);
    }
  for (auto& t : pool) t.join();
  for (int b = 0; b < c.B; ++b)
    for (int n = 0; n < c.N; ++n) {
      const int kh = n / (c.N / c.K);
      for (int j = 0; j < c.S; ++j)
        for (int h = 0; h < c.H; ++h) {
          const size_t dst = ((size_t(b) * c.S + j) * c.K + kh) * c.H + h;
          r.dk[dst] += dk[b * c.N + n][size_t(j) * c.H + h];
          r.dv[dst] += dv[b * c.N + n][size_t(j) * c.H + h];
        }
    }
  return r;
}

double rel_err(const std::vector<uint16_t>& got, const std::vector<double>& ref, DType dt,
               bool* nan) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = from_bits(got[i], dt);
    if (std::isnan(g)) *nan = true;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
  if (!h.empty()) CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n) CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

bool run_case(const Case& c, std::mt19937& rng) {
  const size_t nq = size_t(c.B) * c.T * c.N * c.H, nk = size_t(c.B) * c.S * c.K * c.H;
  const size_t nrow = size_t(c.B) * c.N * c.T;
  Tensor16 q = random_tensor(nq, c.dt, rng), k = random_tensor(nk, c.dt, rng),
           v = random_tensor(nk, c.dt, rng), d_o = random_tensor(nq, c.dt, rng);
  const double scale = 1.0 / std::sqrt(double(c.H));
  const Ref ref = reference(c, scale, q, k, v, d_o);

  jaxcraft::AttentionShape shape{c.B, c.T, c.S, c.N, c.K, c.H};
  jaxcraft::AttentionMask mask;
  mask.causal = c.causal;
  mask.offset = c.offset;
  mask.window_left = c.wl;
  mask.window_right = c.wr;
  int* d_qlen = c.q_len.empty() ? nullptr : to_device(c.q_len);
  int* d_kvlen = c.kv_len.empty() ? nullptr : to_device(c.kv_len);
  mask.q_lengths = d_qlen;
  mask.kv_lengths = d_kvlen;

  uint16_t *dq_ = to_device(q.bits), *dk_ = to_device(k.bits), *dv_ = to_device(v.bits),
           *ddo = to_device(d_o.bits);
  uint16_t *o = to_device(std::vector<uint16_t>(nq, 0xffff)), *gq = to_device(std::vector<uint16_t>(nq, 0xffff)),
           *gk = to_device(std::vector<uint16_t>(nk, 0xffff)), *gv = to_device(std::vector<uint16_t>(nk, 0xffff));
  float* lse = to_device(std::vector<float>(nrow, NAN));
  float* delta = to_device(std::vector<float>(nrow, NAN));
  float* acc = to_device(std::vector<float>(nq, NAN));

  jaxcraft::AttentionFwdParams fp;
  fp.shape = shape;
  fp.mask = mask;
  fp.dtype = c.dt;
  fp.scale = float(scale);
  fp.q = dq_;
  fp.k = dk_;
  fp.v = dv_;
  fp.o = o;
  fp.lse = lse;
  CHECK(jaxcraft::launch_attention_fwd(fp, 0));
  CHECK(cudaDeviceSynchronize());
  const auto o_h = to_host(o, nq);
  const auto lse_h = to_host(lse, nrow);

  bool nan = false;
  const double e_o = rel_err(o_h, ref.o, c.dt, &nan);
  double e_lse = 0;
  for (size_t i = 0; i < nrow; ++i) {
    if (std::isinf(ref.lse[i]) || std::isinf(lse_h[i])) {
      if (ref.lse[i] != lse_h[i]) e_lse = INFINITY;
    } else {
      e_lse = std::max(e_lse, std::fabs(lse_h[i] - ref.lse[i]));
    }
    if (std::isnan(lse_h[i])) nan = true;
  }

  bool ok = !nan && e_o < kTol && e_lse < kLseTol;
  std::printf("%-44s o %.2e lse %.2e", c.name.c_str(), e_o, e_lse);
  std::vector<uint16_t> dq_first;
  for (int det = 0; det < 2; ++det) {
    jaxcraft::AttentionBwdParams bp;
    bp.shape = shape;
    bp.mask = mask;
    bp.dtype = c.dt;
    bp.scale = float(scale);
    bp.deterministic = det == 1;
    bp.q = dq_;
    bp.k = dk_;
    bp.v = dv_;
    bp.o = o;
    bp.d_o = ddo;
    bp.lse = lse;
    bp.dq = gq;
    bp.dk = gk;
    bp.dv = gv;
    bp.delta = delta;
    bp.dq_accum = acc;
    CHECK(jaxcraft::launch_attention_bwd(bp, 0));
    CHECK(cudaDeviceSynchronize());
    const double e_dq = rel_err(to_host(gq, nq), ref.dq, c.dt, &nan);
    const double e_dk = rel_err(to_host(gk, nk), ref.dk, c.dt, &nan);
    const double e_dv = rel_err(to_host(gv, nk), ref.dv, c.dt, &nan);
    std::printf(" | %s dq %.2e dk %.2e dv %.2e", det ? "det" : "atom", e_dq, e_dk, e_dv);
    ok = ok && !nan && e_dq < kTol && e_dk < kTol && e_dv < kTol;
  }
  std::printf("%s %s\n", nan ? " NaN" : "", ok ? "PASS" : "FAIL");
  for (void* p : {(void*)dq_, (void*)dk_, (void*)dv_, (void*)ddo, (void*)o, (void*)gq, (void*)gk,
                  (void*)gv, (void*)lse, (void*)delta, (void*)acc, (void*)d_qlen, (void*)d_kvlen})
    if (p) CHECK(cudaFree(p));
  return ok;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int B = 2, N = 4, K = 2;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::vector<int> heads = dt == DType::kBF16 ? std::vector<int>{64, 128, 80}
                                                      : std::vector<int>{128, 32, 256, 192};
    for (int H : heads) {
      std::vector<std::pair<int, int>> lens = {{1, 1}, {7, 7}, {64, 64}, {129, 129}, {1000, 1000},
                                               {129, 1000}, {1000, 129}, {7, 129}};
      if (dt == DType::kF16) lens = {{7, 7}, {129, 129}, {300, 200}};
      for (const auto& ts : lens) {
        const int T = ts.first, S = ts.second;
        auto add = [&](const char* what, bool causal, long long off, long long wl, long long wr,
                       std::vector<int> ql, std::vector<int> kl) {
          char name[128];
          std::snprintf(name, sizeof name, "%s H%d T%d S%d %s", dt == DType::kBF16 ? "bf16" : "f16",
                        H, T, S, what);
          out.push_back({B, T, S, N, K, H, causal, off, wl, wr, ql, kl, dt, name});
        };
        add("full", false, 0, -1, -1, {}, {});
        add("causal tl", true, 0, -1, -1, {}, {});
        if (T != S) add("causal br", true, S - T, -1, -1, {}, {});
        add("window 40/9", false, S - T, 40, 9, {}, {});
        add("causal+win 33", true, 0, 33, -1, {}, {});
        add("lens causal", true, 0, -1, -1, {T, (T + 1) / 2}, {0, S * 2 / 3 + 1});
        add("lens full", false, 0, -1, -1, {std::max(T - 3, 0), T}, {S, 0});
      }
    }
  }
  return out;
}

double median_ms(const std::vector<float>& t) {
  std::vector<float> s = t;
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// Device buffers of a [B, S, N, H] bf16 self-attention problem for the
// timing runs: random q, k, v and dO; outputs and scratch left unset.
struct TimingBuffers {
  size_t n;
  uint16_t *q, *k, *v, *o, *o2, *d_o, *gq, *gk, *gv, *gk2;
  float *lse, *delta, *acc;
  TimingBuffers(int B, int S, int N, int H, unsigned seed) : n(size_t(B) * S * N * H) {
    for (uint16_t** p : {&q, &k, &v, &o, &o2, &d_o, &gq, &gk, &gv, &gk2}) CHECK(cudaMalloc(p, n * 2));
    CHECK(cudaMalloc(&lse, size_t(B) * N * S * 4));
    CHECK(cudaMalloc(&delta, size_t(B) * N * S * 4));
    CHECK(cudaMalloc(&acc, n * 4));
    std::vector<uint16_t> h(n);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (auto& x : h) x = to_bits(dist(rng), DType::kBF16);
    for (uint16_t* p : {q, k, v, d_o}) CHECK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  ~TimingBuffers() {
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)o2, (void*)d_o, (void*)gq,
                    (void*)gk, (void*)gv, (void*)gk2, (void*)lse, (void*)delta, (void*)acc})
      CHECK(cudaFree(p));
  }
};

void bench(int B, int S, int N, int H, bool causal) {
  TimingBuffers buf(B, S, N, H, 7);
  uint16_t *q = buf.q, *k = buf.k, *v = buf.v, *o = buf.o, *d_o = buf.d_o, *gq = buf.gq, *gk = buf.gk,
           *gv = buf.gv;
  float *lse = buf.lse, *delta = buf.delta, *acc = buf.acc;

  jaxcraft::AttentionFwdParams fp;
  fp.shape = {B, S, S, N, N, H};
  fp.mask.causal = causal;
  fp.scale = 1.f / std::sqrt(float(H));
  fp.q = q, fp.k = k, fp.v = v, fp.o = o, fp.lse = lse;
  jaxcraft::AttentionBwdParams bp;
  bp.shape = fp.shape;
  bp.mask = fp.mask;
  bp.scale = fp.scale;
  bp.q = q, bp.k = k, bp.v = v, bp.o = o, bp.d_o = d_o, bp.lse = lse;
  bp.dq = gq, bp.dk = gk, bp.dv = gv, bp.delta = delta, bp.dq_accum = acc;

  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const double flops = 4.0 * B * N * double(S) * S * H * (causal ? 0.5 : 1.0);
  for (int det = -1; det < 2; ++det) {
    std::vector<float> ts;
    bp.deterministic = det == 1;
    for (int r = 0; r < kTimingReps + 2; ++r) {
      CHECK(cudaEventRecord(e0));
      CHECK(det < 0 ? jaxcraft::launch_attention_fwd(fp, 0) : jaxcraft::launch_attention_bwd(bp, 0));
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 2) ts.push_back(ms);
    }
    const double ms = median_ms(ts);
    const double f = det < 0 ? flops : 2.5 * flops;
    std::printf("bench B%d S%d N%d H%d %s %-9s %.3f ms  %.1f TFLOP/s\n", B, S, N, H,
                causal ? "causal" : "full  ", det < 0 ? "fwd" : det ? "bwd(det)" : "bwd", ms,
                f / ms / 1e9);
  }
}

template <typename F>
double time_ms(F&& f) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int r = 0; r < kTimingReps + 2; ++r) {
    CHECK(cudaEventRecord(e0));
    CHECK(f());
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 2) ts.push_back(ms);
  }
  return median_ms(ts);
}

double max_diff(const uint16_t* a, const uint16_t* b, size_t n) {
  const auto x = to_host(a, n), y = to_host(b, n);
  double m = 0;
  for (size_t i = 0; i < n; ++i)
    m = std::max(m, double(std::fabs(from_bits(x[i], DType::kBF16) - from_bits(y[i], DType::kBF16))));
  return m;
}

// Tile-shape candidates against the defaults of tile_config.h (same inputs;
// the max |difference| to the default output guards against a broken variant).
template <int H, class... Fwd>
struct FwdVariants {
  template <class... Dkdv>
  static void run(const char* label) {
    const int B = 8, S = 2048, N = 2048 / H;
    TimingBuffers buf(B, S, N, H, 9);
    const size_t n = buf.n;
    uint16_t *q = buf.q, *k = buf.k, *v = buf.v, *o = buf.o, *d_o = buf.d_o, *gq = buf.gq, *gk = buf.gk,
             *gv = buf.gv, *o2 = buf.o2, *gk2 = buf.gk2;
    float *lse = buf.lse, *delta = buf.delta, *acc = buf.acc;
    jaxcraft::attn::FwdArgs fa{};
    fa.shape = {B, S, S, N, N, H};
    fa.mask = {0, 0, -1, -1, nullptr, nullptr};
    fa.scale = 1.f / std::sqrt(float(H));
    fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse;
    CHECK(jaxcraft::attn::run_fwd<DType::kBF16, H>(fa, 0));
    const double flops = 4.0 * B * N * double(S) * S * H;
    auto one_fwd = [&](auto shape) {
      using Sh = decltype(shape);
      jaxcraft::attn::FwdArgs f2 = fa;
      f2.o = o2;
      const double ms = time_ms([&] { return jaxcraft::attn::launch_fwd_shape<DType::kBF16, Sh>(f2, 0); });
      std::printf("%s fwd  warps %d tile %dx%d smem %6d: %.3f ms %.1f TFLOP/s maxdiff %.2e\n", label,
                  Sh::kWarps, Sh::kBlockM, Sh::kBlockN, Sh::kSmemBytes, ms, flops / ms / 1e9,
                  max_diff(o, o2, n));
    };
    (one_fwd(Fwd{}), ...);

    jaxcraft::AttentionBwdParams bp;
    bp.shape = {B, S, S, N, N, H};
    bp.scale = fa.scale;
    bp.q = q, bp.k = k, bp.v = v, bp.o = o, bp.d_o = d_o, bp.lse = lse;
    bp.dq = gq, bp.dk = gk, bp.dv = gv, bp.delta = delta, bp.dq_accum = acc;
    CHECK(jaxcraft::launch_attention_bwd(bp, 0));  // fills delta and the reference dK
    jaxcraft::attn::BwdArgs ba{};
    ba.shape = fa.shape;
    ba.mask = fa.mask;
    ba.scale = fa.scale;
    ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = d_o, ba.lse = lse;
    ba.dq = gq, ba.dk = gk2, ba.dv = gv, ba.delta = delta;
    auto one_dkdv = [&](auto shape) {
      using Sh = decltype(shape);
      for (int atomics = 0; atomics < 2; ++atomics) {
        ba.dq_accum = atomics ? acc : nullptr;
        const double ms = time_ms([&] { return jaxcraft::attn::launch_dkdv_shape<DType::kBF16, Sh>(ba, 0); });
        std::printf("%s dkdv%s warps %d tile %dx%d st %d smem %6d: %.3f ms (%.1f TFLOP/s as 2/2.5 of bwd) maxdiff %.2e\n",
                    label, atomics ? "+dq" : "   ", Sh::kWarps, Sh::kBlockM, Sh::kBlockN, Sh::kStages,
                    Sh::kSmemBytes, ms, (atomics ? 2.5 : 2.0) * flops / ms / 1e9, max_diff(gk, gk2, n));
      }
    };
    (one_dkdv(Dkdv{}), ...);
  }
};

// Hopper backward configurations side by side (dK/dV + atomic dQ kernel
// only; the max |difference| of dK to the default guards the variant).
template <int H, class... Cfgs>
void bwd_sm90_variants(int B, int S, bool causal) {
  const int N = 2048 / H;
  TimingBuffers buf(B, S, N, H, 11);
  const size_t n = buf.n;
  uint16_t *q = buf.q, *k = buf.k, *v = buf.v, *o = buf.o, *d_o = buf.d_o, *gq = buf.gq, *gk = buf.gk,
           *gv = buf.gv, *gk2 = buf.gk2;
  float *lse = buf.lse, *delta = buf.delta, *acc = buf.acc;
  jaxcraft::AttentionFwdParams fp;
  fp.shape = {B, S, S, N, N, H};
  fp.mask.causal = causal;
  fp.scale = 1.f / std::sqrt(float(H));
  fp.q = q, fp.k = k, fp.v = v, fp.o = o, fp.lse = lse;
  CHECK(jaxcraft::launch_attention_fwd(fp, 0));
  jaxcraft::AttentionBwdParams bp;
  bp.shape = fp.shape;
  bp.mask = fp.mask;
  bp.scale = fp.scale;
  bp.q = q, bp.k = k, bp.v = v, bp.o = o, bp.d_o = d_o, bp.lse = lse;
  bp.dq = gq, bp.dk = gk, bp.dv = gv, bp.delta = delta, bp.dq_accum = acc;
  CHECK(jaxcraft::launch_attention_bwd(bp, 0));  // delta and the default dK
  jaxcraft::attn::BwdArgs ba{};
  ba.shape = {B, S, S, N, N, H};
  ba.mask = {causal ? 1 : 0, 0, -1, -1, nullptr, nullptr};
  ba.scale = fp.scale;
  ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = d_o, ba.lse = lse;
  ba.dq = gq, ba.dk = gk2, ba.dv = gv, ba.delta = delta, ba.dq_accum = acc;
  const double flops = 2.5 * 4.0 * B * N * double(S) * S * H * (causal ? 0.5 : 1.0);
  auto one = [&](auto cfg) {
    using Cfg = decltype(cfg);
    const double ms = time_ms([&] { return jaxcraft::attn::sm90::launch_bwd_sm90<DType::kBF16, Cfg>(ba, 0); });
    std::printf("sm90 bwd H%d S%d %s dq_by_keys %d stages %d: %.3f ms %.1f TFLOP/s maxdiff %.2e\n", H, S,
                causal ? "causal" : "full  ", Cfg::kDqByKeys, Cfg::kStages, ms, flops / ms / 1e9,
                max_diff(gk, gk2, n));
  };
  (one(Cfgs{}), ...);
}

// Hopper forward configurations side by side (the max |difference| of O to
// the default guards the variant).
template <int H, class... Cfgs>
void fwd_sm90_variants(int B, int S, bool causal) {
  const int N = 2048 / H;
  TimingBuffers buf(B, S, N, H, 13);
  jaxcraft::AttentionFwdParams fp;
  fp.shape = {B, S, S, N, N, H};
  fp.mask.causal = causal;
  fp.scale = 1.f / std::sqrt(float(H));
  fp.q = buf.q, fp.k = buf.k, fp.v = buf.v, fp.o = buf.o, fp.lse = buf.lse;
  CHECK(jaxcraft::launch_attention_fwd(fp, 0));
  jaxcraft::attn::FwdArgs fa{};
  fa.shape = {B, S, S, N, N, H};
  fa.mask = {causal ? 1 : 0, 0, -1, -1, nullptr, nullptr};
  fa.scale = fp.scale;
  fa.q = buf.q, fa.k = buf.k, fa.v = buf.v, fa.o = buf.o2, fa.lse = buf.delta;
  const double flops = 4.0 * B * N * double(S) * S * H * (causal ? 0.5 : 1.0);
  auto one = [&](auto cfg) {
    using Cfg = decltype(cfg);
    const double ms = time_ms([&] { return jaxcraft::attn::sm90::launch_fwd_sm90<DType::kBF16, Cfg>(fa, 0); });
    std::printf("sm90 fwd H%d S%d %s tile %dx%d stages %d overlap %d: %.3f ms %.1f TFLOP/s maxdiff %.2e\n", H, S,
                causal ? "causal" : "full  ", Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, Cfg::kOverlap, ms,
                flops / ms / 1e9, max_diff(buf.o, buf.o2, buf.n));
  };
  (one(Cfgs{}), ...);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep the log when a timeout kills the run
  const bool bench_only = argc > 1 && std::string(argv[1]) == "bench";
  int fails = 0, total = 0;
  if (!bench_only) {
    std::mt19937 rng(1234);
    for (const Case& c : cases()) {
      ++total;
      if (!run_case(c, rng)) ++fails;
    }
    jaxcraft::AttentionShape f32{1, 8, 8, 1, 1, 64};
    const char* why = jaxcraft::attention_cuda_unsupported(f32, DType::kF32);
    std::printf("f32 unsupported: %s\n", why ? why : "(null)");
    jaxcraft::AttentionShape big{1, 8, 8, 1, 1, 300};
    why = jaxcraft::attention_cuda_unsupported(big, DType::kBF16);
    std::printf("H300 unsupported: %s\n", why ? why : "(null)");
    std::printf("%d/%d cases passed: %s\n", total - fails, total, fails ? "FAIL" : "PASS");
  }
  for (int H : {128, 64, 256}) {
    bench(8, 2048, 2048 / H, H, false);
    bench(8, 2048, 2048 / H, H, true);
  }
  bench(2, 8192, 16, 128, false);
  bench(2, 8192, 16, 128, true);
  {
    using jaxcraft::attn::sm90::BwdConfig;
    for (bool causal : {false, true}) {
      bwd_sm90_variants<64, BwdConfig<64, 3, true>, BwdConfig<64, 3, false>>(8, 2048, causal);
      using jaxcraft::attn::sm90::FwdConfig;
      fwd_sm90_variants<128, FwdConfig<128, 2, 128, 3, true>, FwdConfig<128, 2, 128, 3>>(8, 2048,
                                                                                        causal);
      fwd_sm90_variants<64, FwdConfig<64, 3, 128, 2>, FwdConfig<64, 3, 128, 3>,
                        FwdConfig<64, 3, 128, 3, true>, FwdConfig<64, 2, 128, 3, true>>(8, 2048, causal);
      fwd_sm90_variants<256, FwdConfig<256, 2, 64, 2>, FwdConfig<256, 2, 64, 2, true>>(8, 2048, causal);
    }
  }
  if (argc > 1 && std::string(argv[argc - 1]) == "variants") {
    using namespace jaxcraft::attn;
    FwdVariants<128, FwdShape<128>, FwdShape<128, 4, 128, 64>, FwdShape<128, 4, 64, 64>>::
        run<DkdvShape<128>, DkdvShape<128, 8, 64, 64, 2>>("H128");
    FwdVariants<64, FwdShape<64>, FwdShape<64, 4, 128, 32>, FwdShape<64, 4, 64, 128>>::
        run<DkdvShape<64>, DkdvShape<64, 8, 64, 128, 2>>("H64");
    FwdVariants<256, FwdShape<256>, FwdShape<256, 4, 64, 64>>::run<DkdvShape<256>>("H256");
    FwdVariants<96, FwdShape<96>, FwdShape<96, 4, 128, 32>>::run<DkdvShape<96>>("H96");
  }
  return fails ? 1 : 0;
}
