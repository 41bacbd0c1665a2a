// Standalone check of the Hopper kernels' per-element features (segment ids,
// boolean mask, soft cap, bias with dbias, dropout) against a float64 CPU reference,
// plus timings of packed documents vs plain causal. Calls the sm90 entry
// points directly (no portable kernels, no launcher); not part of the
// library build. From the repo root, on an H100/H200:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -gencode=arch=compute_90a,code=sm_90a \
//     cpp/kernels/attention/sm90/standalone_test.cu -o /tmp/sm90_test && /tmp/sm90_test
// (add -DSM90_TEST_ALL_HDIMS for head dims 64 and 256 and float16 too;
// --bench-only, --check-only, --bias-only).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/attention/sm90/bwd_kernel.cuh"
#include "kernels/attention/sm90/fwd_kernel.cuh"

using jaxcraft::DType;
namespace attn = jaxcraft::attn;

namespace {

#define CK(...)                                                                       \
  do {                                                                                \
    cudaError_t e_ = (__VA_ARGS__);                                                           \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

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

struct T16 {
  std::vector<uint16_t> bits;
  std::vector<double> val;
};
T16 rnd16(size_t n, DType dt, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> d(0.f, sd);
  T16 t;
  t.bits.resize(n);
  t.val.resize(n);
  for (size_t i = 0; i < n; ++i) {
    t.bits[i] = to_bits(d(rng), dt);
    t.val[i] = from_bits(t.bits[i], dt);
  }
  return t;
}

template <class T>
T* dev(const std::vector<T>& h) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(1, h.size()) * sizeof(T)));
  if (!h.empty()) CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <class T>
