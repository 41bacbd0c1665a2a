// The host <-> kernel contract for flash attention (the handlers, the CPU and
// the CUDA kernels all read it), and what the CUDA kernels take. No XLA, CUDA
// or nanobind types.
#pragma once
#include <cstdint>
#include <cstdio>

#include "contract/dtype.h"

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

  // Segment ids (both or neither): row i of batch b sees key j only if
  // q_segment_ids[b * T + i] == kv_segment_ids[b * S + j].
  const int32_t* q_segment_ids = nullptr;   // [B, T]
  const int32_t* kv_segment_ids = nullptr;  // [B, S]
  // Tile skipping for segment ids, at kSegmentBlock granularity (present
  // whenever the ids are): segment_key_range[(b * ceil(T / 64) + r) * 2 + {0,1}]
  // = [lo, hi), a key interval that holds every key sharing an id with some
  // row of row block r (lo >= hi: none); segment_query_range[(b * ceil(S / 64)
  // + c) * 2 + {0,1}] likewise holds every row sharing an id with key block c.
  // Exact for sorted ids (packed documents); a superset otherwise.
  const int32_t* segment_key_range = nullptr;    // [B, ceil(T / 64), 2]
  const int32_t* segment_query_range = nullptr;  // [B, ceil(S / 64), 2]

  // Boolean mask (true = visible), broadcastable to [B, N, T, S]: element
  // (b, n, i, j) is mask[b * mask_stride_b + n * mask_stride_n + i * S + j];
  // a stride of 0 broadcasts that axis. n is the query head.
  const uint8_t* mask = nullptr;
  int64_t mask_stride_b = 0, mask_stride_n = 0;
};

constexpr int64_t kSegmentBlock = 64;

// What happens to a logit between q.k and the softmax, in this order:
//   x = scale * q.k;  x = softcap * tanh(x / softcap) if softcap > 0;
//   x += bias[b, n, i, j] (float32 add);  masks;  p = softmax(x);
//   p_used = keep(b, n, i, j) ? p / (1 - dropout_rate) : 0 for P V.
// The logsumexp (lse) is that of x, before dropout.
struct AttentionScores {
  float softcap = 0.f;  // <= 0: none
  // Bias broadcastable to [B, N, T, S], laid out and broadcast like the mask;
  // its dtype is the inputs' dtype, or float32 when bias_f32.
  const void* bias = nullptr;
  bool bias_f32 = false;
  int64_t bias_stride_b = 0, bias_stride_n = 0;
  // Dropout (math/philox.h): rate in [0, 1); key = two uint32 words in
  // device (CUDA) or host (CPU) memory; broadcast: one keep-mask for all
  // batch rows and heads (Flax's broadcast_dropout), i.e. b = n = 0 in the RNG.
  float dropout_rate = 0.f;
  const uint32_t* dropout_key = nullptr;
  bool dropout_broadcast = false;
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
  AttentionScores scores;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  // Optional scratch of one uint32 (attn::FwdArgs::tile_counter): the
  // Hopper kernel's persistent CTAs then take their work units from it.
  uint32_t* tile_counter = nullptr;
};

struct AttentionBwdParams {
  AttentionShape shape;
  AttentionMask mask;
  DType dtype = DType::kBF16;
  float scale = 1.f;
  bool deterministic = false;  // no float atomics: results bitwise reproducible
  AttentionScores scores;
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
  // d(loss)/d(bias), laid out and broadcast like the bias (null when there is
  // no bias). float32 when dbias_f32, else the bias's own 16-bit dtype, which
  // needs one writer per element (dbias_shared false). With a broadcast axis
  // (stride 0) several (b, n) add into one element (atomics on CUDA; callers
  // wanting bitwise results pass an unbroadcast bias when deterministic).
  // The bias's dtype saves the f32 write and the cast after it: for a
  // [1, N, T, S] bias that is most of the backward's extra traffic.
  void* dbias = nullptr;
  bool dbias_f32 = true;
};

// Whether several (b, n) share a bias element: it broadcasts over a batch or
// head axis of size > 1.
inline bool dbias_shared(const AttentionScores& s, const AttentionShape& shape) {
  return (s.bias_stride_b == 0 && shape.batch > 1) || (s.bias_stride_n == 0 && shape.num_heads > 1);
}

// What the CUDA kernels take. Sequence lengths and |offset| up to 2^28 keep
// every index sum of the mask inside int32; batch and heads index gridDim.y
// and gridDim.z. Python asks this (jaxcraft._jaxcraft.attention_cuda_unsupported)
// before it picks the kernels, and the handlers before they launch them.
constexpr int kAttentionCudaMaxHeadDim = 256;
constexpr int kAttentionCudaHeadDimMultiple = 8;
constexpr int64_t kAttentionCudaMaxSeqLen = int64_t(1) << 28;
constexpr int64_t kAttentionCudaMaxGridYZ = 65535;

// Why the CUDA attention kernels cannot take this input, or null.
inline const char* attention_cuda_unsupported(const AttentionShape& s, DType dtype) {
  thread_local char why[160];
  if (dtype == DType::kF32)
    return "the CUDA attention kernels take bfloat16 or float16 (float32 inputs use the reference)";
  if (dtype != DType::kBF16 && dtype != DType::kF16) return "unknown dtype";
  if (s.batch < 0 || s.seqlen_q < 0 || s.seqlen_k < 0 || s.num_heads < 0 || s.num_kv_heads < 0)
    return "negative dimension";
  if (s.head_dim <= 0 || s.head_dim > kAttentionCudaMaxHeadDim ||
      s.head_dim % kAttentionCudaHeadDimMultiple != 0) {
    std::snprintf(why, sizeof why,
                  "the CUDA attention kernels need a head dim <= %d and a multiple of %d; got %lld",
                  kAttentionCudaMaxHeadDim, kAttentionCudaHeadDimMultiple,
                  static_cast<long long>(s.head_dim));
    return why;
  }
  if (s.num_kv_heads == 0 ? s.num_heads != 0 : s.num_heads % s.num_kv_heads != 0)
    return "num_heads is not a multiple of num_kv_heads";
  if (s.seqlen_q > kAttentionCudaMaxSeqLen || s.seqlen_k > kAttentionCudaMaxSeqLen)
    return "the CUDA attention kernels take sequences up to 2^28";
  if (s.batch > kAttentionCudaMaxGridYZ || s.num_heads > kAttentionCudaMaxGridYZ)
    return "the CUDA attention kernels take a batch and a head count up to 65535";
  return nullptr;
}

}  // namespace jaxcraft
