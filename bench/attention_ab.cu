// The Hopper attention kernels alone, for old-vs-new comparisons
// (bench/attention_ab.sh builds this file twice: against the working tree
// and against an older revision's cpp/ tree). bf16 self-attention at 16k
// tokens per batch and hidden 2048 (B = 16384 / S, N = 2048 / D), causal and
// not, S = 512..16384 (AB_GQA=G: G query heads per KV head, N / G KV heads),
// the forward (the launcher's dispatch) and the plain
// backward kernel (dK, dV and the atomic dQ; delta zero, so the times but
// not the values are the real backward's; AB_FWD_ONLY=1 skips it).
// AB_FEATURES=1 adds the forward's feature instances at S = 2048 and 8192:
// a boolean mask (kMasks), soft cap (kScores), a bf16 bias (kBias where its
// tiles fit, else kScores) and dropout (kDropout), each broadcast over
// batch and heads. Best of
// 5 x 20 launches; an FNV-1a hash of O and of dK, dV tells whether a change
// kept the outputs.
// Build: nvcc -std=c++17 -O3 --expt-relaxed-constexpr
//   -gencode=arch=compute_90a,code=sm_90a -DHEAD_DIM=128 -I<tree>/cpp attention_ab.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention/sm90/bwd_kernel.cuh"
#include "kernels/attention/sm90/fwd_kernel.cuh"

using namespace jaxcraft;
using namespace jaxcraft::attn;

#define CHECK(...)                                                                  \
  do {                                                                              \
    const cudaError_t err = (__VA_ARGS__);                                          \
    if (err != cudaSuccess) {                                                       \
      std::printf("CUDA error %s at line %d\n", cudaGetErrorString(err), __LINE__); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

namespace {

uint16_t to_bf16(float x) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <class Launch>
double best_us(Launch launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) CHECK(launch());
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < 20; ++i) CHECK(launch());
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, ms * 1e3 / 20);
  }
  return best;
}

uint64_t fnv1a(const void* device, size_t bytes, uint64_t hash = 1469598103934665603ull) {
  std::vector<uint8_t> host(bytes);
  CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  for (uint8_t c : host) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

// The tile counter where this side's kernel arguments have one
// (AB_NO_TILE_COUNTER=1: none, so the forward keeps its fixed stride).
template <class A>
auto set_tile_counter(A& a, uint32_t* c, int) -> decltype(a.tile_counter = c, void()) {
  a.tile_counter = c;
}
template <class A>
void set_tile_counter(A&, uint32_t*, long) {}

}  // namespace

