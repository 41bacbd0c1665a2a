// Split-K decode attention on tensor cores (bf16 / f16, sm_80+).
//
// One CTA = (sequence b, KV head kh, split, chunk of 16 query rows). The 16
// rows are G query heads x Tq tokens of the KV head's group, padded with
// zero rows, so every K/V tile is read once for the whole group. K/V tiles
// of kBlockN keys stream through a kStages-deep cp.async ring; each of the
// four warps owns 16 keys of every tile and keeps its own online softmax:
//   S = Q K^T           (m16n8k16, Q in registers up to D128, 2 n-tiles of 8 keys)
//   the per-key mask, only on tiles at the span's edges (or with a bad page)
//   P = exp2(S * scale - max), O rescaled only when the max grows
//       (attention/softmax.cuh, the portable attention kernels' softmax)
//   O += P V            (P re-used from S's registers as the A operand)
// The four warps' states are merged once at the end (epilogue.cuh).
// Every instruction in the tile loop delays the next tile's loads (two warps
// per scheduler): Nsight Compute showed the kernel issuing 3x the
// instructions of cuDNN's decode kernel at the same grid and occupancy.
#pragma once
#include <type_traits>

#include "kernels/attention/mma_sm80.cuh"
#include "kernels/attention/softmax.cuh"
#include "kernels/decode/device.cuh"
#include "kernels/decode/epilogue.cuh"

namespace jaxcraft {
namespace decode {

// How the loader addresses the cache (the launcher picks it per call, see
// kv_layout; one kernel per layout keeps the others' code out of its loop).
enum class KvLayout {
  kContiguous,  // [B, S, K, H]
  kTilePages,   // pages of whole key tiles: one table entry per tile
  kPassPages,   // power-of-two pages of whole loader passes: one entry per pass
  kRowPages,    // other page sizes: one entry per row
};

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
  // 4 stages with one CTA 30% slower; 2 stages with 3 CTAs per SM within 1%
  // before the instruction diet, 1-5% slower after it.)
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

  static KvLayout kv_layout(const DecodeParams& p) {
    if (!p.paged) return KvLayout::kContiguous;
    if (p.page_size % kBlockN == 0) return KvLayout::kTilePages;
    const bool power_of_two = (p.page_size & (p.page_size - 1)) == 0;
    if (power_of_two && p.page_size % kRowsPerPass == 0) return KvLayout::kPassPages;
    return KvLayout::kRowPages;
  }
};

template <typename T, int kHeadDim, KvLayout kLayout>
__global__ void __launch_bounds__(MmaConfig<T, kHeadDim>::kThreads, 1)
    decode_split_mma_kernel(const __grid_constant__ DecodeArgs a) {
  using Cfg = MmaConfig<T, kHeadDim>;
  constexpr DType kDt = std::is_same_v<T, __nv_bfloat16> ? DType::kBF16 : DType::kF16;
  constexpr int kStages = Cfg::kStages, kBlockN = Cfg::kBlockN, kRows = Cfg::kRows;
  constexpr int kElemsPerChunk = kCpAsyncBytes / int(sizeof(T));
  constexpr int kDimTiles = kHeadDim / 8;  // n8 tiles of the output
  constexpr int kDimSteps = kHeadDim / 16;  // k16 steps of Q K^T, k16 column pairs of P V
  extern __shared__ __align__(128) unsigned char smem[];
  T* s_k = reinterpret_cast<T*>(smem);
  T* s_v = s_k + kStages * Cfg::kTileElems;
  T* s_q = s_v + kStages * Cfg::kTileElems;
  uint8_t* s_ok = reinterpret_cast<uint8_t*>(s_q + kRows * kHeadDim);  // key's page is valid
  __shared__ typename Cfg::Epi::Stats stats;
  // Per stage: the index of the last tile loaded into it that named a page
  // outside the cache for a key inside the sequence (only then does a tile
  // away from the span's edges need the per-key mask). Tile indices never
  // repeat within a CTA, so the tags need no reset after the first (-1).
  __shared__ int s_bad_tile[kStages];

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
  const int head_dim = static_cast<int>(p.head_dim);
  const int64_t kv_row_elems = p.num_kv_heads * p.head_dim;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k) + static_cast<int64_t>(kh) * head_dim;
  const T* v = static_cast<const T*>(p.v) + static_cast<int64_t>(kh) * head_dim;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int seq_row0 = b * static_cast<int>(p.page_size);  // contiguous: sequence b's first row

