// Tile shapes of the attention kernels, per head-dim bucket, in one table.
// Every entry fits the smaller sm_80 opt-in shared memory (163 KB per block),
// so the same instantiation serves sm_80 and sm_90 without a per-device
// choice. Registers are the binding limit: each warp owns 16-row MMA slabs
// and keeps its accumulators (O or dK/dV or dQ, plus one score tile) in
// registers, so wider heads get narrower key tiles.
#pragma once
#include "contract/attention.h"

namespace jaxcraft {
namespace attn {

constexpr int kNumBuckets = 6;
// What decides whether two CTAs fit an SM: 64K 32-bit registers (sm_80 and
// sm_90), shared memory per SM on sm_80 (the smaller of the two) and the
// 1 KB the hardware reserves per resident CTA.
constexpr int kRegsPerSm = 64 * 1024;
constexpr int kSmemPerSmSm80 = 164 * 1024;
constexpr int kSmemReservedPerCta = 1024;
constexpr int kMaxHeadDim = kAttentionCudaMaxHeadDim;

// Head dims are computed at the next bucket width with zero padding.
constexpr int head_dim_bucket(int head_dim) {
  return head_dim <= 32 ? 32
         : head_dim <= 64 ? 64
         : head_dim <= 96 ? 96
         : head_dim <= 128 ? 128
         : head_dim <= 192 ? 192
                           : 256;
}

struct AttnTiles {
  // Forward: warps * 16 * m_tiles_per_warp query rows, block_n keys per step.
  int fwd_warps, fwd_block_m, fwd_block_n;
  // Backward dK/dV: block_n keys per CTA, streamed block_m query tiles,
  // q_stages = 2 double-buffers Q/dO when shared memory allows.
  int dkdv_warps, dkdv_block_m, dkdv_block_n, dkdv_q_stages;
  // Deterministic dQ: one 16-row slab per warp, block_n keys per step.
  int dq_warps, dq_block_m, dq_block_n, dq_kv_stages;
};

constexpr AttnTiles attn_tiles(int bucket) {
  // Measured on H200 (bf16, B*S = 16384 tokens, S = 2048, non-causal).
  // Forward: 4 warps own 128 query rows, two 16-row slabs per warp, so every
  // K/V fragment read from shared memory (ldmatrix) feeds 4 MMAs instead of
  // 2; with 16 rows per warp the SM runs out of shared-memory bandwidth long
  // before the tensor cores. Two 4-warp CTAs fit an SM at <= 255 registers
  // and do not synchronize with each other, so one's softmax overlaps the
  // other's MMAs.
  // dK/dV: each warp keeps 16 keys of dK and dV in registers across all query
  // tiles; the key tile sets how often Q/dO/P/dS tiles are re-read per key.
  switch (bucket) {
    // 32: the one bucket where 16-row slabs stay faster (217 TFLOP/s for
    // 64x128 vs 203 for 128x64): per key, a 32-wide head has so little MMA
    // work that the softmax dominates, and the wide key tile amortizes its
    // per-tile bookkeeping. dK/dV 64x64 fits 128 registers, so two 8-warp
    // CTAs share an SM.
    case 32:
      return {4, 64, 128, 8, 64, 64, 2, 4, 64, 64, 2};
    // 64: two slabs x 64 keys, Q fragments in registers (32 regs): 321 vs
    // 254 TFLOP/s for 64x128. dK/dV as for 32 (64x128: same 4.1 ms).
    case 64:
      return {4, 128, 64, 8, 64, 64, 2, 4, 64, 64, 2};
    // 96/128: two slabs of O (2 x 16x128 fp32 = 128 regs); Q is re-read
    // from shared memory each k-step. At H128, 32-key score tiles (2 x 16x32
    // fp32 = 32 regs) leave the compiler room to schedule: 345 TFLOP/s for
    // 128x32 vs 321 for 128x64 and 231 for 64x64. H96 (narrower O) keeps 64
    // keys: 281 for 128x64 vs 217 for 64x64. dK/dV at H128: 128 keys per CTA
    // (each warp 16 keys x all 128 columns of dK and dV, 128 regs) halves the
    // Q/dO/P/dS re-reads per key against 64 keys (dK/dV + atomic dQ 3.50 vs
    // 4.54 ms); Q/dO single-buffered to fit.
    case 96:
      return {4, 128, 64, 8, 64, 64, 2, 4, 64, 64, 2};
    case 128:
      return {4, 128, 32, 8, 64, 128, 1, 4, 64, 64, 2};
    // 192: Q no longer fits in registers and is re-read from shared memory;
    // single-buffered Q/dO keeps the dK/dV CTA under 163 KB; the dQ kernel's
    // 16x192 accumulator leaves room only for 32-key score tiles.
    case 192:
      return {8, 128, 64, 8, 64, 64, 1, 4, 64, 32, 2};
    // 256: a 16x256 O slab alone is 128 regs per thread, so one slab per
    // warp and 32-key score tiles in the forward (281 TFLOP/s vs 273 for
    // 64x64, 230 for 8 warps x 128x32) and 16-key tiles in the dQ kernel; the
    // dK/dV CTA takes 32 keys so each warp holds a 16x64 slice of dK and dV.
    default:
      return {4, 64, 32, 8, 64, 32, 1, 4, 64, 16, 2};
  }
}

}  // namespace attn
}  // namespace jaxcraft