std::vector<T> host(const T* p, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

struct Case {
  std::string name;
  int B = 1, T = 128, S = 128, N = 2, K = 2, H = 128;
  DType dt = DType::kBF16;
  bool causal = false;
  bool bottom_right = false;
  int wl = -1, wr = -1;
  std::vector<int> q_len, kv_len;
  // segments: 0 none, 1 sorted packed docs of random lengths, 2 random unsorted ids in [0, 3)
  int segments = 0;
  // boolean mask: 0 none, 1 [B, N, T, S], 2 broadcast over b ([1, N, T, S]), 3 over n ([B, 1, T, S])
  int mask = 0;
  float softcap = 0.f;
  // bias: 0 none, 1 [B, N, T, S] in dt, 2 [1, N, T, S] f32, 3 [B, 1, T, S] dt, 4 [B, N, T, S] f32 with -inf holes
  int bias = 0;
  float scale = 0.f;  // 0: 1 / sqrt(H)
  float dropout = 0.f;
  bool dropout_broadcast = false;
};
constexpr uint32_t kDropKey[2] = {0x12345678u, 0x9abcdef0u};

struct Inputs {
  T16 q, k, v, dout;
  std::vector<int> qseg, kvseg, key_range, query_range;
  std::vector<uint8_t> mask;
  long long msb = 0, msn = 0;
  std::vector<uint16_t> bias16;
  std::vector<float> bias32;
  std::vector<double> biasv;
  long long bsb = 0, bsn = 0;
  bool bias_f32 = false;
  size_t bias_elems = 0;
};

bool base_visible(const Case& c, int b, int i, int j) {
  const int off = c.bottom_right ? c.S - c.T : 0;
  if (!c.kv_len.empty() && j >= c.kv_len[b]) return false;
  const int d = i + off;
  if (c.causal && j > d) return false;
  if (c.wl >= 0 && j < d - c.wl) return false;
  if (c.wr >= 0 && j > d + c.wr) return false;
  return true;
}
bool row_valid(const Case& c, int b, int i) { return c.q_len.empty() || i < c.q_len[b]; }

bool visible(const Case& c, const Inputs& in, int b, int n, int i, int j) {
  if (!base_visible(c, b, i, j)) return false;
  if (c.segments && in.qseg[b * c.T + i] != in.kvseg[b * c.S + j]) return false;
  if (c.mask && !in.mask[b * in.msb + n * in.msn + (long long)i * c.S + j]) return false;
  return true;
}

Inputs make_inputs(const Case& c, std::mt19937& rng) {
  Inputs in;
  in.q = rnd16((size_t)c.B * c.T * c.N * c.H, c.dt, rng);
  in.k = rnd16((size_t)c.B * c.S * c.K * c.H, c.dt, rng);
  in.v = rnd16((size_t)c.B * c.S * c.K * c.H, c.dt, rng);
  in.dout = rnd16((size_t)c.B * c.T * c.N * c.H, c.dt, rng);
  if (c.segments) {
    in.qseg.resize(c.B * c.T);
    in.kvseg.resize(c.B * c.S);
    for (int b = 0; b < c.B; ++b) {
      if (c.segments == 1) {
        // Packed documents: boundaries at random positions, the same
        // documents in q and kv (scaled to each length).
        std::vector<double> cuts = {0.0};
        std::uniform_real_distribution<double> u(0.0, 1.0);
        const int docs = 2 + rng() % 5;
        for (int d = 1; d < docs; ++d) cuts.push_back(u(rng));
        std::sort(cuts.begin(), cuts.end());
        auto id_at = [&](double x) {
          int id = 0;
          for (size_t d = 1; d < cuts.size(); ++d)
            if (x >= cuts[d]) id = (int)d;
          return id + 10 * b;
        };
        for (int i = 0; i < c.T; ++i) in.qseg[b * c.T + i] = id_at((i + 0.5) / c.T);
        for (int j = 0; j < c.S; ++j) in.kvseg[b * c.S + j] = id_at((j + 0.5) / c.S);
      } else {
        for (int i = 0; i < c.T; ++i) in.qseg[b * c.T + i] = rng() % 3;
        for (int j = 0; j < c.S; ++j) in.kvseg[b * c.S + j] = rng() % 3;
      }
    }
    const int rb = (c.T + 63) / 64, cb = (c.S + 63) / 64;
    in.key_range.assign(c.B * rb * 2, 0);
    in.query_range.assign(c.B * cb * 2, 0);
    for (int b = 0; b < c.B; ++b) {
      for (int r = 0; r < rb; ++r) {
        int lo = c.S, hi = 0;
        for (int j = 0; j < c.S; ++j)
          for (int i = r * 64; i < std::min(c.T, r * 64 + 64); ++i)
            if (in.qseg[b * c.T + i] == in.kvseg[b * c.S + j]) {
              lo = std::min(lo, j);
              hi = std::max(hi, j + 1);
              break;
            }
        in.key_range[(b * rb + r) * 2] = lo;
        in.key_range[(b * rb + r) * 2 + 1] = hi;
      }
      for (int cc = 0; cc < cb; ++cc) {
        int lo = c.T, hi = 0;
        for (int i = 0; i < c.T; ++i)
          for (int j = cc * 64; j < std::min(c.S, cc * 64 + 64); ++j)
            if (in.qseg[b * c.T + i] == in.kvseg[b * c.S + j]) {
              lo = std::min(lo, i);
              hi = std::max(hi, i + 1);
              break;
            }
        in.query_range[(b * cb + cc) * 2] = lo;
        in.query_range[(b * cb + cc) * 2 + 1] = hi;
      }
    }
  }
  const long long ts = (long long)c.T * c.S;
  if (c.mask) {
    const int mb = c.mask == 2 ? 1 : c.B, mn = c.mask == 3 ? 1 : c.N;
    in.msb = c.mask == 2 ? 0 : (long long)mn * ts;
    in.msn = c.mask == 3 ? 0 : ts;
    in.mask.resize((size_t)mb * mn * ts);
    for (auto& m : in.mask) m = (rng() % 5) != 0;  // 80% visible
  }
  if (c.bias) {
    const int bb = c.bias == 2 ? 1 : c.B, bn = c.bias == 3 ? 1 : c.N;
    in.bsb = c.bias == 2 ? 0 : (long long)bn * ts;
    in.bsn = c.bias == 3 ? 0 : ts;
    in.bias_f32 = c.bias == 2 || c.bias == 4;
    in.bias_elems = (size_t)bb * bn * ts;
    std::normal_distribution<float> d(0.f, 1.f);
    in.biasv.resize(in.bias_elems);
    if (in.bias_f32) in.bias32.resize(in.bias_elems);
    else in.bias16.resize(in.bias_elems);
    for (size_t e = 0; e < in.bias_elems; ++e) {
      float x = d(rng);
      if (c.bias == 4 && rng() % 10 == 0) x = -INFINITY;
      if (in.bias_f32) {
        in.bias32[e] = x;
        in.biasv[e] = x;
      } else {
        in.bias16[e] = to_bits(x, c.dt);
        in.biasv[e] = from_bits(in.bias16[e], c.dt);
      }
    }
  }
  return in;
}

struct Ref {
  std::vector<double> o, lse, dq, dk, dv, dbias;
};

// Forward and backward reference in float64. The backward uses delta from
// the reference O (exact) and the kernel's own lse is not needed.
Ref reference(const Case& c, const Inputs& in, double scale) {
  Ref r;
  const int B = c.B, T = c.T, S = c.S, N = c.N, K = c.K, H = c.H, G = N / K;
  r.o.assign((size_t)B * T * N * H, 0.0);
  r.lse.assign((size_t)B * N * T, -INFINITY);
  r.dq.assign((size_t)B * T * N * H, 0.0);
  r.dk.assign((size_t)B * S * K * H, 0.0);
  r.dv.assign((size_t)B * S * K * H, 0.0);
  r.dbias.assign(in.bias_elems, 0.0);
  const uint32_t thr = jaxcraft::dropout_threshold(c.dropout);
  const double keep_scale = 1.0 / (1.0 - c.dropout);
  auto keep = [&](int b, int n, int i, int j) -> double {
    if (c.dropout <= 0.f) return 1.0;
    const uint32_t rb = c.dropout_broadcast ? 0 : b, rn = c.dropout_broadcast ? 0 : n;
    return jaxcraft::dropout_keep(kDropKey, thr, rb, rn, i, j) ? keep_scale : 0.0;
  };
  std::vector<std::thread> pool;
  const int nthreads = std::max(1u, std::thread::hardware_concurrency());
  // Parallel over (b, n); dk/dv/dbias per (b, kv head) accumulated per thread then merged.
  std::vector<std::vector<double>> dk_t(nthreads, std::vector<double>(r.dk.size(), 0.0));
  std::vector<std::vector<double>> dv_t(nthreads, std::vector<double>(r.dv.size(), 0.0));
  std::vector<std::vector<double>> db_t(nthreads, std::vector<double>(r.dbias.size(), 0.0));
  for (int th = 0; th < nthreads; ++th) {
    pool.emplace_back([&, th] {
      std::vector<double> x(S), p(S), xc(S);
      std::vector<char> vis(S);
      for (int bn = th; bn < B * N; bn += nthreads) {
        const int b = bn / N, n = bn % N, kh = n / G;
        for (int i = 0; i < T; ++i) {
          if (!row_valid(c, b, i)) continue;
          const double* qi = &in.q.val[(((size_t)b * T + i) * N + n) * H];
          double mx = -INFINITY;
          for (int j = 0; j < S; ++j) {
            vis[j] = visible(c, in, b, n, i, j);
            const double* kj = &in.k.val[(((size_t)b * S + j) * K + kh) * H];
            double s = 0;
            for (int d = 0; d < H; ++d) s += qi[d] * kj[d];
            s *= scale;
            if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
            xc[j] = s;
            if (c.bias) s += in.biasv[b * in.bsb + n * in.bsn + (long long)i * S + j];
            x[j] = s;
            if (vis[j]) mx = std::max(mx, s);
          }
          if (mx == -INFINITY) continue;
          double sum = 0;
          for (int j = 0; j < S; ++j) {
            p[j] = vis[j] ? std::exp(x[j] - mx) : 0.0;
            sum += p[j];
          }
          const double lse = mx + std::log(sum);
          r.lse[((size_t)b * N + n) * T + i] = lse;
          double* oi = &r.o[(((size_t)b * T + i) * N + n) * H];
          for (int j = 0; j < S; ++j) {
            p[j] /= sum;
            if (p[j] == 0) continue;
            const double* vj = &in.v.val[(((size_t)b * S + j) * K + kh) * H];
            const double pk = p[j] * keep(b, n, i, j);
            for (int d = 0; d < H; ++d) oi[d] += pk * vj[d];
          }
          // backward
          const double* doi = &in.dout.val[(((size_t)b * T + i) * N + n) * H];
          double delta = 0;
          for (int d = 0; d < H; ++d) delta += doi[d] * oi[d];
          double* dqi = &r.dq[(((size_t)b * T + i) * N + n) * H];
          for (int j = 0; j < S; ++j) {
            if (p[j] == 0) continue;
            const size_t kvo = (((size_t)b * S + j) * K + kh) * H;
            const double* vj = &in.v.val[kvo];
            const double* kj = &in.k.val[kvo];
            double dp = 0;
            for (int d = 0; d < H; ++d) dp += doi[d] * vj[d];
            const double kp = keep(b, n, i, j);
            dp *= kp;
            const double dS = p[j] * (dp - delta);
            if (c.bias) db_t[th][b * in.bsb + n * in.bsn + (long long)i * S + j] += dS;
            double ds = dS;
            if (c.softcap > 0) {
              const double t = xc[j] / c.softcap;
              ds *= 1 - t * t;
            }
            for (int d = 0; d < H; ++d) {
              dqi[d] += scale * ds * kj[d];
              dk_t[th][kvo + d] += scale * ds * qi[d];
              dv_t[th][kvo + d] += p[j] * kp * doi[d];
            }
          }
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  for (int th = 0; th < nthreads; ++th) {
    for (size_t e = 0; e < r.dk.size(); ++e) {
      r.dk[e] += dk_t[th][e];
      r.dv[e] += dv_t[th][e];
    }
    for (size_t e = 0; e < r.dbias.size(); ++e) r.dbias[e] += db_t[th][e];
  }
  return r;
}

double rel_l2(const std::vector<double>& ref, const std::vector<double>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = got[i] - ref[i];
    if (std::isnan(got[i])) return INFINITY;
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

template <DType kDt, int kHD>
bool run_case(const Case& c0, std::mt19937& rng) {
  Case c = c0;
  c.H = kHD;
  c.dt = kDt;
  const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt((double)c.H);
  Inputs in = make_inputs(c, rng);
  Ref ref = reference(c, in, scale);

  attn::FwdArgs fa{};
  fa.shape = attn::ShapeArgs{c.B, c.T, c.S, c.N, c.K, c.H};
  attn::MaskArgs& m = fa.mask;
  m.causal = c.causal;
  m.offset = c.bottom_right ? c.S - c.T : 0;
  m.window_left = c.wl;
  m.window_right = c.wr;
  int* d_qlen = c.q_len.empty() ? nullptr : dev(c.q_len);
  int* d_kvlen = c.kv_len.empty() ? nullptr : dev(c.kv_len);
  m.q_lengths = d_qlen;
  m.kv_lengths = d_kvlen;
  if (c.segments) {
    m.q_segment_ids = dev(in.qseg);
    m.kv_segment_ids = dev(in.kvseg);
    m.segment_key_range = dev(in.key_range);
    m.segment_query_range = dev(in.query_range);
  }
  if (c.mask) {
    m.mask = dev(in.mask);
    m.mask_stride_b = in.msb;
    m.mask_stride_n = in.msn;
  }
  attn::ScoreArgs& sc = fa.scores;
  sc.softcap = c.softcap;
  if (c.bias) {
    sc.bias = in.bias_f32 ? (const void*)dev(in.bias32) : (const void*)dev(in.bias16);
    sc.bias_f32 = in.bias_f32;
    sc.bias_stride_b = in.bsb;
    sc.bias_stride_n = in.bsn;
  }
  sc.dropout_keep_scale = 1.f;
  if (c.dropout > 0.f) {
    sc.dropout_key = dev(std::vector<uint32_t>{kDropKey[0], kDropKey[1]});
    sc.dropout_threshold = jaxcraft::dropout_threshold(c.dropout);
    sc.dropout_keep_scale = 1.f / (1.f - c.dropout);
    sc.dropout_broadcast = c.dropout_broadcast;
  }
  fa.scale = (float)scale;
  fa.q = dev(in.q.bits);
  fa.k = dev(in.k.bits);
  fa.v = dev(in.v.bits);
  const size_t qn = (size_t)c.B * c.T * c.N * c.H, kn = (size_t)c.B * c.S * c.K * c.H;
  uint16_t* d_o;
  float* d_lse;
  CK(cudaMalloc(&d_o, qn * 2));
  CK(cudaMalloc(&d_lse, (size_t)c.B * c.N * c.T * 4));
  CK(cudaMemset(d_o, 0xFF, qn * 2));
  fa.o = d_o;
  fa.lse = d_lse;
  if (!attn::sm90::fwd_supports(fa)) {
    std::printf("%-44s fwd not supported?!\n", c.name.c_str());
    return false;
  }
  CK(attn::sm90::run_fwd_sm90<kDt, kHD>(fa, 0));
  CK(cudaDeviceSynchronize());
  auto o_bits = host(d_o, qn);
  auto lse = host(d_lse, (size_t)c.B * c.N * c.T);
  std::vector<double> o(qn), lsev(lse.begin(), lse.end());
  for (size_t i = 0; i < qn; ++i) o[i] = from_bits(o_bits[i], kDt);
  double lse_err = 0;
  bool lse_ok = true;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref.lse[i]) || std::isinf(lse[i])) {
      if (ref.lse[i] != (double)lse[i]) lse_ok = false;
    } else {
      lse_err = std::max(lse_err, std::fabs(ref.lse[i] - lse[i]));
    }
  }
  const double o_err = rel_l2(ref.o, o);

  // Backward: delta from the kernel's O and dO, lse from the kernel.
  attn::BwdArgs ba{};
  ba.shape = fa.shape;
  ba.mask = fa.mask;
  ba.scores = fa.scores;
  ba.scale = fa.scale;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.o = d_o;
  ba.d_o = dev(in.dout.bits);
  ba.lse = d_lse;
  std::vector<float> delta((size_t)c.B * c.N * c.T, 0.f);
  for (int b = 0; b < c.B; ++b)
    for (int i = 0; i < c.T; ++i)
      for (int n = 0; n < c.N; ++n) {
        double s = 0;
        const size_t at = (((size_t)b * c.T + i) * c.N + n) * c.H;
        for (int d = 0; d < c.H; ++d) s += in.dout.val[at + d] * o[at + d];
        delta[((size_t)b * c.N + n) * c.T + i] = (float)s;
      }
  ba.delta = dev(delta);
  CK(cudaMalloc(&ba.dq_accum, qn * 4));
  CK(cudaMemset(ba.dq_accum, 0, qn * 4));
  uint16_t *d_dk, *d_dv;
  CK(cudaMalloc(&d_dk, kn * 2));
  CK(cudaMalloc(&d_dv, kn * 2));
  CK(cudaMemset(d_dk, 0xFF, kn * 2));
  CK(cudaMemset(d_dv, 0xFF, kn * 2));
  ba.dk = d_dk;
  ba.dv = d_dv;
  if (c.bias) {
    CK(cudaMalloc(&ba.dbias, in.bias_elems * 4));
    CK(cudaMemset(ba.dbias, 0, in.bias_elems * 4));
  }
  CK(attn::sm90::run_bwd_sm90<kDt, kHD>(ba, 0));
  CK(cudaDeviceSynchronize());
  auto dqa = host(ba.dq_accum, qn);
  auto dkb = host(d_dk, kn), dvb = host(d_dv, kn);
  std::vector<double> dq(qn), dk(kn), dv(kn);
  for (size_t i = 0; i < qn; ++i) dq[i] = dqa[i] * scale;
  for (size_t i = 0; i < kn; ++i) {
    dk[i] = from_bits(dkb[i], kDt);
    dv[i] = from_bits(dvb[i], kDt);
  }
  double db_err = 0;
  if (c.bias) {
    auto db = host(ba.dbias, in.bias_elems);
    db_err = rel_l2(ref.dbias, std::vector<double>(db.begin(), db.end()));
  }
  const double e_dq = rel_l2(ref.dq, dq), e_dk = rel_l2(ref.dk, dk), e_dv = rel_l2(ref.dv, dv);
  const double tol = 2e-2;
  const bool ok = lse_ok && lse_err < 1e-2 && o_err < tol && e_dq < tol && e_dk < tol &&
                  e_dv < tol && db_err < tol;
  std::printf("%-5s %-48s H%-3d o %.1e lse %.1e%s dq %.1e dk %.1e dv %.1e dbias %.1e  lvl %d\n",
              ok ? "ok" : "FAIL", c.name.c_str(), kHD, o_err, lse_err, lse_ok ? "" : "(inf!)", e_dq,
              e_dk, e_dv, db_err, attn::sm90::feature_level(fa.mask, fa.scores));
  // free (leaks of small buffers are fine in a test, but keep memory bounded)
  cudaFree((void*)fa.q);
  cudaFree((void*)fa.k);
  cudaFree((void*)fa.v);
  cudaFree(d_o);
  cudaFree(d_lse);
  cudaFree((void*)ba.d_o);
  cudaFree(ba.delta);
  cudaFree(ba.dq_accum);
  cudaFree(d_dk);
  cudaFree(d_dv);
  if (ba.dbias) cudaFree(ba.dbias);
  return ok;
}

// ---------------------------------------------------------------- timing

template <class F>
double time_ms(F&& f, int reps = 10) {
  for (int i = 0; i < 3; ++i) CK(f());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) CK(f());
  cudaEventRecord(b);
  CK(cudaEventSynchronize(b));
  float ms;
  cudaEventElapsedTime(&ms, a, b);
  return ms / reps;
}

template <int kHD>
void bench_packed(int T, int docs, int N) {
  constexpr DType kDt = DType::kBF16;
  const int B = 1, H = kHD;
  std::mt19937 rng(1);
  const size_t qn = (size_t)B * T * N * H;
  std::vector<uint16_t> x(qn);
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& e : x) e = to_bits(d(rng), kDt);
  void *q = dev(x), *k = dev(x), *v = dev(x), *o, *dq_acc, *dk, *dv;
  float* lse;
  CK(cudaMalloc(&o, qn * 2));
  CK(cudaMalloc(&dk, qn * 2));
  CK(cudaMalloc(&dv, qn * 2));
  CK(cudaMalloc(&dq_acc, qn * 4));
  CK(cudaMalloc(&lse, (size_t)B * N * T * 4));
  std::vector<float> delta_h((size_t)B * N * T, 0.f);
  float* delta = dev(delta_h);
  const int doc = T / docs;
  std::vector<int> seg(T), kr, qr;
  for (int i = 0; i < T; ++i) seg[i] = i / doc;
  for (int r = 0; r < (T + 63) / 64; ++r) {
    const int id0 = seg[r * 64], id1 = seg[std::min(T, r * 64 + 64) - 1];
    kr.push_back(id0 * doc);
    kr.push_back(std::min(T, (id1 + 1) * doc));
  }
  qr = kr;  // same ids for q and kv
  int *d_seg = dev(seg), *d_kr = dev(kr), *d_qr = dev(qr);

  attn::FwdArgs fa{};
  fa.shape = attn::ShapeArgs{B, T, T, N, N, H};
  fa.mask.causal = 1;
  fa.mask.window_left = fa.mask.window_right = -1;
  fa.scores.dropout_keep_scale = 1.f;
  fa.scale = 1.f / std::sqrt((float)H);
  fa.q = q;
  fa.k = k;
  fa.v = v;
  fa.o = o;
  fa.lse = lse;
  attn::BwdArgs ba{};
  ba.shape = fa.shape;
  ba.mask = fa.mask;
  ba.scores = fa.scores;
  ba.scale = fa.scale;
  ba.q = q;
  ba.k = k;
  ba.v = v;
  ba.o = o;
  ba.d_o = q;
  ba.lse = lse;
  ba.dk = dk;
  ba.dv = dv;
  ba.delta = delta;
  ba.dq_accum = (float*)dq_acc;

  const double causal_flops = 4.0 * B * N * H * ((double)T * (T + 1) / 2);
  const double doc_flops = 4.0 * B * N * H * docs * ((double)doc * (doc + 1) / 2);
  auto run_f = [&] { return attn::sm90::run_fwd_sm90<kDt, kHD>(fa, 0); };
  auto run_b = [&] { return attn::sm90::run_bwd_sm90<kDt, kHD>(ba, 0); };
  const double f_plain = time_ms(run_f), b_plain = time_ms(run_b);
  fa.mask.q_segment_ids = fa.mask.kv_segment_ids = d_seg;
  fa.mask.segment_key_range = d_kr;
  fa.mask.segment_query_range = d_qr;
  ba.mask = fa.mask;
  const double f_seg = time_ms(run_f), b_seg = time_ms(run_b);
  // Soft cap on the packed documents too (kScores instance).
  fa.scores.softcap = 30.f;
  ba.scores = fa.scores;
  const double f_cap = time_ms(run_f), b_cap = time_ms(run_b);
  // Dropout 0.1 on the packed documents, no soft cap (kDropout instance).
  fa.scores.softcap = 0.f;
  fa.scores.dropout_key = dev(std::vector<uint32_t>{1u, 2u});
  fa.scores.dropout_threshold = jaxcraft::dropout_threshold(0.1f);
  fa.scores.dropout_keep_scale = 1.f / 0.9f;
  ba.scores = fa.scores;
  const double f_drop = time_ms(run_f), b_drop = time_ms(run_b);
  // The same documents as separate batch rows (plain causal, B = docs,
  // T = doc): the most the kernel does with sequences this short.
  attn::FwdArgs fd = fa;
  fd.mask = attn::MaskArgs{};
  fd.mask.causal = 1;
  fd.mask.window_left = fd.mask.window_right = -1;
  fd.scores = attn::ScoreArgs{};
  fd.scores.dropout_keep_scale = 1.f;
  fd.shape = attn::ShapeArgs{docs, doc, doc, N, N, H};
  attn::BwdArgs bd = ba;
  bd.mask = fd.mask;
  bd.scores = fd.scores;
  bd.shape = fd.shape;
  const double f_docs = time_ms([&] { return attn::sm90::run_fwd_sm90<kDt, kHD>(fd, 0); });
  const double b_docs = time_ms([&] { return attn::sm90::run_bwd_sm90<kDt, kHD>(bd, 0); });
  using FCfg = typename attn::sm90::FwdTiles<kHD>::type;
  using BCfg = typename attn::sm90::BwdTiles<kHD>::type;
  const double f_docs_m = time_ms([&] { return attn::sm90::launch_fwd_sm90<kDt, FCfg, attn::sm90::kMasks>(fd, 0); });
  const double b_docs_m = time_ms([&] { return attn::sm90::launch_bwd_sm90<kDt, BCfg, attn::sm90::kMasks>(bd, 0); });
  std::printf("  as %d batch rows, kMasks instance, no features: fwd %.3f ms, bwd %.3f ms\n", docs, f_docs_m, b_docs_m);
  auto tf = [](double fl, double ms) { return fl / ms * 1e-9; };
  std::printf("  as %d batch rows, plain: fwd %.3f ms %.0f TF/s (%.0f%%), bwd %.3f ms %.0f TF/s (%.0f%%)\n",
              docs, f_docs, tf(doc_flops, f_docs), 100 * f_plain / f_docs * doc_flops / causal_flops,
              b_docs, tf(2.5 * doc_flops, b_docs), 100 * b_plain / b_docs * doc_flops / causal_flops);
  std::printf(
      "bench H%d T=%d N=%d: causal fwd %.3f ms %.0f TF/s, bwd %.3f ms %.0f TF/s (bwd = 2.5x fwd flops)\n",
      kHD, T, N, f_plain, tf(causal_flops, f_plain), b_plain, tf(2.5 * causal_flops, b_plain));
  std::printf(
      "  %d docs + segment ids: fwd %.3f ms %.0f TF/s (%.0f%%), bwd %.3f ms %.0f TF/s (%.0f%%)\n", docs,
      f_seg, tf(doc_flops, f_seg), 100 * tf(doc_flops, f_seg) / tf(causal_flops, f_plain), b_seg,
      tf(2.5 * doc_flops, b_seg), 100 * tf(doc_flops, b_seg) / tf(causal_flops, b_plain));
  std::printf(
      "  + softcap 30:          fwd %.3f ms %.0f TF/s (%.0f%%), bwd %.3f ms %.0f TF/s (%.0f%%)\n",
      f_cap, tf(doc_flops, f_cap), 100 * tf(doc_flops, f_cap) / tf(causal_flops, f_plain), b_cap,
      tf(2.5 * doc_flops, b_cap), 100 * tf(doc_flops, b_cap) / tf(causal_flops, b_plain));
  std::printf(
      "  + dropout 0.1 (no cap): fwd %.3f ms %.0f TF/s (%.0f%%), bwd %.3f ms %.0f TF/s (%.0f%%)\n",
      f_drop, tf(doc_flops, f_drop), 100 * tf(doc_flops, f_drop) / tf(causal_flops, f_plain), b_drop,
      tf(2.5 * doc_flops, b_drop), 100 * tf(doc_flops, b_drop) / tf(causal_flops, b_plain));
  cudaFree(q);
  cudaFree(k);
  cudaFree(v);
  cudaFree(o);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dq_acc);
  cudaFree(lse);
  cudaFree(delta);
}

// Bias [1, N, S, S] (bf16), non-causal: fwd and bwd (with dbias) vs no bias.
template <int kHD>
void bench_bias(int S, int N) {
  constexpr DType kDt = DType::kBF16;
  const int B = 1, H = kHD;
  std::mt19937 rng(2);
  const size_t qn = (size_t)B * S * N * H;
  std::vector<uint16_t> x(qn);
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& e : x) e = to_bits(d(rng), kDt);
  const size_t bn = (size_t)N * S * S;
  std::vector<uint16_t> bias_h(bn);
  for (auto& e : bias_h) e = to_bits(d(rng), kDt);
  void *q = dev(x), *o, *dq_acc, *dk, *dv, *bias = dev(bias_h);
  float *lse, *dbias;
  CK(cudaMalloc(&o, qn * 2));
  CK(cudaMalloc(&dk, qn * 2));
  CK(cudaMalloc(&dv, qn * 2));
  CK(cudaMalloc(&dq_acc, qn * 4));
  CK(cudaMalloc(&dbias, bn * 4));
  CK(cudaMalloc(&lse, (size_t)B * N * S * 4));
  std::vector<float> delta_h((size_t)B * N * S, 0.f);
  float* delta = dev(delta_h);
  attn::FwdArgs fa{};
  fa.shape = attn::ShapeArgs{B, S, S, N, N, H};
  fa.mask.window_left = fa.mask.window_right = -1;
  fa.scores.dropout_keep_scale = 1.f;
  fa.scale = 1.f / std::sqrt((float)H);
  fa.q = fa.k = fa.v = q;
  fa.o = o;
  fa.lse = lse;
  attn::BwdArgs ba{};
  ba.shape = fa.shape;
  ba.mask = fa.mask;
  ba.scores = fa.scores;
  ba.scale = fa.scale;
  ba.q = ba.k = ba.v = ba.d_o = q;
  ba.o = o;
  ba.lse = lse;
  ba.dk = dk;
  ba.dv = dv;
  ba.delta = delta;
  ba.dq_accum = (float*)dq_acc;
  auto run_f = [&] { return attn::sm90::run_fwd_sm90<kDt, kHD>(fa, 0); };
  auto run_b = [&] { return attn::sm90::run_bwd_sm90<kDt, kHD>(ba, 0); };
  const double flops = 4.0 * B * N * H * (double)S * S;
  const double f0 = time_ms(run_f), b0 = time_ms(run_b);
  fa.scores.bias = bias;
  fa.scores.bias_stride_n = (long long)S * S;
  ba.scores = fa.scores;
  ba.dbias = dbias;
  const double f1 = time_ms(run_f), b1 = time_ms(run_b);
  std::printf("bench bias H%d S=%d N=%d: no bias fwd %.3f ms (%.0f TF/s) bwd %.3f ms (%.0f TF/s); "
              "bias fwd %.3f ms (%.0f TF/s) bwd+dbias %.3f ms (%.0f TF/s)\n",
              kHD, S, N, f0, flops / f0 * 1e-9, b0, 2.5 * flops / b0 * 1e-9, f1, flops / f1 * 1e-9, b1,
              2.5 * flops / b1 * 1e-9);
  cudaFree(q);
  cudaFree(o);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dq_acc);
  cudaFree(dbias);
  cudaFree(lse);
  cudaFree(delta);
  cudaFree(bias);
}

