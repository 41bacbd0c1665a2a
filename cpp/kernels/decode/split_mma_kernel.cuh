// Split-K decode attention on tensor cores (bf16 / f16, sm_80+).
//
// One CTA = (sequence b, KV head kh, split, chunk of 16 query rows). The 16
// rows are G query heads x Tq tokens of the KV head's group, padded with
// zero rows, so every K/V tile is read once for the whole group. K/V tiles
// of kBlockN keys stream through a kStages-deep cp.async ring; each of the
// four warps owns 16 keys of every tile and keeps its own online softmax:
//   S = Q K^T           (m16n8k16, Q from shared memory, 2 n-tiles of 8 keys)
//   mask, scale, soft cap; row max over the warp's keys; P = exp2(S - max)
//   O = O * correction + P V   (P re-used from S's registers as the A operand)
// The four warps' states are merged once at the end (epilogue.cuh).
#pragma once
#include "kernels/decode/device.cuh"
#include "kernels/decode/epilogue.cuh"

namespace jaxcraft {
namespace decode {

template <typename T, int kHeadDim>
struct MmaConfig {
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kRows = 16;          // one m16 tile of query rows per CTA
  static constexpr int kKeysPerWarp = 16;   // one k16 step of P V
  static constexpr int kBlockN = kWarps * kKeysPerWarp;
  static constexpr int kChunks = kHeadDim * int(sizeof(T)) / kCpAsyncBytes;  // 16-byte chunks per row
  // Bytes in flight: H100 needs ~25 KiB per SM to cover HBM latency. At 32 KiB
  // of K+V per tile (D128), 3 stages (~100 KiB) keep 2 tiles in flight and let
  // 2 CTAs share an SM (227 KiB); D64 tiles are half as large (4 stages);
  // D256 tiles are 64 KiB, so 2 stages and one CTA per SM. (Measured at D128:
  // 2 stages with 3 CTAs per SM within 1%; 4 stages with one CTA 30% slower.)
  static constexpr int kStages = kHeadDim <= 64 ? 4 : (kHeadDim <= 128 ? 3 : 2);
  static constexpr int kTileElems = kBlockN * kHeadDim;
  static constexpr int kRowsPerPass = kThreads / kChunks;  // tile rows one loader pass covers
  static constexpr int kLoadsPerThread = kBlockN / kRowsPerPass;
  using Epi = Epilogue<T, kWarps, kRows, kHeadDim, kThreads>;

  static constexpr size_t kKvBytes = 2 * size_t(kStages) * kTileElems * sizeof(T);
  static constexpr size_t kQBytes = size_t(kRows) * kHeadDim * sizeof(T);
  static constexpr size_t kOkBytes = size_t(kStages) * kBlockN;
  static constexpr size_t kSmemBytes = kKvBytes + kQBytes + kOkBytes;
  static_assert(kChunks >= 8, "the XOR swizzle permutes 8 chunks per row");
  static_assert(kThreads % kChunks == 0 && kBlockN % kRowsPerPass == 0, "loader mapping");
  static_assert(Epi::kSmemBytes <= kKvBytes, "the epilogue reuses the K/V ring");

