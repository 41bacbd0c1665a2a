// The host <-> kernel contract for flash attention (CPU and CUDA kernels both
// read it). Plain data only: no XLA, CUDA or nanobind types.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace jaxcraft {

// Which key positions j a query row i may see. All bounds are inclusive and
// already include the causal alignment: with `offset` = 0 (top-left) or
// S - T (bottom-right), row i sees j <= i + offset when causal, and
// i + offset - window_left <= j <= i + offset + window_right when windowed.
struct AttentionMask {
  bool causal = false;
  int64_t offset = 0;
  int64_t window_left = -1;   // -1: unbounded
  int64_t window_right = -1;  // -1: unbounded
  const int32_t* q_lengths = nullptr;   // [B] or null: rows t >= q_len[b] give O = 0
  const int32_t* kv_lengths = nullptr;  // [B] or null: keys s >= kv_len[b] are masked
};

// Contiguous row-major layouts:
//   q, o, do, dq : [B, T, N, H]     k, v, dk, dv : [B, S, K, H]
//   lse, delta   : [B, N, T] float32 (natural log; rows with no visible key: lse = -inf)
// N % K == 0; query head n reads KV head n / (N / K).
struct AttentionShape {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
};

struct AttentionFwdParams {
  AttentionShape shape;
  AttentionMask mask;
  DType dtype = DType::kBF16;  // q, k, v, o all share it
  float scale = 1.f;           // logits = scale * q.k
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
};

struct AttentionBwdParams {
  AttentionShape shape;
  AttentionMask mask;
  DType dtype = DType::kBF16;
  float scale = 1.f;
  bool deterministic = false;  // no float atomics: results bitwise reproducible
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* d_o = nullptr;
  const float* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  // Scratch, provided by the caller as extra XLA outputs (never allocated by
  // the launcher): delta [B, N, T] = rowsum(dO * O); dq_accum [B, T, N, H].
  float* delta = nullptr;
  float* dq_accum = nullptr;
};

}  // namespace jaxcraft