template <DType kDt, int kHD>
int run_all(std::mt19937& rng) {
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  Case c;
  c = Case{}; c.name = "plain causal"; c.B = 2; c.T = 300; c.S = 300; c.N = 4; c.K = 2; c.causal = true; add(c);
  c = Case{}; c.name = "seg sorted causal"; c.B = 2; c.T = 520; c.S = 520; c.N = 4; c.K = 2; c.causal = true; c.segments = 1; add(c);
  c = Case{}; c.name = "seg sorted full"; c.B = 2; c.T = 333; c.S = 333; c.N = 2; c.K = 1; c.segments = 1; add(c);
  c = Case{}; c.name = "seg sorted T!=S bottom-right causal"; c.B = 2; c.T = 200; c.S = 460; c.N = 2; c.K = 2; c.causal = true; c.bottom_right = true; c.segments = 1; add(c);
  c = Case{}; c.name = "seg unsorted"; c.B = 2; c.T = 257; c.S = 390; c.N = 4; c.K = 4; c.segments = 2; add(c);
  c = Case{}; c.name = "seg unsorted causal + lengths"; c.B = 2; c.T = 300; c.S = 300; c.N = 2; c.K = 1; c.causal = true; c.segments = 2; c.q_len = {250, 300}; c.kv_len = {300, 180}; add(c);
  c = Case{}; c.name = "mask [B,N,T,S]"; c.B = 2; c.T = 200; c.S = 270; c.N = 2; c.K = 1; c.mask = 1; add(c);
  c = Case{}; c.name = "mask [1,N,T,S] causal"; c.B = 2; c.T = 260; c.S = 260; c.N = 2; c.K = 2; c.mask = 2; c.causal = true; add(c);
  c = Case{}; c.name = "mask [B,1,T,S] + window"; c.B = 2; c.T = 300; c.S = 300; c.N = 4; c.K = 2; c.mask = 3; c.wl = 70; c.wr = 20; add(c);
  c = Case{}; c.name = "softcap 5"; c.B = 2; c.T = 256; c.S = 256; c.N = 2; c.K = 2; c.softcap = 5.f; c.scale = 0.5f; add(c);
  c = Case{}; c.name = "softcap 30 causal GQA"; c.B = 1; c.T = 400; c.S = 400; c.N = 4; c.K = 1; c.softcap = 30.f; c.causal = true; add(c);
  c = Case{}; c.name = "bias [B,N,T,S] dt"; c.B = 2; c.T = 200; c.S = 330; c.N = 2; c.K = 1; c.bias = 1; add(c);
  c = Case{}; c.name = "bias [1,N,T,S] f32 (atomic dbias)"; c.B = 2; c.T = 260; c.S = 260; c.N = 4; c.K = 2; c.bias = 2; c.causal = true; add(c);
  c = Case{}; c.name = "bias [B,1,T,S] dt GQA (atomic dbias)"; c.B = 2; c.T = 300; c.S = 200; c.N = 4; c.K = 2; c.bias = 3; add(c);
  c = Case{}; c.name = "bias f32 -inf holes + softcap"; c.B = 1; c.T = 256; c.S = 320; c.N = 2; c.K = 2; c.bias = 4; c.softcap = 10.f; add(c);
  c = Case{}; c.name = "all: seg+mask+cap+bias+lengths causal"; c.B = 2; c.T = 390; c.S = 390; c.N = 4; c.K = 2; c.segments = 1; c.mask = 2; c.softcap = 20.f; c.bias = 1; c.causal = true; c.q_len = {390, 300}; c.kv_len = {350, 390}; add(c);
  c = Case{}; c.name = "all: unsorted seg+mask+cap+bias window"; c.B = 1; c.T = 300; c.S = 300; c.N = 2; c.K = 1; c.segments = 2; c.mask = 1; c.softcap = 8.f; c.bias = 2; c.wl = 100; c.wr = 100; add(c);
  // S % 8 == 0: the bias through TMA (kBias) where the tiles fit.
  c = Case{}; c.name = "TMA bias [B,N,T,S] dt bottom-right causal"; c.B = 2; c.T = 300; c.S = 256; c.N = 4; c.K = 2; c.bias = 1; c.causal = true; c.bottom_right = true; add(c);
  c.bias = 2; c.name = "TMA bias [1,N,T,S] f32 (atomic dbias)"; add(c);
  c = Case{}; c.name = "TMA bias + seg + mask + cap + lengths"; c.B = 2; c.T = 330; c.S = 384; c.N = 4; c.K = 2; c.segments = 1; c.mask = 3; c.softcap = 15.f; c.bias = 1; c.q_len = {330, 200}; c.kv_len = {384, 250}; add(c);
  c = Case{}; c.name = "dropout 0.2"; c.B = 2; c.T = 260; c.S = 300; c.N = 4; c.K = 2; c.dropout = 0.2f; add(c);
  c = Case{}; c.name = "dropout 0.5 broadcast causal"; c.B = 2; c.T = 300; c.S = 300; c.N = 2; c.K = 1; c.dropout = 0.5f; c.dropout_broadcast = true; c.causal = true; add(c);
  c = Case{}; c.name = "dropout + seg + mask + cap + bias"; c.B = 2; c.T = 330; c.S = 384; c.N = 4; c.K = 2; c.segments = 1; c.mask = 2; c.softcap = 15.f; c.bias = 3; c.dropout = 0.1f; c.q_len = {330, 200}; add(c);
  int fails = 0;
  for (auto& cs : cases) fails += !run_case<kDt, kHD>(cs, rng);
  return fails;
}

}  // namespace

