// Standalone correctness + speed check of the CUDA attention kernels against
// a float64 CPU reference (not part of the library build). From the repo root
// (the Hopper instances are needed by the launchers):
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a -Icpp tests/cuda/attention.cu cpp/kernels/attention/launch_fwd.cu cpp/kernels/attention/launch_bwd.cu cpp/kernels/attention/instances_hdim*.cu cpp/kernels/attention/sm90/fwd_hdim*.cu cpp/kernels/attention/sm90/bwd_hdim*.cu -o /tmp/attn_test && /tmp/attn_test check portable && /tmp/attn_test check
// Arguments (any order): `check` runs the correctness cases only, `bench`
// the timings only, `features` only the feature cases (segment ids, boolean
// mask, soft cap, bias + dbias, dropout; with `small`, sequences up to 300
// only, for compute-sanitizer), `portable` forces the sm_80
// kernels everywhere (as JAXCRAFT_ATTENTION_KERNEL=portable does; without
// it the launcher picks the Hopper kernels where they apply: head dims 64,
// 128, 256 and no dropout, except the deterministic dQ), `featbench` times
// the features against the plain kernels, `shapes` the H128 dK/dV feature
// tile shapes, `variants` adds the tile-shape comparisons to the timings,
// `fwdvariants` times only the Hopper forward's tiles against the
// alternatives measured for them, `bwdvariants` the head-dim-64 backward's
// query steps (128 against 64), `only=TEXT` keeps the correctness cases whose name contains TEXT.
// Every case prints PASS or FAIL; the last correctness line sums them up and
// lists the failed cases. JAXCRAFT_ATTENTION_PERSISTENT_CTAS=3 makes the
// Hopper forward's persistent CTAs walk several of these small cases' work
// items each.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/standalone_check.h"
#include "kernels/attention/bwd_dkdv_kernel.cuh"
#include "kernels/attention/fwd_kernel.cuh"
#include "kernels/attention/host_args.h"
#include "kernels/attention/launch.h"
#include "kernels/attention/sm90/bwd_kernel.cuh"
#include "kernels/attention/sm90/fwd_kernel.cuh"
#include "math/philox.h"

using jaxcraft::DType;