  // Element offset of (row, 16-byte chunk) in a row-major tile of kHeadDim
  // columns. ldmatrix reads one chunk column of 8 consecutive rows; XOR-ing
  // the chunk with the row puts those 8 reads in 8 different bank groups.
  __device__ static int swizzle(int row, int chunk) {
    return row * kHeadDim + ((chunk ^ (row & 7)) * (kCpAsyncBytes / int(sizeof(T))));
  }
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(MmaConfig<T, kHeadDim>::kThreads, 1)
    decode_split_mma_kernel(const __grid_constant__ DecodeArgs a) {
  using Cfg = MmaConfig<T, kHeadDim>;
  constexpr int kStages = Cfg::kStages, kBlockN = Cfg::kBlockN, kRows = Cfg::kRows;
  constexpr int kElemsPerChunk = kCpAsyncBytes / int(sizeof(T));
  constexpr int kDimTiles = kHeadDim / 8;  // n8 tiles of the output
  extern __shared__ __align__(128) unsigned char smem[];
  T* s_k = reinterpret_cast<T*>(smem);
  T* s_v = s_k + kStages * Cfg::kTileElems;
  T* s_q = s_v + kStages * Cfg::kTileElems;
  uint8_t* s_ok = reinterpret_cast<uint8_t*>(s_q + kRows * kHeadDim);  // key's page is valid
  __shared__ typename Cfg::Epi::Stats stats;

  const DecodeParams& p = a.p;
  // Row chunks vary fastest: the CTAs that read the same K/V run together
  // and share it through L2.
  int64_t cta = blockIdx.x;
  const int chunk = static_cast<int>(cta % a.row_chunks);
  cta /= a.row_chunks;
  const int split = static_cast<int>(cta % a.num_splits);
  cta /= a.num_splits;
  const int kh = static_cast<int>(cta % p.num_kv_heads);
  const int b = static_cast<int>(cta / p.num_kv_heads);
  const int row0 = chunk * kRows;

  const SeqSpan span = seq_span(p, b);
  int tile_begin, tile_end;
  split_tiles<kBlockN>(span, split, a.num_splits, tile_begin, tile_end);
  const int num_tiles = tile_end - tile_begin;
  const int head_dim = static_cast<int>(p.head_dim);
  const int64_t kv_row_elems = p.num_kv_heads * p.head_dim;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k) + static_cast<int64_t>(kh) * head_dim;
  const T* v = static_cast<const T*>(p.v) + static_cast<int64_t>(kh) * head_dim;

  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;

  // Q rows of this chunk (zeros past the group or past head_dim).
  const int group_rows = static_cast<int>(p.seqlen_q * a.group.divisor);
  for (int i = tid; i < kRows * Cfg::kChunks; i += Cfg::kThreads) {
    const int r = i / Cfg::kChunks, c = i % Cfg::kChunks;
    const bool ok = row0 + r < group_rows && c * kElemsPerChunk < head_dim;
    const T* src = ok ? q + q_offset(a, b, kh, row0 + r) + c * kElemsPerChunk : q;
    cp_async_16(smem_u32(s_q + Cfg::swizzle(r, c)), src, ok);
  }

  // Loader: thread tid copies chunk ld_chunk of tile rows ld_row + i * kRowsPerPass.
  // Page entries are read one tile ahead (pages[]) so their latency overlaps the math.
  const int ld_chunk = tid % Cfg::kChunks, ld_row = tid / Cfg::kChunks;
  int pages[Cfg::kLoadsPerThread];
  auto lookup = [&](int tile) {
#pragma unroll
    for (int i = 0; i < Cfg::kLoadsPerThread; ++i) {
      const int j = tile * kBlockN + ld_row + i * Cfg::kRowsPerPass;
      pages[i] = j < span.length ? page_of(a, b, j) : -1;
    }
  };
  auto issue = [&](int tile, int stage) {
#pragma unroll
    for (int i = 0; i < Cfg::kLoadsPerThread; ++i) {
      const int r = ld_row + i * Cfg::kRowsPerPass;
      const int j = tile * kBlockN + r;
      const int row = j < span.length ? cache_row(a, pages[i], j) : -1;
      const bool ok = row >= 0 && ld_chunk * kElemsPerChunk < head_dim;
      const int64_t off = static_cast<int64_t>(row) * kv_row_elems + ld_chunk * kElemsPerChunk;
      const int dst = stage * Cfg::kTileElems + Cfg::swizzle(r, ld_chunk);
      cp_async_16(smem_u32(s_k + dst), ok ? k + off : k, ok);
      cp_async_16(smem_u32(s_v + dst), ok ? v + off : v, ok);
      if (ld_chunk == 0) s_ok[stage * kBlockN + r] = row >= 0;
    }
  };

  if (num_tiles > 0) lookup(tile_begin);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) {
      issue(tile_begin + s, s);
      if (s + 1 < num_tiles) lookup(tile_begin + s + 1);
    }
    cp_async_commit();  // always: the wait below counts groups
  }