  // Every global access below waits for the kernel before it; the combine
  // may begin launching at once.
  wait_for_prior_grid();
  allow_dependent_grids();

  const SeqSpan span = seq_span(p, b);
  int tile_begin, tile_end;
  split_tiles<kBlockN>(span, split, a.num_splits, tile_begin, tile_end);
  const int num_tiles = tile_end - tile_begin;

  // Q rows of this chunk (zeros past the group or past head_dim): their own
  // commit group, read into registers before the first tile.
  const int group_rows = static_cast<int>(p.seqlen_q * a.group.divisor);
  for (int i = tid; i < kRows * Cfg::kChunks; i += Cfg::kThreads) {
    const int r = i / Cfg::kChunks, c = i % Cfg::kChunks;
    const bool ok = row0 + r < group_rows && c * kElemsPerChunk < head_dim;
    const T* src = ok ? q + q_offset(a, b, kh, row0 + r) + c * kElemsPerChunk : q;
    cp_async_16(smem_u32(s_q + Cfg::swizzle(r, c)), src, ok);
  }
  cp_async_commit();
  if (tid < kStages) s_bad_tile[tid] = -1;
  __syncthreads();  // the tags are set before any loader may write one

  // Loader: thread tid copies chunk ld_chunk of tile rows ld_row + i * kRowsPerPass
  // (columns past head_dim and keys outside the cache are zero-filled). A
  // paged cache's page entries are read one tile ahead (pages[]) so that the
  // table loads' latency overlaps the math. A table load and an address per
  // row were most of the paged loader's instructions, so rows share them
  // where the page size allows (KvLayout, chosen by the launcher): a page of
  // whole tiles needs one entry per tile (pages[0]), whose rows are then
  // consecutive cache rows, addressed as a contiguous cache's; a page of
  // whole loader passes whose size is a power of two (vLLM's 16 at D128)
  // needs one entry per pass, placed in its page by a shift and a mask.
  const int ld_chunk = tid % Cfg::kChunks, ld_row = tid / Cfg::kChunks;
  const bool chunk_ok = ld_chunk * kElemsPerChunk < head_dim;
  const int64_t pass_elems = Cfg::kRowsPerPass * kv_row_elems;
  constexpr bool kTilePages = kLayout == KvLayout::kTilePages;
  int pages[Cfg::kLoadsPerThread];
  auto lookup = [&](int tile) {
    if constexpr (kLayout == KvLayout::kContiguous) {
      return;
    } else if constexpr (kTilePages) {
      pages[0] = tile * kBlockN < span.length ? page_of(a, b, tile * kBlockN) : -1;
    } else {
      const int32_t* table = p.block_tables + static_cast<int64_t>(b) * p.max_pages;
#pragma unroll
      for (int i = 0; i < Cfg::kLoadsPerThread; ++i) {
        const int pass = tile * kBlockN + i * Cfg::kRowsPerPass;  // the pass's first key
        if constexpr (kLayout == KvLayout::kPassPages) {
          pages[i] = pass < span.length ? __ldg(table + (pass >> a.page_shift)) : -1;
        } else {
          const int j = pass + ld_row;
          pages[i] = j < span.length ? page_of(a, b, j) : -1;
        }
      }
    }
  };
  // One 16-byte chunk of tile row r for K and V, `off` elements into the
  // cache; zeros unless the row is in the cache and the chunk inside head_dim.
  auto copy = [&](int stage, int r, int64_t off, bool row_ok) {
    const bool ok = row_ok && chunk_ok;
    const int dst = stage * Cfg::kTileElems + Cfg::swizzle(r, ld_chunk);
    cp_async_16(smem_u32(s_k + dst), ok ? k + off : k, ok);
    cp_async_16(smem_u32(s_v + dst), ok ? v + off : v, ok);
    if (ld_chunk == 0) s_ok[stage * kBlockN + r] = row_ok;
  };
  auto issue = [&](int tile, int stage) {
    const int j0 = tile * kBlockN + ld_row;
    if constexpr (kLayout == KvLayout::kContiguous || kTilePages) {
      // The thread's rows are kRowsPerPass apart in the cache.
      int first_row = seq_row0 + j0;  // the cache row of key j0
      bool page_ok = true;
      if constexpr (kTilePages) {
        const int row = cache_row(a, pages[0], j0);  // -1: the entry names no page of the cache
        page_ok = row >= 0;
        first_row = page_ok ? row : 0;
        if (!page_ok && tile * kBlockN < span.length) s_bad_tile[stage] = tile;
      }
      const int64_t off0 = static_cast<int64_t>(first_row) * kv_row_elems + ld_chunk * kElemsPerChunk;
#pragma unroll
      for (int i = 0; i < Cfg::kLoadsPerThread; ++i)
        copy(stage, ld_row + i * Cfg::kRowsPerPass, off0 + i * pass_elems,
             page_ok && j0 + i * Cfg::kRowsPerPass < span.length);
    } else {
      bool bad = false;
#pragma unroll
      for (int i = 0; i < Cfg::kLoadsPerThread; ++i) {
        const int j = j0 + i * Cfg::kRowsPerPass;
        int row;  // -1: the entry names no page of the cache
        if constexpr (kLayout == KvLayout::kPassPages) {
          const int in_page = (j - ld_row) & (static_cast<int>(p.page_size) - 1);
          row = static_cast<uint32_t>(pages[i]) < static_cast<uint32_t>(p.num_pages)
                    ? (pages[i] << a.page_shift) + in_page + ld_row
                    : -1;
        } else {
          row = cache_row(a, pages[i], j);
        }
        bad |= row < 0 && j < span.length;
        copy(stage, ld_row + i * Cfg::kRowsPerPass,
             static_cast<int64_t>(row) * kv_row_elems + ld_chunk * kElemsPerChunk,
             row >= 0 && j < span.length);  // a pass's entry also covers rows past the length
      }
      if (bad) s_bad_tile[stage] = tile;  // every writer writes the same value
    }
  };