int main(int argc, char** argv) {
  constexpr int H = HEAD_DIM;
  const char* tag = argc > 1 ? argv[1] : "-";
  const int group = getenv("AB_GQA") ? std::atoi(getenv("AB_GQA")) : 1;
  uint32_t* tile_counter = nullptr;
  CHECK(cudaMalloc(&tile_counter, sizeof(uint32_t)));
  enum Feature { kNone, kMask, kSoftcap, kBias, kDropout };
  const char* feature_names[] = {"", "-mask", "-softcap", "-bias", "-dropout"};
  struct Row { int causal, S; Feature feature; };
  std::vector<Row> rows_to_run;
  for (int causal : {0, 1})
    for (int S : {512, 1024, 2048, 4096, 8192, 16384}) rows_to_run.push_back({causal, S, kNone});
  if (getenv("AB_FEATURES"))
    for (Feature f : {kMask, kSoftcap, kBias, kDropout})
      for (int causal : {0, 1})
        for (int S : {2048, 8192}) rows_to_run.push_back({causal, S, f});
  uint32_t* dropout_key = nullptr;
  CHECK(cudaMalloc(&dropout_key, 2 * sizeof(uint32_t)));
  CHECK(cudaMemset(dropout_key, 0x5a, 2 * sizeof(uint32_t)));
  for (const Row& row : rows_to_run) {
    const int causal = row.causal, S = row.S;
    const int B = 16384 / S, N = 2048 / H, K = N / group;
    const size_t n = size_t(B) * S * N * H, n_kv = n / group, rows = size_t(B) * N * S;
    void *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
    float *lse, *delta, *dq_accum;
    for (void** p : {&q, &o, &d_o, &dq}) CHECK(cudaMalloc(p, n * 2));
    for (void** p : {&k, &v, &dk, &dv}) CHECK(cudaMalloc(p, n_kv * 2));
    CHECK(cudaMalloc(&lse, rows * 4));
    CHECK(cudaMalloc(&delta, rows * 4));
    CHECK(cudaMalloc(&dq_accum, n * 4));
    CHECK(cudaMemset(delta, 0, rows * 4));
    CHECK(cudaMemset(dq_accum, 0, n * 4));
    std::vector<uint16_t> host(n);
    uint32_t state = 12345;  // the same inputs in every build
    for (void* p : {q, k, v, d_o}) {
      const size_t count = p == k || p == v ? n_kv : n;
      for (size_t i = 0; i < count; ++i) {
        state = state * 1664525u + 1013904223u;
        host[i] = to_bf16(((state >> 8) * (1.f / 16777216.f) - 0.5f) * 3.f);
      }
      CHECK(cudaMemcpy(p, host.data(), count * 2, cudaMemcpyHostToDevice));
    }
    FwdArgs fa{};
    fa.shape = {B, S, S, N, K, H};
    fa.mask = {causal, 0, -1, -1, nullptr, nullptr};
    fa.scale = 1.f / std::sqrt(float(H));
    fa.q = q, fa.k = k, fa.v = v, fa.o = o, fa.lse = lse;
    if (!getenv("AB_NO_TILE_COUNTER")) set_tile_counter(fa, tile_counter, 0);
    void* feature_input = nullptr;  // the [S, S] mask or bias, broadcast
    if (row.feature == kMask || row.feature == kBias) {
      const size_t elems = size_t(S) * S, bytes = row.feature == kMask ? 1 : 2;
      std::vector<uint8_t> values(elems * bytes);
      for (size_t i = 0; i < elems; ++i) {
        const size_t r = i / S, c = i % S;
        if (row.feature == kMask) {
          values[i] = (r * 7 + c * 13) % 11 != 0;
        } else {
          const uint16_t b = to_bf16(float(int((r * 7 + c * 13) % 17) - 8) * 0.125f);
          std::memcpy(&values[2 * i], &b, 2);
        }
      }
      CHECK(cudaMalloc(&feature_input, values.size()));
      CHECK(cudaMemcpy(feature_input, values.data(), values.size(), cudaMemcpyHostToDevice));
    }
    if (row.feature == kMask) fa.mask.mask = static_cast<const uint8_t*>(feature_input);
    if (row.feature == kSoftcap) fa.scores.softcap = 30.f;
    if (row.feature == kBias) fa.scores.bias = feature_input;
    if (row.feature == kDropout) {
      fa.scores.dropout_key = dropout_key;
      fa.scores.dropout_threshold = 429496730u;  // rate 0.1 of 2^32
      fa.scores.dropout_keep_scale = 1.f / 0.9f;
      fa.scores.dropout_broadcast = 1;
    }
    const double flops = 4.0 * B * N * double(S) * S * H * (causal ? 0.5 : 1.0);
    const double fwd_us = best_us([&] { return sm90::run_fwd_sm90<DType::kBF16, H>(fa, 0); });
    const uint64_t o_hash = fnv1a(o, n * 2);
    BwdArgs ba{};
    ba.shape = fa.shape;
    ba.mask = fa.mask;
    ba.scale = fa.scale;
    ba.q = q, ba.k = k, ba.v = v, ba.o = o, ba.d_o = d_o, ba.lse = lse;
    ba.dq = dq, ba.dk = dk, ba.dv = dv, ba.delta = delta, ba.dq_accum = dq_accum;
    using BwdCfg = typename sm90::BwdTiles<H>::type;
    const double bwd_us = getenv("AB_FWD_ONLY") || row.feature != kNone ? 0.0 :
        best_us([&] { return sm90::launch_bwd_sm90<DType::kBF16, BwdCfg, sm90::kPlain>(ba, 0); });
    const uint64_t kv_hash = bwd_us > 0 ? fnv1a(dv, n_kv * 2, fnv1a(dk, n_kv * 2)) : 0;
    const std::string mode = std::string(causal ? "causal" : "full") + feature_names[row.feature] +
                             (group > 1 ? "-gqa" + std::to_string(group) : "");
    std::printf("%s D%d S%d %s fwd %.1f us %.1f TFLOP/s %016llx bwd %.1f us %.1f TFLOP/s %016llx\n", tag,
                H, S, mode.c_str(), fwd_us, flops / fwd_us / 1e6,
                static_cast<unsigned long long>(o_hash), bwd_us,
                bwd_us > 0 ? 2.5 * flops / bwd_us / 1e6 : 0.0,
                static_cast<unsigned long long>(kv_hash));
    for (void* p : {q, k, v, o, d_o, dq, dk, dv}) CHECK(cudaFree(p));
    for (float* p : {lse, delta, dq_accum}) CHECK(cudaFree(p));
    if (feature_input != nullptr) CHECK(cudaFree(feature_input));
  }
  return 0;
}