  // This lane's two rows (g and g + 8 of the m16 tile) and their key windows.
  const int g = lane / 4, tig = lane % 4;
  const RowWindow windows[2] = {row_window(a, span, row0 + g), row_window(a, span, row0 + g + 8)};
  float o[kDimTiles][4] = {};
  float row_max[2] = {kNegInf, kNegInf};
  float row_sum[2] = {0.f, 0.f};
  // ldmatrix.x4 address roles: lane supplies row (lane % 8) of matrix lane / 8.
  const int mat = lane / 8, mat_row = lane % 8;
  const int key0 = warp * Cfg::kKeysPerWarp;

  for (int n = 0; n < num_tiles; ++n) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile n landed for all threads; tile n - 1's stage is free
    const int next = n + kStages - 1;
    if (next < num_tiles) {
      issue(tile_begin + next, next % kStages);
      if (next + 1 < num_tiles) lookup(tile_begin + next + 1);
    }
    cp_async_commit();

    const int stage = n % kStages;
    const T* sk = s_k + stage * Cfg::kTileElems;
    const T* sv = s_v + stage * Cfg::kTileElems;

    // S = Q K^T for the warp's 16 keys: two n8 tiles.
    float s[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      if (ks * 16 >= head_dim) break;  // padded head dims are zeros
      uint32_t qa[4], kb[4];
      ldmatrix_x4(qa, smem_u32(s_q + Cfg::swizzle((mat % 2) * 8 + mat_row, ks * 2 + mat / 2)));
      ldmatrix_x4(kb, smem_u32(sk + Cfg::swizzle(key0 + (mat / 2) * 8 + mat_row, ks * 2 + mat % 2)));
      mma_16816<T>(s[0], qa, kb[0], kb[1]);
      mma_16816<T>(s[1], qa, kb[2], kb[3]);
    }

    // Mask, scale (log2 units), and the row max over the warp's keys.
    const int tile_key0 = (tile_begin + n) * kBlockN;
    float tile_max[2] = {kNegInf, kNegInf};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + tig * 2 + e % 2;
        const int j = tile_key0 + key;
        const RowWindow& w = windows[e / 2];
        const bool visible = s_ok[stage * kBlockN + key] && j >= w.lo && j <= w.hi;
        s[nt][e] = visible ? scaled_logit(p, s[nt][e]) : kNegInf;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
      }
    }
    float correction[2], base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      const float new_max = fmaxf(row_max[i], tile_max[i]);
      // A row with no visible key yet keeps max -inf; subtract 0 instead so
      // exp2 gives 0, not NaN.
      base[i] = new_max == kNegInf ? 0.f : new_max;
      correction[i] = exp2f(row_max[i] - base[i]);
      row_max[i] = new_max;
    }
    float tile_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - base[e / 2]);
        tile_sum[e / 2] += s[nt][e];
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) row_sum[i] = row_sum[i] * correction[i] + tile_sum[i];
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt) {
      o[dt][0] *= correction[0];
      o[dt][1] *= correction[0];
      o[dt][2] *= correction[1];
      o[dt][3] *= correction[1];
    }

    // O += P V: the S accumulators of the two n8 tiles are P's A fragment.
    const uint32_t pa[4] = {pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][2], s[0][3]),
                            pack2<T>(s[1][0], s[1][1]), pack2<T>(s[1][2], s[1][3])};
#pragma unroll
    for (int dp = 0; dp < kHeadDim / 16; ++dp) {
      if (dp * 16 >= head_dim) break;
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, smem_u32(sv + Cfg::swizzle(key0 + (mat % 2) * 8 + mat_row, dp * 2 + mat / 2)));
      mma_16816<T>(o[2 * dp], pa, vb[0], vb[1]);
      mma_16816<T>(o[2 * dp + 1], pa, vb[2], vb[3]);
    }
  }

  // Each lane summed its own columns: total the quad's.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the K/V ring: the epilogue reuses it
  float* s_o = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float* dst = Cfg::Epi::o_slot(s_o, warp, g + 8 * half) + dt * 8 + tig * 2;
      *reinterpret_cast<float2*>(dst) = make_float2(o[dt][2 * half], o[dt][2 * half + 1]);
    }
  }
  if (tig == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      stats.max[warp * kRows + g + 8 * half] = row_max[half];
      stats.sum[warp * kRows + g + 8 * half] = row_sum[half];
    }
  }
  Cfg::Epi::run(a, b, kh, split, row0, s_o, stats);
}

}  // namespace decode
}  // namespace jaxcraft