  if (num_tiles > 0) lookup(tile_begin);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) {
      issue(tile_begin + s, s);
      if (s + 1 < num_tiles) lookup(tile_begin + s + 1);
    }
    cp_async_commit();  // always: the waits below count groups
  }

  // ldmatrix.x4 address roles: lane supplies row (lane % 8) of matrix lane / 8.
  const int mat = lane / 8, mat_row = lane % 8;
  cp_async_wait<kStages - 1>();  // the Q group
  __syncthreads();
  // Q's A fragments stay in registers, except at D256 where the O
  // accumulator alone takes 128 registers per thread (keeping Q too spilled):
  // there each k16 step re-reads its fragment from shared memory.
  constexpr bool kQInRegs = kHeadDim <= 128;
  auto load_q = [&](uint32_t(&f)[4], int ks) {
    attn::ldmatrix_x4(f, smem_u32(s_q + Cfg::swizzle((mat % 2) * 8 + mat_row, ks * 2 + mat / 2)));
  };
  uint32_t qa[kQInRegs ? kDimSteps : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) load_q(qa[ks], ks);
  }

  // This lane's two rows (g and g + 8 of the m16 tile) and their key windows.
  const int g = lane / 4, tig = lane % 4;
  const RowWindow windows[2] = {row_window(a, span, row0 + g), row_window(a, span, row0 + g + 8)};
  // Keys [lo_max, hi_min] are visible to every row of the chunk: a tile inside
  // them needs no per-key mask. Rows are t * G + head; the chunk's first row
  // has the smallest t (the lowest hi), its last row the largest (the highest lo).
  const int t_first = static_cast<int>(a.group.div(static_cast<uint32_t>(row0)));
  const int t_last =
      static_cast<int>(a.group.div(static_cast<uint32_t>(min(row0 + kRows, group_rows) - 1)));
  const int hi_min = span.length - static_cast<int>(p.seqlen_q) + t_first;
  const int lo_max = p.window_left >= 0
                         ? span.length - static_cast<int>(p.seqlen_q) + t_last -
                               static_cast<int>(p.window_left)
                         : 0;
  // The softmax scales inside its exponent (one FFMA per score) unless the
  // logits need more than a positive factor: a soft cap, or a scale <= 0.
  const bool prescale = p.soft_cap > 0.f || p.scale <= 0.f;
  const float softmax_scale = prescale ? kLog2e : p.scale * kLog2e;

  float o[1][kDimTiles][4] = {};
  float row_max[1][2] = {{kNegInf, kNegInf}};
  float row_sum[1][2] = {{0.f, 0.f}};
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
    float s[1][2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      if constexpr (!kQInRegs) load_q(qa[0], ks);
      const uint32_t(&qf)[4] = qa[kQInRegs ? ks : 0];
      uint32_t kb[4];
      attn::ldmatrix_x4(kb, smem_u32(sk + Cfg::swizzle(key0 + (mat / 2) * 8 + mat_row, ks * 2 + mat % 2)));
      attn::mma_16816<kDt>(s[0][0], qf, kb[0], kb[1]);
      attn::mma_16816<kDt>(s[0][1], qf, kb[2], kb[3]);
    }

    if (prescale) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[0][nt][e] = logit(p, s[0][nt][e]);
    }
    const int tile_key0 = (tile_begin + n) * kBlockN;
    const bool edge = tile_key0 < lo_max || tile_key0 + kBlockN - 1 > hi_min ||
                      s_bad_tile[stage] == tile_begin + n;
    if (edge) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + nt * 8 + tig * 2 + e % 2;
          const int j = tile_key0 + key;
          const RowWindow& w = windows[e / 2];
          const bool visible = s_ok[stage * kBlockN + key] && j >= w.lo && j <= w.hi;
          if (!visible) s[0][nt][e] = kNegInf;
        }
      }
    }
    attn::online_softmax(s, o, row_max, row_sum, softmax_scale);

    // O += P V: the S accumulators of the two n8 tiles are P's A fragment.
    uint32_t pa[4];
    attn::acc_to_a<kDt>(pa, s[0][0], s[0][1]);