int main(int argc, char** argv) {
  bool bench = true, check = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bench-only")) check = false;
    if (!std::strcmp(argv[i], "--check-only")) bench = false;
  }
  std::mt19937 rng(1234);
  int fails = 0;
  if (argc > 1 && !std::strcmp(argv[1], "--h64-only")) {
    bench_packed<64>(16384, 8, 16);
    return 0;
  }
  if (argc > 1 && !std::strcmp(argv[1], "--bias-only")) {
    bench_bias<128>(4096, 16);
    return 0;
  }
  if (check) {
    fails += run_all<DType::kBF16, 128>(rng);
#ifdef SM90_TEST_ALL_HDIMS
    fails += run_all<DType::kBF16, 64>(rng);
    fails += run_all<DType::kBF16, 256>(rng);
    fails += run_all<DType::kF16, 128>(rng);
#endif
    std::printf("%d failures\n", fails);
  }
  if (bench) {
    bench_packed<128>(16384, 8, 16);
#ifdef SM90_TEST_ALL_HDIMS
    bench_packed<64>(16384, 8, 16);
    bench_packed<256>(16384, 8, 16);
#endif
    bench_bias<128>(4096, 16);
#ifdef SM90_TEST_ALL_HDIMS
    bench_bias<64>(4096, 16);
#endif
  }
  return fails != 0;
}