namespace {

constexpr double kTol = 2e-2;       // relative L2 error bound for 16-bit inputs
constexpr double kLseTol = 1e-2;    // absolute, natural-log units
constexpr int kTimingReps = 20;
constexpr int kSegBlock = 64;       // contract/attention.h: kSegmentBlock

// Per-element features of a case (contract/attention.h: AttentionMask, AttentionScores).
// Bias and mask shapes: kFull [B, N, T, S]; kBcastB [1, N, T, S] (stride_b 0);
// kBcastN [B, 1, T, S] (stride_n 0); kBcastBN [1, 1, T, S].
enum class Bcast { kNone, kFull, kBcastB, kBcastN, kBcastBN };
enum class Seg { kNone, kSorted, kUnsorted };
struct Feat {
  float softcap = 0.f;
  Bcast bias = Bcast::kNone;
  bool bias_f32 = false;
  bool dbias16 = false;  // dbias in the bias's 16-bit dtype (one writer per element)
  Seg seg = Seg::kNone;
  Bcast mask = Bcast::kNone;
  float dropout = 0.f;
  bool dropout_bcast = false;
  int docs = 0;  // > 0 with kSorted: that many equal documents (timings)
};

struct Case {
  int B, T, S, N, K, H;
  bool causal;
  long long offset, wl, wr;
  std::vector<int> q_len, kv_len;  // empty: full
  DType dt;
  std::string name;
  Feat f = {};
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

// Element strides of a broadcastable [B, N, T, S] tensor and its element count.
struct Layout {
  long long sb = 0, sn = 0, elems = 0;
};
Layout layout_of(Bcast k, const Case& c) {
  const long long ts = static_cast<long long>(c.T) * c.S;
  const bool has_b = k == Bcast::kFull || k == Bcast::kBcastN;
  const bool has_n = k == Bcast::kFull || k == Bcast::kBcastB;
  Layout l;
  l.sn = has_n ? ts : 0;
  l.sb = has_b ? (has_n ? c.N : 1) * ts : 0;
  l.elems = k == Bcast::kNone ? 0 : (has_b ? c.B : 1) * (has_n ? c.N : 1) * ts;
  return l;
}

// Host copies of a case's feature inputs (empty vectors: feature absent).
struct Extras {
  std::vector<int> q_seg, kv_seg, seg_key_range, seg_query_range;
  std::vector<uint8_t> mask;
  Layout mask_l, bias_l;
  std::vector<double> bias;          // rounded values
  std::vector<uint16_t> bias_bits;   // 16-bit bias
  std::vector<float> bias_f32;       // float32 bias
  uint32_t key[2] = {0, 0};
  uint32_t threshold = 0;
  double keep_scale = 1.0;
};

// The tile ranges of segment ids, computed as jaxcraft/ops/attention.py's
// _segment_ranges does: 64-position blocks overlap when their id ranges do;
// per row block the keys [first overlapping key block * 64, (last + 1) * 64)
// clipped to S, or (S, 0) when none (and likewise per key block).
void segment_ranges(const Case& c, Extras* x) {
  const int R = (c.T + kSegBlock - 1) / kSegBlock, C = (c.S + kSegBlock - 1) / kSegBlock;
  auto minmax = [](const int* ids, int len, int blk, int* mn, int* mx) {
    *mn = ids[blk * kSegBlock];
    *mx = *mn;
    for (int i = blk * kSegBlock; i < std::min(len, (blk + 1) * kSegBlock); ++i) {
      *mn = std::min(*mn, ids[i]);
      *mx = std::max(*mx, ids[i]);
    }
  };
  x->seg_key_range.assign(size_t(c.B) * R * 2, 0);
  x->seg_query_range.assign(size_t(c.B) * C * 2, 0);
  for (int b = 0; b < c.B; ++b) {
    std::vector<int> qmn(R), qmx(R), kmn(C), kmx(C);
    for (int r = 0; r < R; ++r) minmax(&x->q_seg[size_t(b) * c.T], c.T, r, &qmn[r], &qmx[r]);
    for (int k = 0; k < C; ++k) minmax(&x->kv_seg[size_t(b) * c.S], c.S, k, &kmn[k], &kmx[k]);
    auto overlap = [&](int r, int k) { return qmn[r] <= kmx[k] && kmn[k] <= qmx[r]; };
    for (int r = 0; r < R; ++r) {
      int first = -1, last = -1;
      for (int k = 0; k < C; ++k)
        if (overlap(r, k)) {
          if (first < 0) first = k;
          last = k;
        }
      int* out = &x->seg_key_range[(size_t(b) * R + r) * 2];
      out[0] = first < 0 ? c.S : first * kSegBlock;
      out[1] = first < 0 ? 0 : std::min((last + 1) * kSegBlock, c.S);
    }
    for (int k = 0; k < C; ++k) {
      int first = -1, last = -1;
      for (int r = 0; r < R; ++r)
        if (overlap(r, k)) {
          if (first < 0) first = r;
          last = r;
        }
      int* out = &x->seg_query_range[(size_t(b) * C + k) * 2];
      out[0] = first < 0 ? c.T : first * kSegBlock;
      out[1] = first < 0 ? 0 : std::min((last + 1) * kSegBlock, c.T);
    }
  }
}

Extras make_extras(const Case& c, std::mt19937& rng) {
  Extras x;
  const Feat& f = c.f;
  if (f.seg != Seg::kNone) {
    x.q_seg.resize(size_t(c.B) * c.T);
    x.kv_seg.resize(size_t(c.B) * c.S);
    for (int b = 0; b < c.B; ++b) {
      int* q = &x.q_seg[size_t(b) * c.T];
      int* kv = &x.kv_seg[size_t(b) * c.S];
      if (f.seg == Seg::kSorted && f.docs > 0) {
        for (int i = 0; i < c.T; ++i) q[i] = int(int64_t(i) * f.docs / c.T);
        for (int j = 0; j < c.S; ++j) kv[j] = int(int64_t(j) * f.docs / c.S);
      } else if (f.seg == Seg::kSorted) {
        // Packed documents: 2-5 of random lengths, the same cut points on
        // both sides when T == S (self-attention), proportional otherwise.
        const int docs = 2 + static_cast<int>(rng() % 4);
        std::vector<double> cuts;
        for (int d = 0; d + 1 < docs; ++d) cuts.push_back(std::uniform_real_distribution<double>(0, 1)(rng));
        std::sort(cuts.begin(), cuts.end());
        auto fill = [&](int* ids, int len) {
          for (int i = 0; i < len; ++i) {
            int d = 0;
            while (d < int(cuts.size()) && i >= cuts[d] * len) ++d;
            ids[i] = d;
          }
        };
        fill(q, c.T);
        fill(kv, c.S);
        // The last rows form a document with no keys: they see nothing.
        if (c.T > 4)
          for (int i = c.T - 2; i < c.T; ++i) q[i] = docs + 7;
      } else {
        for (int i = 0; i < c.T; ++i) q[i] = static_cast<int>(rng() % 3);
        for (int j = 0; j < c.S; ++j) kv[j] = static_cast<int>(rng() % 3);
        if (c.T > 1) q[1] = 42;  // a row whose id no key has
      }
    }
    segment_ranges(c, &x);
  }
  if (f.mask != Bcast::kNone) {
    x.mask_l = layout_of(f.mask, c);
    x.mask.resize(x.mask_l.elems);
    std::bernoulli_distribution keep(0.75);
    for (auto& m : x.mask) m = keep(rng) ? 1 : 0;
    // One row of the first (b, n) sees no key at all.
    const int row = std::min(2, c.T - 1);
    for (int j = 0; j < c.S; ++j) x.mask[size_t(row) * c.S + j] = 0;
  }
  if (f.bias != Bcast::kNone) {
    x.bias_l = layout_of(f.bias, c);
    std::normal_distribution<float> dist(0.f, 2.f);
    x.bias.resize(x.bias_l.elems);
    if (f.bias_f32) x.bias_f32.resize(x.bias_l.elems);
    else x.bias_bits.resize(x.bias_l.elems);
    for (long long i = 0; i < x.bias_l.elems; ++i) {
      const float v = dist(rng);
      if (f.bias_f32) {
        x.bias_f32[i] = v;
        x.bias[i] = v;
      } else {
        x.bias_bits[i] = to_bits(v, c.dt);
        x.bias[i] = from_bits(x.bias_bits[i], c.dt);
      }
    }
  }
  if (f.dropout > 0.f) {
    x.key[0] = static_cast<uint32_t>(rng());
    x.key[1] = static_cast<uint32_t>(rng());
    x.threshold = jaxcraft::dropout_threshold(f.dropout);
    x.keep_scale = 1.f / (1.f - f.dropout);  // the launcher's float value
  }
  return x;
}

bool visible(const Case& c, const Extras& x, int b, int n, int i, int j) {
  if (!c.kv_len.empty() && j >= c.kv_len[b]) return false;
  const long long d = i + c.offset;
  if (c.causal && j > d) return false;
  if (c.wl >= 0 && j < d - c.wl) return false;
  if (c.wr >= 0 && j > d + c.wr) return false;
  if (!x.q_seg.empty() && x.q_seg[size_t(b) * c.T + i] != x.kv_seg[size_t(b) * c.S + j]) return false;
  if (!x.mask.empty() &&
      !x.mask[b * x.mask_l.sb + n * x.mask_l.sn + static_cast<long long>(i) * c.S + j])
    return false;
  return true;
}

struct Ref {
  std::vector<double> o, lse, dq, dk, dv, dbias;
};

// One (b, n) head of forward and backward in float64; dk/dv/dbias go to
// private buffers (summed over the GQA group / broadcast axes by the caller).
void ref_head(const Case& c, const Extras& x, int b, int n, double scale, const Tensor16& q,
              const Tensor16& k, const Tensor16& v, const Tensor16& d_o, Ref* r,
              std::vector<double>* dk, std::vector<double>* dv, std::vector<double>* dbias) {
  const int T = c.T, S = c.S, N = c.N, K = c.K, H = c.H, kh = n / (N / K);
  const double cap = c.f.softcap;
  auto qi = [&](int i) { return &q.val[((size_t(b) * T + i) * N + n) * H]; };
  auto gi = [&](int i) { return &d_o.val[((size_t(b) * T + i) * N + n) * H]; };
  auto kj = [&](int j) { return &k.val[((size_t(b) * S + j) * K + kh) * H]; };
  auto vj = [&](int j) { return &v.val[((size_t(b) * S + j) * K + kh) * H]; };
  std::vector<double> p(S), capped(S), keep(S);
  for (int i = 0; i < T; ++i) {
    double* o = &r->o[((size_t(b) * T + i) * N + n) * H];
    double* dq = &r->dq[((size_t(b) * T + i) * N + n) * H];
    double& lse = r->lse[(size_t(b) * N + n) * T + i];
    lse = -INFINITY;
    const bool row_ok = c.q_len.empty() || i < c.q_len[b];
    double m = -INFINITY;
    for (int j = 0; j < S; ++j) {
      p[j] = -INFINITY;
      if (!row_ok || !visible(c, x, b, n, i, j)) continue;
      double s = 0;
      for (int h = 0; h < H; ++h) s += qi(i)[h] * kj(j)[h];
      s *= scale;
      if (cap > 0) s = cap * std::tanh(s / cap);
      capped[j] = s;
      if (!x.bias.empty()) s += x.bias[b * x.bias_l.sb + n * x.bias_l.sn + size_t(i) * S + j];
      p[j] = s;
      m = std::max(m, p[j]);
    }
    if (m == -INFINITY) continue;  // o, dq stay zero
    double l = 0;
    for (int j = 0; j < S; ++j) l += p[j] == -INFINITY ? 0 : std::exp(p[j] - m);
    lse = m + std::log(l);
    for (int j = 0; j < S; ++j) p[j] = p[j] == -INFINITY ? 0 : std::exp(p[j] - m) / l;
    for (int j = 0; j < S; ++j) {
      keep[j] = 1.0;
      if (c.f.dropout > 0.f) {
        const uint32_t bb = c.f.dropout_bcast ? 0 : b, nn = c.f.dropout_bcast ? 0 : n;
        keep[j] = jaxcraft::dropout_keep(x.key, x.threshold, bb, nn, i, j) ? x.keep_scale : 0.0;
      }
    }
    for (int j = 0; j < S; ++j)
      if (p[j] != 0)
        for (int h = 0; h < H; ++h) o[h] += p[j] * keep[j] * vj(j)[h];
    double delta = 0;
    for (int h = 0; h < H; ++h) delta += gi(i)[h] * o[h];
    for (int j = 0; j < S; ++j) {
      if (p[j] == 0) continue;
      double s = 0;
      for (int h = 0; h < H; ++h) s += gi(i)[h] * vj(j)[h];
      const double dS = p[j] * (s * keep[j] - delta);
      if (!x.bias.empty()) (*dbias)[size_t(i) * S + j] += dS;
      const double ds = cap > 0 ? dS * (1 - (capped[j] / cap) * (capped[j] / cap)) : dS;
      for (int h = 0; h < H; ++h) {
        dq[h] += scale * ds * kj(j)[h];
        (*dk)[size_t(j) * H + h] += scale * ds * qi(i)[h];
        (*dv)[size_t(j) * H + h] += p[j] * keep[j] * gi(i)[h];
      }
    }
  }
}

Ref reference(const Case& c, const Extras& x, double scale, const Tensor16& q, const Tensor16& k,
              const Tensor16& v, const Tensor16& d_o) {
  Ref r;
  const size_t nq = size_t(c.B) * c.T * c.N * c.H, nk = size_t(c.B) * c.S * c.K * c.H;
  r.o.assign(nq, 0);
  r.dq.assign(nq, 0);
  r.lse.assign(size_t(c.B) * c.N * c.T, 0);
  r.dk.assign(nk, 0);
  r.dv.assign(nk, 0);
  r.dbias.assign(x.bias_l.elems, 0);
  const size_t ts = x.bias.empty() ? 0 : size_t(c.T) * c.S;
  std::vector<std::vector<double>> dk(c.B * c.N), dv(c.B * c.N), db(c.B * c.N);
  std::vector<std::thread> pool;
  for (int b = 0; b < c.B; ++b)
    for (int n = 0; n < c.N; ++n) {
      dk[b * c.N + n].assign(size_t(c.S) * c.H, 0);
      dv[b * c.N + n].assign(size_t(c.S) * c.H, 0);
      db[b * c.N + n].assign(ts, 0);
      pool.emplace_back(ref_head, std::cref(c), std::cref(x), b, n, scale, std::cref(q),
                        std::cref(k), std::cref(v), std::cref(d_o), &r, &dk[b * c.N + n],
                        &dv[b * c.N + n], &db[b * c.N + n]);
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
      for (size_t e = 0; e < ts; ++e)
        r.dbias[b * x.bias_l.sb + n * x.bias_l.sn + e] += db[b * c.N + n][e];
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
double rel_err(const std::vector<float>& got, const std::vector<double>& ref, bool* nan) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) *nan = true;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
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
// The forward's tile counter (one word, zeroed by the launcher before each
// launch), shared by every call: they run one after another on stream 0.
uint32_t* tile_counter() {
  static uint32_t* counter = [] {
    uint32_t* c = nullptr;
    CHECK(cudaMalloc(&c, sizeof(uint32_t)));
    return c;
  }();
  return counter;
}
template <typename T>
T* to_device_or_null(const std::vector<T>& h) {
  return h.empty() ? nullptr : to_device(h);
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
  const Extras x = make_extras(c, rng);
  const double scale = 1.0 / std::sqrt(double(c.H));
  const Ref ref = reference(c, x, scale, q, k, v, d_o);

  jaxcraft::AttentionShape shape{c.B, c.T, c.S, c.N, c.K, c.H};
  jaxcraft::AttentionMask mask;
  mask.causal = c.causal;
  mask.offset = c.offset;
  mask.window_left = c.wl;
  mask.window_right = c.wr;
  int* d_qlen = to_device_or_null(c.q_len);
  int* d_kvlen = to_device_or_null(c.kv_len);
  mask.q_lengths = d_qlen;
  mask.kv_lengths = d_kvlen;
  int* d_qseg = to_device_or_null(x.q_seg);
  int* d_kvseg = to_device_or_null(x.kv_seg);
  int* d_skr = to_device_or_null(x.seg_key_range);
  int* d_sqr = to_device_or_null(x.seg_query_range);
  uint8_t* d_mask = to_device_or_null(x.mask);
  mask.q_segment_ids = d_qseg;
  mask.kv_segment_ids = d_kvseg;
  mask.segment_key_range = d_skr;
  mask.segment_query_range = d_sqr;
  mask.mask = d_mask;
  mask.mask_stride_b = x.mask_l.sb;
  mask.mask_stride_n = x.mask_l.sn;

  jaxcraft::AttentionScores scores;
  scores.softcap = c.f.softcap;
  void* d_bias = x.bias.empty() ? nullptr
                 : c.f.bias_f32 ? static_cast<void*>(to_device(x.bias_f32))
                                : static_cast<void*>(to_device(x.bias_bits));
  scores.bias = d_bias;
  scores.bias_f32 = c.f.bias_f32;
  scores.bias_stride_b = x.bias_l.sb;
  scores.bias_stride_n = x.bias_l.sn;
  uint32_t* d_key = nullptr;
  if (c.f.dropout > 0.f) d_key = to_device(std::vector<uint32_t>{x.key[0], x.key[1]});
  scores.dropout_rate = c.f.dropout;
  scores.dropout_key = d_key;
  scores.dropout_broadcast = c.f.dropout_bcast;
  // Poisoned: every element must be written (or zeroed by the launcher).
  void* d_dbias = x.bias.empty() ? nullptr
                  : c.f.dbias16 ? static_cast<void*>(to_device(std::vector<uint16_t>(x.bias_l.elems, 0xffff)))
                                : static_cast<void*>(to_device(std::vector<float>(x.bias_l.elems, NAN)));

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
  fp.scores = scores;
  fp.q = dq_;
  fp.k = dk_;
  fp.v = dv_;
  fp.o = o;
  fp.lse = lse;
  fp.tile_counter = tile_counter();
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
  std::printf("%-58s o %.2e lse %.2e", c.name.c_str(), e_o, e_lse);
  for (int det = 0; det < 2; ++det) {
    jaxcraft::AttentionBwdParams bp;
    bp.shape = shape;
    bp.mask = mask;
    bp.dtype = c.dt;
    bp.scale = float(scale);
    bp.deterministic = det == 1;
    bp.scores = scores;
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
    bp.dbias = d_dbias;
    bp.dbias_f32 = !c.f.dbias16;
    CHECK(jaxcraft::launch_attention_bwd(bp, 0));
    CHECK(cudaDeviceSynchronize());
    const double e_dq = rel_err(to_host(gq, nq), ref.dq, c.dt, &nan);
    const double e_dk = rel_err(to_host(gk, nk), ref.dk, c.dt, &nan);
    const double e_dv = rel_err(to_host(gv, nk), ref.dv, c.dt, &nan);
    std::printf(" | %s dq %.2e dk %.2e dv %.2e", det ? "det" : "atom", e_dq, e_dk, e_dv);
    ok = ok && !nan && e_dq < kTol && e_dk < kTol && e_dv < kTol;
    if (d_dbias) {
      const double e_db =
          c.f.dbias16
              ? rel_err(to_host(static_cast<uint16_t*>(d_dbias), x.bias_l.elems), ref.dbias, c.dt, &nan)
              : rel_err(to_host(static_cast<float*>(d_dbias), x.bias_l.elems), ref.dbias, &nan);
      std::printf(" dbias %.2e", e_db);
      ok = ok && !nan && e_db < kTol;
    }
  }
  std::printf("%s %s\n", nan ? " NaN" : "", ok ? "PASS" : "FAIL");
  for (void* p : {(void*)dq_, (void*)dk_, (void*)dv_, (void*)ddo, (void*)o, (void*)gq, (void*)gk,
                  (void*)gv, (void*)lse, (void*)delta, (void*)acc, (void*)d_qlen, (void*)d_kvlen,
                  (void*)d_qseg, (void*)d_kvseg, (void*)d_skr, (void*)d_sqr, (void*)d_mask,
                  d_bias, (void*)d_key, (void*)d_dbias})
    if (p) CHECK(cudaFree(p));
  return ok;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int B = 2, N = 4, K = 2;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const std::vector<int> heads = dt == DType::kBF16 ? std::vector<int>{64, 128, 80}
                                                      : std::vector<int>{128, 64, 32, 256, 192};
    for (int H : heads) {
      // 256 x 384: query rows a multiple of 64 but not of head dim 64's
      // 192-row tiles (the last tile's third warpgroup has no rows). 250 x
      // 300, 450 x 512: head dim 64's 256-row short tiles.
      std::vector<std::pair<int, int>> lens = {{1, 1},      {7, 7},      {64, 64},  {129, 129},
                                               {1000, 1000}, {129, 1000}, {1000, 129}, {7, 129},
                                               {256, 384},   {250, 300},  {450, 512}};
      if (dt == DType::kF16) lens = {{7, 7}, {129, 129}, {300, 200}, {250, 300}};
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
  // Long sequences: many work items per persistent CTA (with
  // JAXCRAFT_ATTENTION_PERSISTENT_CTAS) and many backward steps per CTA,
  // where barrier protocols get tested that short runs pass by luck (a
  // warpgroup running ahead of another over many steps hung the head-dim-256
  // backward at the benchmark shapes while every short case passed).
  for (int H : {64, 128, 256})
    for (bool causal : {true, false}) {
      char name[128];
      std::snprintf(name, sizeof name, "bf16 H%d T2048 S2048 N2/1 long %s", H, causal ? "causal" : "full");
      out.push_back({1, 2048, 2048, 2, 1, H, causal, 0, -1, -1, {}, {}, DType::kBF16, name});
    }
  return out;
}

// Segment ids, the boolean mask, soft cap, bias (+ dbias) and dropout, alone
// and together, over awkward sizes, GQA and every head-dim bucket.
std::vector<Case> feature_cases() {
  std::vector<Case> out;
  const DType bf = DType::kBF16, hf = DType::kF16;
  auto add = [&](DType dt, int H, int T, int S, const char* what, bool causal, long long off,
                 long long wl, long long wr, Feat f, std::vector<int> ql = {},
                 std::vector<int> kl = {}, int B = 2, int N = 4, int K = 2) {
    char name[160];
    std::snprintf(name, sizeof name, "%s H%d T%d S%d N%d/%d %s", dt == bf ? "bf16" : "f16", H, T,
                  S, N, K, what);
    out.push_back({B, T, S, N, K, H, causal, off, wl, wr, ql, kl, dt, name, f});
  };
  auto feat = [](auto&& setup) {
    Feat f;
    setup(f);
    return f;
  };
  const Feat cap15 = feat([](Feat& f) { f.softcap = 1.5f; });
  const Feat cap30 = feat([](Feat& f) { f.softcap = 30.f; });
  // Soft cap.
  add(bf, 64, 67, 130, "softcap 1.5", false, 0, -1, -1, cap15);
  add(hf, 128, 67, 130, "softcap 30 causal br", true, 130 - 67, -1, -1, cap30);
  // Bias: full (plain dbias stores), broadcast over b / n / both (atomics).
  add(bf, 64, 67, 130, "bias full", false, 0, -1, -1, feat([](Feat& f) { f.bias = Bcast::kFull; }));
  add(bf, 128, 130, 67, "bias full f32 causal", true, 0, -1, -1,
      feat([](Feat& f) { f.bias = Bcast::kFull; f.bias_f32 = true; }));
  add(hf, 64, 67, 130, "bias bcast-b window 40/9", false, 130 - 67, 40, 9,
      feat([](Feat& f) { f.bias = Bcast::kBcastB; }));
  add(bf, 128, 67, 130, "bias bcast-n softcap 5", false, 0, -1, -1,
      feat([](Feat& f) { f.bias = Bcast::kBcastN; f.softcap = 5.f; }));
  add(hf, 128, 130, 130, "bias [T,S] f32 causal", true, 0, -1, -1,
      feat([](Feat& f) { f.bias = Bcast::kBcastBN; f.bias_f32 = true; }));
  add(bf, 64, 129, 129, "bias full B1 causal", true, 0, -1, -1,
      feat([](Feat& f) { f.bias = Bcast::kFull; }), {}, {}, 1, 2, 1);
  add(hf, 64, 129, 129, "bias bcast-n B1 MQA", false, 0, -1, -1,
      feat([](Feat& f) { f.bias = Bcast::kBcastN; }), {}, {}, 1, 4, 1);
  // dbias in the bias's 16-bit dtype: causal and lengths leave query tiles
  // unvisited (the Hopper kernel zeroes them itself, poisoned here).
  const Feat full16 = feat([](Feat& f) { f.bias = Bcast::kFull; f.dbias16 = true; });
  add(bf, 128, 300, 300, "bias full dbias16 causal", true, 0, -1, -1, full16);
  add(hf, 64, 200, 130, "bias full dbias16 lens", false, 0, -1, -1, full16, {150, 7}, {130, 60});
  add(bf, 256, 67, 130, "bias full dbias16 softcap 5", false, 0, -1, -1,
      feat([](Feat& f) { f.bias = Bcast::kFull; f.dbias16 = true; f.softcap = 5.f; }));
  add(bf, 128, 129, 129, "bias [1,N] dbias16 B1 GQA", true, 0, -1, -1, full16, {}, {}, 1, 4, 2);
  // Boolean mask (one row sees no key).
  add(bf, 64, 67, 130, "mask full", false, 0, -1, -1, feat([](Feat& f) { f.mask = Bcast::kFull; }));
  add(hf, 128, 130, 67, "mask bcast-n causal br", true, 67 - 130, -1, -1,
      feat([](Feat& f) { f.mask = Bcast::kBcastN; }));
  add(bf, 128, 67, 130, "mask [T,S] lens", false, 0, -1, -1,
      feat([](Feat& f) { f.mask = Bcast::kBcastBN; }), {67, 40}, {100, 130});
  // Segment ids (the last rows' document has no keys).
  const Feat sorted = feat([](Feat& f) { f.seg = Seg::kSorted; });
  const Feat unsorted = feat([](Feat& f) { f.seg = Seg::kUnsorted; });
  add(bf, 64, 300, 300, "seg sorted causal", true, 0, -1, -1, sorted);
  add(bf, 128, 130, 130, "seg unsorted causal", true, 0, -1, -1, unsorted);
  add(hf, 64, 67, 130, "seg sorted lens", false, 0, -1, -1, sorted, {60, 67}, {130, 90});
  add(hf, 128, 130, 67, "seg unsorted", false, 0, -1, -1, unsorted);
  add(bf, 128, 1000, 1000, "seg sorted causal", true, 0, -1, -1, sorted);
  add(bf, 64, 1000, 1000, "seg sorted window 100/0", false, 0, 100, 0, sorted);
  add(hf, 64, 320, 320, "seg unsorted causal", true, 0, -1, -1, unsorted);  // a partial 192-row tile
  // Dropout.
  add(bf, 64, 67, 130, "dropout 0.2", false, 0, -1, -1, feat([](Feat& f) { f.dropout = 0.2f; }));
  add(hf, 128, 130, 130, "dropout 0.5 bcast causal", true, 0, -1, -1,
      feat([](Feat& f) { f.dropout = 0.5f; f.dropout_bcast = true; }));
  add(bf, 128, 300, 1000, "dropout 0.1 causal br", true, 700, -1, -1,
      feat([](Feat& f) { f.dropout = 0.1f; }));
  add(bf, 64, 256, 256, "dropout 0.1 causal", true, 0, -1, -1, feat([](Feat& f) { f.dropout = 0.1f; }));
  // Everything together, on every head-dim bucket.
  const Feat all = feat([](Feat& f) {
    f.softcap = 5.f;
    f.bias = Bcast::kBcastN;
    f.seg = Seg::kSorted;
    f.mask = Bcast::kFull;
    f.dropout = 0.1f;
  });
  const Feat all2 = feat([](Feat& f) {
    f.softcap = 2.f;
    f.bias = Bcast::kFull;
    f.bias_f32 = true;
    f.seg = Seg::kUnsorted;
    f.dropout = 0.3f;
    f.dropout_bcast = true;
  });
  add(bf, 128, 67, 130, "all causal br", true, 130 - 67, -1, -1, all);
  add(hf, 64, 130, 67, "all lens", false, 0, -1, -1, all, {130, 100}, {67, 50});
  add(bf, 64, 67, 130, "all2 causal", true, 0, -1, -1, all2);
  add(hf, 128, 200, 200, "all2 window 50/20", false, 0, 50, 20, all2);
  for (int H : {32, 80, 96, 192, 256}) {
    add(bf, H, 67, 130, "all causal br", true, 130 - 67, -1, -1, all);
    add(hf, H, 130, 67, "all2", false, 0, -1, -1, all2);
  }
  // Rows of bias and mask 16-byte aligned (S a multiple of 16): staged with
  // cp.async, partial chunks zero-filled at kv_len.
  add(bf, 128, 100, 320, "bias + mask aligned causal br", true, 220, -1, -1,
      feat([](Feat& f) { f.bias = Bcast::kFull; f.mask = Bcast::kFull; }));
  add(hf, 64, 256, 256, "bias f32 + mask aligned lens causal", true, 0, -1, -1,
      feat([](Feat& f) { f.bias = Bcast::kBcastN; f.bias_f32 = true; f.mask = Bcast::kBcastN; }),
      {256, 200}, {250, 131});
  add(bf, 256, 64, 512, "all aligned", false, 0, -1, -1, all);
  add(bf, 32, 130, 1024, "bias f32 + mask aligned window 300/40", false, 1024 - 130, 300, 40,
      feat([](Feat& f) { f.bias = Bcast::kFull; f.bias_f32 = true; f.mask = Bcast::kFull; }));
  // Level 1 alone (segment ids + mask, no score features) on the other buckets.
  for (int H : {32, 96, 192, 256})
    add(bf, H, 130, 130, "seg sorted + mask causal", true, 0, -1, -1,
        feat([](Feat& f) { f.seg = Seg::kSorted; f.mask = Bcast::kBcastN; }));
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
  int B, S, N, H;
  size_t n;
  uint16_t *q, *k, *v, *o, *o2, *d_o, *gq, *gk, *gv, *gk2;
  float *lse, *delta, *acc;
  TimingBuffers(int B_, int S_, int N_, int H_, unsigned seed)
      : B(B_), S(S_), N(N_), H(H_), n(size_t(B_) * S_ * N_ * H_) {
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
  // Self-attention over these buffers (no features but the causal mask).
  jaxcraft::AttentionFwdParams fwd_params(bool causal) const {
    jaxcraft::AttentionFwdParams fp;
    fp.shape = {B, S, S, N, N, H};
    fp.mask.causal = causal;
    fp.scale = 1.f / std::sqrt(float(H));
    fp.q = q, fp.k = k, fp.v = v, fp.o = o, fp.lse = lse;
    fp.tile_counter = tile_counter();
    return fp;
  }
  jaxcraft::AttentionBwdParams bwd_params(bool causal) const {
    const jaxcraft::AttentionFwdParams fp = fwd_params(causal);
    jaxcraft::AttentionBwdParams bp;
    bp.shape = fp.shape;
    bp.mask = fp.mask;
    bp.scale = fp.scale;
    bp.q = q, bp.k = k, bp.v = v, bp.o = o, bp.d_o = d_o, bp.lse = lse;
    bp.dq = gq, bp.dk = gk, bp.dv = gv, bp.delta = delta, bp.dq_accum = acc;
    return bp;
  }
  ~TimingBuffers() {
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)o2, (void*)d_o, (void*)gq,
                    (void*)gk, (void*)gv, (void*)gk2, (void*)lse, (void*)delta, (void*)acc})
      CHECK(cudaFree(p));
  }
};

void bench(int B, int S, int N, int H, bool causal) {
  TimingBuffers buf(B, S, N, H, 7);
  const jaxcraft::AttentionFwdParams fp = buf.fwd_params(causal);
  jaxcraft::AttentionBwdParams bp = buf.bwd_params(causal);

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

// One forward and one backward (for a profiler to pick the kernels out).
void profile_bwd(int B, int S, int N, int H, bool causal) {
  TimingBuffers buf(B, S, N, H, 7);
  CHECK(jaxcraft::launch_attention_fwd(buf.fwd_params(causal), 0));
  CHECK(jaxcraft::launch_attention_bwd(buf.bwd_params(causal), 0));
  CHECK(cudaDeviceSynchronize());
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
  CHECK(jaxcraft::launch_attention_fwd(buf.fwd_params(causal), 0));
  const jaxcraft::AttentionBwdParams bp = buf.bwd_params(causal);
  CHECK(jaxcraft::launch_attention_bwd(bp, 0));  // delta and the default dK
  jaxcraft::attn::BwdArgs ba{};
  ba.shape = {B, S, S, N, N, H};
  ba.mask = {causal ? 1 : 0, 0, -1, -1, nullptr, nullptr};
  ba.scale = bp.scale;
  ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = d_o, ba.lse = lse;
  ba.dq = gq, ba.dk = gk2, ba.dv = gv, ba.delta = delta, ba.dq_accum = acc;
  const double flops = 2.5 * 4.0 * B * N * double(S) * S * H * (causal ? 0.5 : 1.0);
  auto one = [&](auto cfg) {
    using Cfg = decltype(cfg);
    const double ms = time_ms([&] { return jaxcraft::attn::sm90::launch_bwd_sm90<DType::kBF16, Cfg>(ba, 0); });
    std::printf("sm90 bwd H%d S%d %s queries/step %d dq_by_keys %d tma_dq %d in_stage %d stages %d: %.3f ms %.1f TFLOP/s maxdiff %.2e\n",
                H, S, causal ? "causal" : "full  ", Cfg::kBlockM, Cfg::kDqByKeys, Cfg::kDqTma, Cfg::kDqInStage, Cfg::kStages, ms,
                flops / ms / 1e9, max_diff(gk, gk2, n));
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
  fp.tile_counter = tile_counter();
  CHECK(jaxcraft::launch_attention_fwd(fp, 0));
  jaxcraft::attn::FwdArgs fa{};
  fa.shape = {B, S, S, N, N, H};
  fa.mask = {causal ? 1 : 0, 0, -1, -1, nullptr, nullptr};
  fa.scale = fp.scale;
  fa.q = buf.q, fa.k = buf.k, fa.v = buf.v, fa.o = buf.o2, fa.lse = buf.delta;
  const double flops = 4.0 * B * N * double(S) * S * H * (causal ? 0.5 : 1.0);
  auto one = [&](auto cfg) {
    using Cfg = decltype(cfg);
    CHECK(cudaMemset(buf.o2, 0, buf.n * 2));
    const double ms = time_ms([&] { return jaxcraft::attn::sm90::launch_fwd_sm90<DType::kBF16, Cfg>(fa, 0); });
    std::printf("sm90 fwd H%d S%d %s tile %dx%d stages %d overlap %d persistent %d (causal up to %d) "
                "Q buffers %d O in stage %d split K/V %d: %.3f ms %.1f TFLOP/s maxdiff %.2e\n", H, S,
                causal ? "causal" : "full  ", Cfg::kBlockM, Cfg::kBlockN, Cfg::kStages, Cfg::kOverlap,
                Cfg::kPersistent, Cfg::kCausalPersistRows, Cfg::kQBufs, Cfg::kOInStage, Cfg::kSplitKV, ms,
                flops / ms / 1e9, max_diff(buf.o, buf.o2, buf.n));
  };
  (one(Cfgs{}), ...);
}

// The launcher's Hopper forward tiles against alternatives, at 16k tokens:
// at head dim 64 the 128-query tiles with the overlapped loop (the short
// causal rows' tiles before the per-warpgroup trim), the overlapped loop
// with three consumers, and a fourth stage; at head dim 256 the tiles the
// split K/V ring replaced (no overlap, one CTA per item under a causal mask).
namespace fwd_alternatives {
using jaxcraft::attn::sm90::FwdTileDefaults;
struct Overlap64 : FwdTileDefaults {  // two consumers, the overlapped loop
  static constexpr int kHeadDim = 64, kConsumers = 2, kBlockN = 128, kStages = 3;
  static constexpr bool kOverlap = true, kPersistent = true;
  static constexpr int kQBufs = 2, kCausalPersistRows = 2048;
};
struct OverlapThree64 : Overlap64 {  // three consumers
  static constexpr int kConsumers = 3, kCausalPersistRows = 4096;
};
struct OverlapFourStages64 : Overlap64 {
  static constexpr int kStages = 4;
};
struct NoOverlap256 : FwdTileDefaults {  // one ring, one CTA per causal item
  static constexpr int kHeadDim = 256, kConsumers = 2, kBlockN = 64;
  static constexpr bool kPersistent = true, kOInStage = true;
};
}  // namespace fwd_alternatives

namespace bwd_alternatives {
struct StagedThree128 : jaxcraft::attn::sm90::BwdBias128 {  // dQ staged, a third stage
  static constexpr int kStages = 3;
};
}  // namespace bwd_alternatives

void fwd_persistent_variants() {
  using namespace jaxcraft::attn::sm90;
  using namespace fwd_alternatives;
  for (bool causal : {false, true})
    for (int S : {512, 1024, 2048, 4096, 8192, 16384}) {
      fwd_sm90_variants<128, FwdTiles<128>::type>(16384 / S, S, causal);
      fwd_sm90_variants<64, FwdTiles<64>::type, FwdConfig<Overlap64>, FwdConfig<OverlapThree64>,
                        FwdConfig<OverlapFourStages64>>(16384 / S, S, causal);
      fwd_sm90_variants<256, FwdTiles<256>::type, FwdConfig<NoOverlap256>>(16384 / S, S, causal);
    }
}

// The head-dim-64 backward's 128-query steps (the plain instance) against
// the 64-query steps the feature instances keep, at 16k tokens.
void bwd_step_variants() {
  using namespace jaxcraft::attn::sm90;
  for (bool causal : {false, true})
    for (int S : {512, 1024, 2048, 4096, 8192, 16384})
      bwd_sm90_variants<64, BwdTiles<64>::type, BwdFeatureTiles<64>::type>(16384 / S, S, causal);
}

// Timings of the per-element features against the plain kernels on the same
// inputs (whichever kernels the launcher picks; `portable` forces sm_80).
void bench_features(int B, int S, int N, int H) {
  TimingBuffers buf(B, S, N, H, 17);
  struct Variant {
    const char* label;
    bool causal;
    Feat f;
  };
  auto feat = [](auto&& setup) {
    Feat f;
    setup(f);
    return f;
  };
  const std::vector<Variant> variants = {
      {"causal", true, Feat{}},
      {"causal + seg ids (4 docs)", true, feat([](Feat& f) { f.seg = Seg::kSorted; f.docs = 4; })},
      {"causal + seg ids (16 docs)", true, feat([](Feat& f) { f.seg = Seg::kSorted; f.docs = 16; })},
      {"causal + mask [B,1,S,S]", true, feat([](Feat& f) { f.mask = Bcast::kBcastN; })},
      {"causal + softcap 30", true, feat([](Feat& f) { f.softcap = 30.f; })},
      {"causal + bias [1,N,S,S]", true, feat([](Feat& f) { f.bias = Bcast::kBcastB; })},
      {"causal + bias [B,N,S,S]", true, feat([](Feat& f) { f.bias = Bcast::kFull; })},
      {"causal + dropout 0.1", true, feat([](Feat& f) { f.dropout = 0.1f; })},
      {"full", false, Feat{}},
      {"full + bias [1,N,S,S] + softcap", false,
       feat([](Feat& f) { f.bias = Bcast::kBcastB; f.softcap = 30.f; })},
  };
  const double flops_full = 4.0 * B * N * double(S) * S * H;
  std::mt19937 rng(5);
  for (const Variant& var : variants) {
    const Case c{B, S, S, N, N, H, var.causal, 0, -1, -1, {}, {}, DType::kBF16, var.label, var.f};
    const Extras x = make_extras(c, rng);
    int* d_qseg = to_device_or_null(x.q_seg);
    int* d_kvseg = to_device_or_null(x.kv_seg);
    int* d_skr = to_device_or_null(x.seg_key_range);
    int* d_sqr = to_device_or_null(x.seg_query_range);
    uint8_t* d_mask = to_device_or_null(x.mask);
    void* d_bias = x.bias.empty() ? nullptr : static_cast<void*>(to_device(x.bias_bits));
    uint32_t* d_key = var.f.dropout > 0.f ? to_device(std::vector<uint32_t>{x.key[0], x.key[1]}) : nullptr;
    float* d_dbias = x.bias.empty() ? nullptr : to_device(std::vector<float>(x.bias_l.elems, 0.f));

    jaxcraft::AttentionFwdParams fp;
    fp.shape = {B, S, S, N, N, H};
    fp.mask.causal = var.causal;
    fp.mask.q_segment_ids = d_qseg;
    fp.mask.kv_segment_ids = d_kvseg;
    fp.mask.segment_key_range = d_skr;
    fp.mask.segment_query_range = d_sqr;
    fp.mask.mask = d_mask;
    fp.mask.mask_stride_b = x.mask_l.sb;
    fp.mask.mask_stride_n = x.mask_l.sn;
    fp.scores.softcap = var.f.softcap;
    fp.scores.bias = d_bias;
    fp.scores.bias_stride_b = x.bias_l.sb;
    fp.scores.bias_stride_n = x.bias_l.sn;
    fp.scores.dropout_rate = var.f.dropout;
    fp.scores.dropout_key = d_key;
    fp.scale = 1.f / std::sqrt(float(H));
    fp.q = buf.q, fp.k = buf.k, fp.v = buf.v, fp.o = buf.o, fp.lse = buf.lse;
    fp.tile_counter = tile_counter();
    jaxcraft::AttentionBwdParams bp;
    bp.shape = fp.shape;
    bp.mask = fp.mask;
    bp.scores = fp.scores;
    bp.scale = fp.scale;
    bp.q = buf.q, bp.k = buf.k, bp.v = buf.v, bp.o = buf.o, bp.d_o = buf.d_o, bp.lse = buf.lse;
    bp.dq = buf.gq, bp.dk = buf.gk, bp.dv = buf.gv, bp.delta = buf.delta, bp.dq_accum = buf.acc;
    bp.dbias = d_dbias;
    const double f = var.causal ? 0.5 * flops_full : flops_full;
    const double t_fwd = time_ms([&] { return jaxcraft::launch_attention_fwd(fp, 0); });
    bp.deterministic = false;
    const double t_bwd = time_ms([&] { return jaxcraft::launch_attention_bwd(bp, 0); });
    bp.deterministic = true;
    const double t_det = time_ms([&] { return jaxcraft::launch_attention_bwd(bp, 0); });
    std::printf("feature bench B%d S%d N%d H%d %-34s fwd %.3f ms (%.0f TF/s)  bwd %.3f ms (%.0f)  bwd(det) %.3f ms (%.0f)\n",
                B, S, N, H, var.label, t_fwd, f / t_fwd / 1e9, t_bwd, 2.5 * f / t_bwd / 1e9, t_det,
                2.5 * f / t_det / 1e9);
    for (void* p : {(void*)d_qseg, (void*)d_kvseg, (void*)d_skr, (void*)d_sqr, (void*)d_mask, d_bias,
                    (void*)d_key, (void*)d_dbias})
      if (p) CHECK(cudaFree(p));
  }
}

// dK/dV tile shapes for the feature instances at H128 (tile_config.h's
// default 128 keys vs 64), dK/dV + atomic dQ kernel alone.
void dkdv_feature_shapes(int B, int S, int N) {
  constexpr int H = 128;
  TimingBuffers buf(B, S, N, H, 19);
  auto feat = [](auto&& setup) {
    Feat f;
    setup(f);
    return f;
  };
  const std::vector<std::pair<const char*, Feat>> variants = {
      {"plain", Feat{}},
      {"seg ids (4 docs)", feat([](Feat& f) { f.seg = Seg::kSorted; f.docs = 4; })},
      {"bias [1,N,S,S] + softcap", feat([](Feat& f) { f.bias = Bcast::kBcastB; f.softcap = 30.f; })},
      {"dropout 0.1", feat([](Feat& f) { f.dropout = 0.1f; })},
  };
  std::mt19937 rng(5);
  for (const auto& var : variants) {
    const Case c{B, S, S, N, N, H, true, 0, -1, -1, {}, {}, DType::kBF16, var.first, var.second};
    const Extras x = make_extras(c, rng);
    int* d_qseg = to_device_or_null(x.q_seg);
    int* d_kvseg = to_device_or_null(x.kv_seg);
    int* d_skr = to_device_or_null(x.seg_key_range);
    int* d_sqr = to_device_or_null(x.seg_query_range);
    void* d_bias = x.bias.empty() ? nullptr : static_cast<void*>(to_device(x.bias_bits));
    uint32_t* d_key = var.second.dropout > 0.f ? to_device(std::vector<uint32_t>{x.key[0], x.key[1]}) : nullptr;
    float* d_dbias = x.bias.empty() ? nullptr : to_device(std::vector<float>(x.bias_l.elems, 0.f));
    jaxcraft::AttentionBwdParams bp;
    bp.shape = {B, S, S, N, N, H};
    bp.mask.causal = true;
    bp.mask.q_segment_ids = d_qseg;
    bp.mask.kv_segment_ids = d_kvseg;
    bp.mask.segment_key_range = d_skr;
    bp.mask.segment_query_range = d_sqr;
    bp.scores.softcap = var.second.softcap;
    bp.scores.bias = d_bias;
    bp.scores.bias_stride_b = x.bias_l.sb;
    bp.scores.bias_stride_n = x.bias_l.sn;
    bp.scores.dropout_rate = var.second.dropout;
    bp.scores.dropout_key = d_key;
    bp.scale = 1.f / std::sqrt(float(H));
    bp.q = buf.q, bp.k = buf.k, bp.v = buf.v, bp.o = buf.o, bp.d_o = buf.d_o, bp.lse = buf.lse;
    bp.dq = buf.gq, bp.dk = buf.gk, bp.dv = buf.gv, bp.delta = buf.delta, bp.dq_accum = buf.acc;
    bp.dbias = d_dbias;
    jaxcraft::AttentionFwdParams fp;
    fp.shape = bp.shape;
    fp.mask = bp.mask;
    fp.scores = bp.scores;
    fp.scale = bp.scale;
    fp.q = buf.q, fp.k = buf.k, fp.v = buf.v, fp.o = buf.o, fp.lse = buf.lse;
    fp.tile_counter = tile_counter();
    CHECK(jaxcraft::launch_attention_fwd(fp, 0));
    CHECK(jaxcraft::launch_attention_bwd(bp, 0));  // fills delta
    jaxcraft::attn::BwdArgs ba{};
    jaxcraft::attn::to_kernel_args(bp.shape, bp.mask, &ba.shape, &ba.mask);
    ba.scores = jaxcraft::attn::to_score_args(bp.scores);
    ba.scale = bp.scale;
    ba.q = bp.q, ba.k = bp.k, ba.v = bp.v, ba.o = bp.o, ba.d_o = bp.d_o, ba.lse = bp.lse;
    ba.dq = bp.dq, ba.dk = bp.dk, ba.dv = bp.dv, ba.delta = bp.delta, ba.dq_accum = bp.dq_accum;
    ba.dbias = d_dbias;
    ba.dbias_f32 = 1;
    using namespace jaxcraft::attn;
    // The instance the launcher runs, and for plain / mask-only launches
    // the 64-key alternative (the score features do not fit 128 keys).
    const int level = feat_level(ba.mask, ba.scores);
    double t_run = 0, t_alt = 0;
    if (level == kFeatScores) {
      t_run = time_ms([&] {
        return launch_dkdv_shape<DType::kBF16, DkdvLevelShape<128, kFeatScores>::type, kFeatScores>(ba, 0);
      });
    } else {
      auto time_shape = [&](auto shape) {
        using Sh = decltype(shape);
        return time_ms([&] {
          return level == kFeatMasks ? launch_dkdv_shape<DType::kBF16, Sh, kFeatMasks>(ba, 0)
                                     : launch_dkdv_shape<DType::kBF16, Sh, kFeatPlain>(ba, 0);
        });
      };
      t_run = time_shape(DkdvShape<128>{});
      t_alt = time_shape(DkdvShape<128, 8, 64, 64, 2>{});
    }
    std::printf("dkdv+dq H128 B%d S%d N%d causal %-26s level %d: %.3f ms (64-key alternative %.3f ms)\n",
                B, S, N, var.first, level, t_run, t_alt);
    for (void* p : {(void*)d_qseg, (void*)d_kvseg, (void*)d_skr, (void*)d_sqr, d_bias, (void*)d_key,
                    (void*)d_dbias})
      if (p) CHECK(cudaFree(p));
  }
}

bool has_arg(int argc, char** argv, const char* what) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == what) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep the log when a timeout kills the run
  // Before the first launch: the launcher reads the variable once.
  if (has_arg(argc, argv, "portable")) setenv("JAXCRAFT_ATTENTION_KERNEL", "portable", 1);
  const char* env = std::getenv("JAXCRAFT_ATTENTION_KERNEL");
  const bool portable = env != nullptr && std::string(env) == "portable";
  std::printf("kernels: %s\n", portable ? "portable (sm_80) everywhere"
                                        : "launcher's choice (Hopper where it applies)");
  if (has_arg(argc, argv, "shapes")) {
    dkdv_feature_shapes(4, 2048, 16);
    return 0;
  }
  if (has_arg(argc, argv, "profile")) {  // one backward per shape, for ncu
    for (bool causal : {true, false}) profile_bwd(8, 2048, 32, 64, causal);
    profile_bwd(2, 8192, 16, 128, false);
    return 0;
  }
  if (has_arg(argc, argv, "fwdvariants")) {
    fwd_persistent_variants();
    return 0;
  }
  if (has_arg(argc, argv, "bwdvariants")) {
    bwd_step_variants();
    return 0;
  }
  if (has_arg(argc, argv, "featbench")) {
    for (int H : {128, 64}) bench_features(4, 2048, 2048 / H, H);
    return 0;
  }
  const bool bench_only = has_arg(argc, argv, "bench");
  const bool check_only = has_arg(argc, argv, "check");
  const bool features_only = has_arg(argc, argv, "features");
  int fails = 0, total = 0;
  if (!bench_only) {
    std::mt19937 rng(1234);
    std::vector<Case> all;
    // `small`: sequences up to 300 only (compute-sanitizer runs).
    const bool small = has_arg(argc, argv, "small");
    std::string only;
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]).rfind("only=", 0) == 0) only = argv[i] + 5;
    for (const auto& list : {features_only ? std::vector<Case>{} : cases(), feature_cases()})
      for (const Case& c : list)
        if ((!small || std::max(c.T, c.S) <= 300) && c.name.find(only) != std::string::npos)
          all.push_back(c);
    std::vector<std::string> failed;
    for (const Case& c : all) {
      ++total;
      if (!run_case(c, rng)) {
        ++fails;
        failed.push_back(c.name);
      }
    }
    jaxcraft::AttentionShape f32{1, 8, 8, 1, 1, 64};
    const char* why = jaxcraft::attention_cuda_unsupported(f32, DType::kF32);
    std::printf("f32 unsupported: %s\n", why ? why : "(null)");
    jaxcraft::AttentionShape big{1, 8, 8, 1, 1, 300};
    why = jaxcraft::attention_cuda_unsupported(big, DType::kBF16);
    std::printf("H300 unsupported: %s\n", why ? why : "(null)");
    for (const std::string& n : failed) std::printf("FAILED: %s\n", n.c_str());
    std::printf("%d/%d cases passed: %s\n", total - fails, total, fails ? "FAIL" : "PASS");
  }
  if (check_only || features_only) return fails ? 1 : 0;
  for (int H : {128, 64}) bench_features(4, 2048, 2048 / H, H);
  for (int H : {128, 64, 256}) {
    bench(8, 2048, 2048 / H, H, false);
    bench(8, 2048, 2048 / H, H, true);
  }
  bench(2, 8192, 16, 128, false);
  bench(2, 8192, 16, 128, true);
  // The Hopper tile sweeps launch the kernels directly, so they run only
  // where the kernels have code (not on other GPUs, nor on PTX the driver compiled).
  if (!jaxcraft::attn::sm90::fwd_sm90_available<DType::kBF16, 128>()) return fails ? 1 : 0;
  {
    using namespace jaxcraft::attn::sm90;
    using bwd_alternatives::StagedThree128;
    for (bool causal : {false, true}) {
      // Head dim 64: 128-query steps (the plain default) vs 64-query steps
      // (the feature instances); TMA dQ from tiles of its own vs staged in
      // the Q/dO stage (the kBias instances), which leaves room for a third
      // stage at 128.
      bwd_sm90_variants<64, BwdConfig<BwdPlain64>, BwdConfig<BwdFeature64>, BwdConfig<BwdBias64>>(
          8, 2048, causal);
      bwd_sm90_variants<128, BwdConfig<BwdPlain128>, BwdConfig<BwdBias128>, BwdConfig<StagedThree128>>(
          8, 2048, causal);
    }
  }
  fwd_persistent_variants();
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