#pragma unroll
    for (int dp = 0; dp < kDimSteps; ++dp) {
      uint32_t vb[4];
      attn::ldmatrix_x4_trans(vb, smem_u32(sv + Cfg::swizzle(key0 + (mat % 2) * 8 + mat_row, dp * 2 + mat / 2)));
      attn::mma_16816<kDt>(o[0][2 * dp], pa, vb[0], vb[1]);
      attn::mma_16816<kDt>(o[0][2 * dp + 1], pa, vb[2], vb[3]);
    }
  }

  // Each lane summed its own columns: total the quad's.
  const float sums[2] = {attn::quad_sum(row_sum[0][0]), attn::quad_sum(row_sum[0][1])};
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the K/V ring: the epilogue reuses it
  float* s_o = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // Padding rows (the chunk past its group's G x Tq) are never read:
      // at G x Tq = 4 three quarters of the stores.
      if (row0 + g + 8 * half >= group_rows) continue;
      float* dst = Cfg::Epi::o_slot(s_o, warp, g + 8 * half) + dt * 8 + tig * 2;
      *reinterpret_cast<float2*>(dst) = make_float2(o[0][dt][2 * half], o[0][dt][2 * half + 1]);
    }
  }
  if (tig == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      stats.max[warp * kRows + g + 8 * half] = row_max[0][half];
      stats.sum[warp * kRows + g + 8 * half] = sums[half];
    }
  }
  Cfg::Epi::run(a, b, kh, split, row0, s_o, stats);
}

}  // namespace decode
}  // namespace jaxcraft
