// Blocked flash attention on the host.
//
// Forward: each work item is one (batch, head, Q block). It streams the KV
// blocks that the block's rows can see, keeping a running row max, row sum
// and output accumulator in fp32 (online softmax), so no T x S buffer exists.
//
// A query row meets a K/V tile as one row of logits, and the score changes
// of contract/attention.h (soft cap, bias, segment ids, boolean mask, dropout) are
// passes over that row, each taken or skipped once per row: attention
// without them runs the plain loops.
//
// Backward: P is recomputed from Q, K and the forward lse. dK/dV and dQ are
// computed by two separate passes so that every output element has exactly
// one writer (no atomics, bitwise reproducible):
//   * dK/dV: one item per (batch, KV head, KV block), looping over the query
//     heads of its group and over the Q blocks that see the KV block;
//   * dQ: one item per (batch, head, Q block), looping over its KV blocks.
// dbias (= dS, summed over broadcast axes) keeps that rule: the dK/dV items
// write it when each bias element belongs to one of them; a bias that items
// share (broadcast over batch rows, or over heads of different KV heads)
// gets a third pass, one item per bias tile.
#include "cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "common/cpu/host_float.h"
#include "cpu/blocked.h"
#include "cpu/row_convert.h"
#include "math/philox.h"

namespace jaxcraft {
namespace {

using namespace cpu;  // NOLINT: the shared row arithmetic and threading

// A kBlockK x H float tile of K and of V (32 KiB each at H = 128), the Q and
// accumulator tiles and a row of logits stay within a core's L2 cache.
constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;

// ---------------------------------------------------------------------------
// Tiles: rows of a [B, L, heads, H] tensor for fixed (b, head) are `heads * H`
// elements apart. They are converted to float once per tile, not per use.

template <typename Elem>
void load_rows(const Elem* src, int64_t stride, int64_t rows, int64_t head_dim, float* dst) {
  for (int64_t r = 0; r < rows; ++r) load_row(src + r * stride, head_dim, dst + r * head_dim);
}

// The same rows transposed: element h of row r to dst[h * ld + r].
template <typename Elem>
void load_rows_transposed(const Elem* src, int64_t stride, int64_t rows, int64_t head_dim,
                          int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const Elem* in = src + r * stride;
    for (int64_t h = 0; h < head_dim; ++h) dst[h * ld + r] = to_float(in[h]);
  }
}

// Element strides of the contiguous layouts in contract/attention.h.
struct Layout {
  int64_t B, T, S, N, K, H;
  int64_t group;  // query heads per KV head

  explicit Layout(const AttentionShape& s)
      : B(s.batch), T(s.seqlen_q), S(s.seqlen_k), N(s.num_heads), K(s.num_kv_heads),
        H(s.head_dim), group(s.num_kv_heads > 0 ? s.num_heads / s.num_kv_heads : 1) {}

  int64_t q_row_stride() const { return N * H; }
  int64_t k_row_stride() const { return K * H; }
  int64_t q_index(int64_t b, int64_t t, int64_t n) const { return ((b * T + t) * N + n) * H; }
  int64_t k_index(int64_t b, int64_t s, int64_t kh) const { return ((b * S + s) * K + kh) * H; }
  int64_t lse_index(int64_t b, int64_t n, int64_t t) const { return (b * N + n) * T + t; }
  int64_t num_q_blocks() const { return ceil_div(T, kBlockQ); }
  int64_t num_k_blocks() const { return ceil_div(S, kBlockK); }
};

// Workers number their items (b * heads + head) * blocks + block (consecutive
// items are blocks of one batch row and head); this is the inverse.
struct WorkItem {
  int64_t b, head, block;
};

WorkItem split_item(int64_t item, int64_t heads, int64_t blocks) {
  return {item / (blocks * heads), (item / blocks) % heads, item % blocks};
}

// Query row i of batch b and query head n against the K/V tile whose first
// key is j0: the row's tile column c is key j0 + c.
struct TileRow {
  int64_t b, n, i, j0;
};

// ---------------------------------------------------------------------------
// Masking. Every bound in AttentionMask but the element masks (segment ids,
// boolean mask) is a lower or an upper limit on the key index, so the keys a
// row may see lie in one half-open interval [begin, end); the element masks
// then hide single keys inside it (ScoreMods).

KeyRange intersect(KeyRange a, KeyRange b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

class MaskRanges {
 public:
  MaskRanges(const AttentionMask& mask, int64_t seqlen_q, int64_t seqlen_k)
      : mask_(mask), seqlen_q_(seqlen_q), seqlen_k_(seqlen_k) {}

  KeyRange row(int64_t b, int64_t i) const {
    if (mask_.q_lengths != nullptr && i >= mask_.q_lengths[b]) return {};
    int64_t end = seqlen_k_;
    if (mask_.kv_lengths != nullptr) end = std::min<int64_t>(end, mask_.kv_lengths[b]);
    const int64_t diagonal = i + mask_.offset;
    if (mask_.causal) end = std::min(end, diagonal + 1);
    if (mask_.window_right >= 0) end = std::min(end, diagonal + mask_.window_right + 1);
    int64_t begin = 0;
    if (mask_.window_left >= 0) begin = std::max(begin, diagonal - mask_.window_left);
    return intersect({begin, end}, segment_span(mask_.segment_key_range, b, seqlen_q_, i, i + 1,
                                                seqlen_k_));
  }

  // Smallest interval holding the keys seen by any of rows [i0, i1): used to
  // skip KV blocks, so it may over- but never under-approximate.
  KeyRange rows(int64_t b, int64_t i0, int64_t i1) const {
    KeyRange span{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
    for (int64_t i = i0; i < i1; ++i) {
      const KeyRange r = row(b, i);
      if (r.empty()) continue;
      span.begin = std::min(span.begin, r.begin);
      span.end = std::max(span.end, r.end);
    }
    return span.empty() ? KeyRange{} : span;
  }

  // Rows that may see some key in [j0, j1), as segment ids allow (the other
  // bounds are left to `rows`): used to skip Q blocks.
  KeyRange key_rows(int64_t b, int64_t j0, int64_t j1) const {
    return segment_span(mask_.segment_query_range, b, seqlen_k_, j0, j1, seqlen_q_);
  }

 private:
  // The hull of the intervals that the segment tile ranges `ranges`
  // ([B, ceil(len / kSegmentBlock), 2], contract/attention.h) give for the blocks
  // covering positions [x0, x1) of batch b; [0, other_len) without segment ids.
  static KeyRange segment_span(const int32_t* ranges, int64_t b, int64_t len, int64_t x0,
                               int64_t x1, int64_t other_len) {
    if (ranges == nullptr) return {0, other_len};
    const int32_t* block = ranges + 2 * b * ceil_div(len, kSegmentBlock);
    KeyRange span{other_len, 0};
    for (int64_t blk = x0 / kSegmentBlock; blk <= (x1 - 1) / kSegmentBlock; ++blk) {
      const KeyRange r{block[2 * blk], block[2 * blk + 1]};
      if (r.empty()) continue;  // shares no id with the other side
      span.begin = std::min(span.begin, r.begin);
      span.end = std::max(span.end, r.end);
    }
    return span;
  }

  AttentionMask mask_;
  int64_t seqlen_q_, seqlen_k_;
};

// The columns [begin, end) of the tile of `cols` keys from j0 that some of
// the rows with key ranges row_keys[0, rows) see (empty if none does).
KeyRange seen_columns(const KeyRange* row_keys, int64_t rows, int64_t j0, int64_t cols) {
  KeyRange seen{cols, 0};
  for (int64_t r = 0; r < rows; ++r) {
    const KeyRange keys = intersect(row_keys[r], {j0, j0 + cols});
    if (keys.empty()) continue;
    seen.begin = std::min(seen.begin, keys.begin - j0);
    seen.end = std::max(seen.end, keys.end - j0);
  }
  return seen;
}

// Blocks [first, last) of size `block` overlapping a non-empty key range.
struct BlockSpan {
  int64_t first = 0;
  int64_t last = 0;
};

BlockSpan blocks_of(KeyRange r, int64_t block) {
  if (r.empty()) return {};
  return {r.begin / block, ceil_div(r.end, block)};
}

// ---------------------------------------------------------------------------
// Score changes (contract/attention.h: AttentionScores, and the element masks of
// AttentionMask), each a pass over one row's logits x[c0, c1) of a tile.

template <typename Elem>
class ScoreMods {
 public:
  ScoreMods(const AttentionMask& mask, const AttentionScores& scores, const Layout& l)
      : m_(mask), s_(scores), l_(l),
        dropout_(scores.dropout_key != nullptr && scores.dropout_rate > 0.f),
        threshold_(dropout_ ? dropout_threshold(scores.dropout_rate) : 0u),
        // In float, as the CUDA launcher (host_args.h) and the reference compute it.
        keep_scale_(dropout_ ? 1.f / (1.f - scores.dropout_rate) : 1.f) {}

  bool softcap() const { return s_.softcap > 0.f; }
  bool dropout() const { return dropout_; }
  // Whether anything happens between scale * q.k and the softmax.
  bool on_logits() const {
    return softcap() || s_.bias != nullptr || m_.q_segment_ids != nullptr || m_.mask != nullptr;
  }

  // Offset of element (b, n, i, 0) in the bias, and in dbias (same layout).
  int64_t bias_row(int64_t b, int64_t n, int64_t i) const {
    return b * s_.bias_stride_b + n * s_.bias_stride_n + i * l_.S;
  }

  // x = scale * q.k on entry; on return the softmax input: soft-capped,
  // biased, and -inf where segment ids or the mask hide the key. cap_grad,
  // when given (soft cap only), receives d(capped)/dx.
  void apply(const TileRow& at, int64_t c0, int64_t c1, float* x, float* cap_grad) const {
    if (softcap()) soft_cap(c0, c1, x, cap_grad);
    if (s_.bias != nullptr) add_bias(at, c0, c1, x);
    if (m_.q_segment_ids != nullptr) mask_segments(at, c0, c1, x);
    if (m_.mask != nullptr) mask_elements(at, c0, c1, x);
  }

  // factor[c] = 1 / (1 - rate) where dropout keeps key j0 + c, else 0. One
  // Philox block serves 4 consecutive keys (math/philox.h).
  void keep_factors(const TileRow& at, int64_t c0, int64_t c1, float* factor) const {
    const auto b = static_cast<uint32_t>(s_.dropout_broadcast ? 0 : at.b);
    const auto n = static_cast<uint32_t>(s_.dropout_broadcast ? 0 : at.n);
    const auto i = static_cast<uint32_t>(at.i);
    const int64_t end = at.j0 + c1;
    for (int64_t j = at.j0 + c0; j < end;) {
      const Philox4 words = dropout_block(s_.dropout_key, b, n, i, static_cast<uint32_t>(j >> 2));
      for (const int64_t block_end = std::min(end, (j | 3) + 1); j < block_end; ++j) {
        factor[j - at.j0] = words.x[j & 3] >= threshold_ ? keep_scale_ : 0.f;
      }
    }
  }

 private:
  void soft_cap(int64_t c0, int64_t c1, float* x, float* cap_grad) const {
    const float cap = s_.softcap;
    for (int64_t c = c0; c < c1; ++c) x[c] = cap * std::tanh(x[c] / cap);
    if (cap_grad == nullptr) return;
    // 1 - tanh^2, from the capped value itself.
    for (int64_t c = c0; c < c1; ++c) {
      const float t = x[c] / cap;
      cap_grad[c] = 1.f - t * t;
    }
  }

  // The bias has the inputs' dtype or float32; either way the add is in float.
  void add_bias(const TileRow& at, int64_t c0, int64_t c1, float* x) const {
    const int64_t row = bias_row(at.b, at.n, at.i) + at.j0;
    if (s_.bias_f32) {
      add_row(static_cast<const float*>(s_.bias) + row, c0, c1, x);
    } else {
      add_row(static_cast<const Elem*>(s_.bias) + row, c0, c1, x);
    }
  }

  template <typename Bias>
  static void add_row(const Bias* bias, int64_t c0, int64_t c1, float* x) {
    for (int64_t c = c0; c < c1; ++c) x[c] += to_float(bias[c]);
  }

  void mask_segments(const TileRow& at, int64_t c0, int64_t c1, float* x) const {
    const int32_t id = m_.q_segment_ids[at.b * l_.T + at.i];
    const int32_t* key_ids = m_.kv_segment_ids + at.b * l_.S + at.j0;
    for (int64_t c = c0; c < c1; ++c) {
      if (key_ids[c] != id) x[c] = kNegInf;
    }
  }

  void mask_elements(const TileRow& at, int64_t c0, int64_t c1, float* x) const {
    const uint8_t* visible = m_.mask + at.b * m_.mask_stride_b + at.n * m_.mask_stride_n +
                             at.i * l_.S + at.j0;
    for (int64_t c = c0; c < c1; ++c) {
      if (!visible[c]) x[c] = kNegInf;
    }
  }

  const AttentionMask& m_;
  const AttentionScores& s_;
  const Layout& l_;
  bool dropout_;
  uint32_t threshold_;
  float keep_scale_;
};

// ---------------------------------------------------------------------------
// Forward.

template <typename Elem>
class ForwardWorker {
 public:
  ForwardWorker(const AttentionFwdParams& p, const Layout& l)
      : p_(p), l_(l), ranges_(p.mask, l.T, l.S), mods_(p.mask, p.scores, l),
        q_(kBlockQ * l.H), kt_(l.H * kBlockK), v_(kBlockK * l.H), acc_(kBlockQ * l.H),
        row_max_(kBlockQ), row_sum_(kBlockQ), scores_(kBlockQ * kBlockK), keep_(kBlockK),
        row_keys_(kBlockQ) {}

  void operator()(int64_t item) {
    const auto [b, n, q_block] = split_item(item, l_.N, l_.num_q_blocks());
    const int64_t i0 = q_block * kBlockQ;
    const int64_t rows = std::min(kBlockQ, l_.T - i0);

    for (int64_t r = 0; r < rows; ++r) row_keys_[r] = ranges_.row(b, i0 + r);
    std::fill(row_max_.begin(), row_max_.end(), kNegInf);
    std::fill(row_sum_.begin(), row_sum_.end(), 0.f);
    std::fill(acc_.begin(), acc_.end(), 0.f);

    const BlockSpan span = blocks_of(ranges_.rows(b, i0, i0 + rows), kBlockK);
    if (span.first < span.last) {
      load_rows(q_ptr() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, q_.data());
    }
    const int64_t kv_head = n / l_.group;
    for (int64_t kb = span.first; kb < span.last; ++kb) {
      const int64_t j0 = kb * kBlockK;
      const int64_t cols = std::min(kBlockK, l_.S - j0);
      const KeyRange seen = seen_columns(row_keys_.data(), rows, j0, cols);
      if (seen.empty()) continue;
      load_rows_transposed(k_ptr() + l_.k_index(b, j0, kv_head), l_.k_row_stride(), cols, l_.H,
                           kBlockK, kt_.data());
      load_rows(v_ptr() + l_.k_index(b, j0, kv_head), l_.k_row_stride(), cols, l_.H, v_.data());
      update_block(b, n, i0, rows, j0, seen);
    }
    write_rows(b, n, i0, rows);
  }

 private:
  const Elem* q_ptr() const { return static_cast<const Elem*>(p_.q); }
  const Elem* k_ptr() const { return static_cast<const Elem*>(p_.k); }
  const Elem* v_ptr() const { return static_cast<const Elem*>(p_.v); }

  // One K/V tile (first key j0) against the block's rows, over the tile
  // columns `seen` that some row sees: S = scale Q K^T as one product, each
  // row's online softmax step on its own visible columns (its other columns
  // get weight 0), then O += P V as one product.
  void update_block(int64_t b, int64_t n, int64_t i0, int64_t rows, int64_t j0, KeyRange seen) {
    const int64_t width = seen.end - seen.begin;
    float* s = scores_.data() + seen.begin;  // row r's logits at s[r * kBlockK + c - seen.begin]
    gemm(rows, width, l_.H, {q_.data(), l_.H, 1}, kt_.data() + seen.begin, kBlockK, p_.scale,
         false, s, kBlockK);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = scores_.data() + r * kBlockK;
      const KeyRange keys = intersect(row_keys_[r], {j0 + seen.begin, j0 + seen.end});
      if (keys.empty() || !update_row({b, n, i0 + r, j0}, r, keys.begin - j0, keys.end - j0, row)) {
        std::fill(row + seen.begin, row + seen.end, 0.f);
        continue;
      }
      std::fill(row + seen.begin, row + keys.begin - j0, 0.f);
      std::fill(row + keys.end - j0, row + seen.end, 0.f);
    }
    gemm(rows, l_.H, width, {s, kBlockK, 1}, v_.data() + seen.begin * l_.H, l_.H, 1.f, true,
         acc_.data(), l_.H);
  }

  // Row r's online softmax step (cpu::online_softmax_step) on its visible
  // tile columns [c0, c1) of logits x, after the score changes. The row sum
  // takes the weights before dropout (the softmax and lse ignore it); only
  // P V sees the dropped and rescaled ones. False when every logit so far
  // is -inf: nothing to add.
  bool update_row(const TileRow& at, int64_t r, int64_t c0, int64_t c1, float* x) {
    if (mods_.on_logits()) mods_.apply(at, c0, c1, x, nullptr);
    if (!online_softmax_step(row_max_[r], row_sum_[r], &acc_[r * l_.H], l_.H, x, c0, c1))
      return false;
    if (mods_.dropout()) {
      mods_.keep_factors(at, c0, c1, keep_.data());
      for (int64_t c = c0; c < c1; ++c) x[c] *= keep_[c];
    }
    return true;
  }

  // Rows that saw no key get O = 0 and lse = -inf rather than 0 / 0.
  void write_rows(int64_t b, int64_t n, int64_t i0, int64_t rows) {
    Elem* o = static_cast<Elem*>(p_.o);
    for (int64_t r = 0; r < rows; ++r) {
      const bool has_keys = row_sum_[r] != 0.f;  // NaN (a NaN input) propagates
      const float inv_sum = has_keys ? 1.f / row_sum_[r] : 0.f;
      store_scaled_row(&acc_[r * l_.H], inv_sum, l_.H, o + l_.q_index(b, i0 + r, n));
      if (p_.lse != nullptr) {
        p_.lse[l_.lse_index(b, n, i0 + r)] =
            has_keys ? row_max_[r] + std::log(row_sum_[r]) : kNegInf;
      }
    }
  }

  const AttentionFwdParams& p_;
  const Layout& l_;
  MaskRanges ranges_;
  ScoreMods<Elem> mods_;
  std::vector<float> q_, kt_, v_, acc_;  // kt_: the K tile transposed, [H][kBlockK]
  std::vector<float> row_max_, row_sum_, scores_, keep_;
  std::vector<KeyRange> row_keys_;
};

template <typename Elem>
void forward(const AttentionFwdParams& p, const TaskRunner* runner) {
  const Layout l(p.shape);
  const int64_t num_items = l.B * l.N * l.num_q_blocks();
  const double work = static_cast<double>(std::min(kBlockQ, l.T)) * l.S * l.H * 2;
  for_each_item(runner, num_items, work, [&] { return ForwardWorker<Elem>(p, l); });
}

// ---------------------------------------------------------------------------
// Backward.

// delta[b, n, t] = sum_h dO * O, in fp32 from the stored (rounded) O.
template <typename Elem>
void compute_delta(const AttentionBwdParams& p, const Layout& l, float* delta,
                   const TaskRunner* runner) {
  const Elem* o = static_cast<const Elem*>(p.o);
  const Elem* d_o = static_cast<const Elem*>(p.d_o);
  for_each_item(runner, l.B * l.N, static_cast<double>(l.T) * l.H, [&] {
    return [&](int64_t item) {
      const int64_t b = item / l.N;
      const int64_t n = item % l.N;
      for (int64_t t = 0; t < l.T; ++t) {
        const int64_t base = l.q_index(b, t, n);
        float sum = 0.f;
        for (int64_t h = 0; h < l.H; ++h) sum += to_float(o[base + h]) * to_float(d_o[base + h]);
        delta[l.lse_index(b, n, t)] = sum;
      }
    };
  });
}

// Whether each dbias element is reached by one dK/dV item (b, KV head, KV
// block) only: not so for a bias broadcast over several batch rows, or over
// query heads that read different KV heads.
bool dbias_owned_by_dkdv(const AttentionScores& s, const Layout& l) {
  return (s.bias_stride_b != 0 || l.B == 1) && (s.bias_stride_n != 0 || l.K == 1);
}

// State shared by the backward passes: inputs, layout, masks and score changes.
template <typename Elem>
struct BackwardInputs {
  const AttentionBwdParams& p;
  const Layout& l;
  const float* delta;
  MaskRanges ranges;
  ScoreMods<Elem> mods;
  float* dkdv_dbias;  // dbias when the dK/dV items write it, else null
  float* dbias;       // float32 dbias: p.dbias, or scratch converted at the end

  const Elem* q() const { return static_cast<const Elem*>(p.q); }
  const Elem* k() const { return static_cast<const Elem*>(p.k); }
  const Elem* v() const { return static_cast<const Elem*>(p.v); }
  const Elem* d_o() const { return static_cast<const Elem*>(p.d_o); }
};

// The K/V tile of one dK/dV, dQ or dbias step, as floats: K and V
// transposed ([H][kBlockK], the B operands of S = Q K^T and dP = dO V^T)
// and, for the dQ items (`k_rows`), K as rows too ([kBlockK][H], the B
// operand of dQ = dlogit K).
struct KvTile {
  std::vector<float> k, kt, vt;
  int64_t b = -1, kv_head = -1, j0 = -1;  // what it holds

  KvTile(int64_t head_dim, bool k_rows)
      : k(k_rows ? kBlockK * head_dim : 0), kt(head_dim * kBlockK), vt(head_dim * kBlockK) {}

  template <typename Elem>
  void load(const Elem* k_src, const Elem* v_src, const Layout& l, int64_t b_, int64_t kv_head_,
            int64_t j0_, int64_t cols) {
    if (b_ == b && kv_head_ == kv_head && j0_ == j0) return;  // a group's heads share it
    const int64_t at = l.k_index(b_, j0_, kv_head_);
    if (!k.empty()) load_rows(k_src + at, l.k_row_stride(), cols, l.H, k.data());
    load_rows_transposed(k_src + at, l.k_row_stride(), cols, l.H, kBlockK, kt.data());
    load_rows_transposed(v_src + at, l.k_row_stride(), cols, l.H, kBlockK, vt.data());
    b = b_, kv_head = kv_head_, j0 = j0_;
  }
};

// The gradient terms of a block of query rows against the columns `seen`
// of a K/V tile (0 on the seen columns a row does not see), as
// [kBlockQ][kBlockK] tiles (row r's column c at r * kBlockK + c). With x the
// softmax input (contract/attention.h) and f the dropout factor keep / (1 - rate) (1
// without dropout):
struct TileGradients {
  const float* dv_weight;  // P * f: the weight of dO_i in dV_j
  const float* d_score;    // dS = P * (f * dO.V_j - delta) = d loss / dx, which is dbias
  const float* d_logit;    // dS * d(capped)/d(logit) = d loss / d(scale * q.k)
};

// Recomputes TileGradients from the forward's lse: S and dP as two tile
// products, then each row's P and dS; P = 0 where the row is masked
// (x = -inf) or sees no key. Owns its tile scratch.
template <typename Elem>
class TileGradient {
 public:
  explicit TileGradient(const BackwardInputs<Elem>& in)
      : in_(in), prob_(kBlockQ * kBlockK), d_score_(kBlockQ * kBlockK), keep_(kBlockK),
        cap_grad_(kBlockK), d_logit_(in.mods.softcap() ? kBlockQ * kBlockK : 0) {}

  // Rows i0 + r of head n, r < rows, with key ranges row_keys[r] and their Q
  // and dO rows in q and d_o ([rows][H]), against the columns `seen` of the
  // tile `kv` (seen_columns of the same rows; not empty).
  TileGradients operator()(int64_t b, int64_t n, int64_t i0, int64_t rows,
                           const KeyRange* row_keys, const float* q, const float* d_o,
                           const KvTile& kv, KeyRange seen) {
    const int64_t H = in_.l.H, j0 = kv.j0;
    TileGradients g{prob_.data(), d_score_.data(),
                    in_.mods.softcap() ? d_logit_.data() : d_score_.data()};
    const int64_t width = seen.end - seen.begin;
    // The logits, then P in place; dP, then dS in place.
    gemm(rows, width, H, {q, H, 1}, kv.kt.data() + seen.begin, kBlockK, in_.p.scale, false,
         prob_.data() + seen.begin, kBlockK);
    gemm(rows, width, H, {d_o, H, 1}, kv.vt.data() + seen.begin, kBlockK, 1.f, false,
         d_score_.data() + seen.begin, kBlockK);
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange keys = intersect(row_keys[r], {j0 + seen.begin, j0 + seen.end});
      const float lse = in_.p.lse[in_.l.lse_index(b, n, i0 + r)];
      KeyRange live{seen.begin, seen.begin};  // the columns given terms
      if (!keys.empty() && lse != kNegInf) {
        live = {keys.begin - j0, keys.end - j0};
        row_terms({b, n, i0 + r, j0}, r, live.begin, live.end, lse);
      }
      clear_outside(r, seen, live);
    }
    return g;
  }

 private:
  void row_terms(const TileRow& at, int64_t r, int64_t c0, int64_t c1, float lse) {
    const ScoreMods<Elem>& mods = in_.mods;
    float* prob = &prob_[r * kBlockK];
    float* ds = &d_score_[r * kBlockK];  // dP on entry
    if (mods.on_logits()) mods.apply(at, c0, c1, prob, mods.softcap() ? cap_grad_.data() : nullptr);
    exp_shift_sum(prob + c0, c1 - c0, lse);  // P in place (its sum is not needed)
    if (mods.dropout()) {
      mods.keep_factors(at, c0, c1, keep_.data());
      for (int64_t c = c0; c < c1; ++c) ds[c] *= keep_[c];
    }
    const float delta = in_.delta[in_.l.lse_index(at.b, at.n, at.i)];
    for (int64_t c = c0; c < c1; ++c) ds[c] = prob[c] * (ds[c] - delta);
    if (mods.dropout()) {
      for (int64_t c = c0; c < c1; ++c) prob[c] *= keep_[c];  // P * f
    }
    if (mods.softcap()) {
      float* dl = &d_logit_[r * kBlockK];
      for (int64_t c = c0; c < c1; ++c) dl[c] = ds[c] * cap_grad_[c];
    }
  }

  // Zeros in row r's terms on the seen columns outside `live`.
  void clear_outside(int64_t r, KeyRange seen, KeyRange live) {
    for (std::vector<float>* term : {&prob_, &d_score_, &d_logit_}) {
      if (term->empty()) continue;  // d_logit_ without a soft cap
      float* row = term->data() + r * kBlockK;
      std::fill(row + seen.begin, row + live.begin, 0.f);
      std::fill(row + live.end, row + seen.end, 0.f);
    }
  }

  const BackwardInputs<Elem>& in_;
  std::vector<float> prob_, d_score_, keep_, cap_grad_, d_logit_;
};

// One item per (b, KV head, KV block): dV_j = sum_i P_ij f_ij dO_i and
// dK_j = scale * sum_i dlogit_ij Q_i, summed over the group's query heads
// and all Q blocks that see the KV block; also dbias when it owns it.
template <typename Elem>
class DkDvWorker {
 public:
  explicit DkDvWorker(const BackwardInputs<Elem>& in)
      : in_(in), l_(in.l), grad_(in), kv_(l_.H, false), dk_(kBlockK * l_.H), dv_(kBlockK * l_.H),
        q_(kBlockQ * l_.H), do_(kBlockQ * l_.H), row_keys_(kBlockQ) {}

  void operator()(int64_t item) {
    const auto [b, kv_head, kb] = split_item(item, l_.K, l_.num_k_blocks());
    const int64_t j0 = kb * kBlockK;
    const int64_t cols = std::min(kBlockK, l_.S - j0);

    kv_.load(in_.k(), in_.v(), l_, b, kv_head, j0, cols);
    std::fill(dk_.begin(), dk_.end(), 0.f);
    std::fill(dv_.begin(), dv_.end(), 0.f);
    if (in_.dkdv_dbias != nullptr) clear_dbias(b, kv_head, j0, cols);

    const BlockSpan q_span = blocks_of(in_.ranges.key_rows(b, j0, j0 + cols), kBlockQ);
    for (int64_t qb = q_span.first; qb < q_span.last; ++qb) {
      const int64_t i0 = qb * kBlockQ;
      const int64_t rows = std::min(kBlockQ, l_.T - i0);
      for (int64_t r = 0; r < rows; ++r) row_keys_[r] = in_.ranges.row(b, i0 + r);
      const KeyRange seen = seen_columns(row_keys_.data(), rows, j0, cols);
      if (seen.empty()) continue;
      for (int64_t g = 0; g < l_.group; ++g) {
        accumulate_q_block(b, kv_head * l_.group + g, i0, rows, seen);
      }
    }

    Elem* dk = static_cast<Elem*>(in_.p.dk);
    Elem* dv = static_cast<Elem*>(in_.p.dv);
    for (int64_t c = 0; c < cols; ++c) {
      store_scaled_row(&dk_[c * l_.H], in_.p.scale, l_.H, dk + l_.k_index(b, j0 + c, kv_head));
      store_scaled_row(&dv_[c * l_.H], 1.f, l_.H, dv + l_.k_index(b, j0 + c, kv_head));
    }
  }

 private:
  // dbias columns [j0, j0 + cols) of every row, for the group's heads: this
  // item's share, zeroed here because masked pairs never add to it. (With a
  // head-broadcast bias the group's heads share one plane, zeroed repeatedly
  // before any add.)
  void clear_dbias(int64_t b, int64_t kv_head, int64_t j0, int64_t cols) {
    for (int64_t g = 0; g < l_.group; ++g) {
      for (int64_t i = 0; i < l_.T; ++i) {
        float* row = in_.dkdv_dbias + in_.mods.bias_row(b, kv_head * l_.group + g, i) + j0;
        std::fill(row, row + cols, 0.f);
      }
    }
  }

  // dV += (P f)^T dO and dK += dlogit^T Q over the tile's seen columns.
  void accumulate_q_block(int64_t b, int64_t n, int64_t i0, int64_t rows, KeyRange seen) {
    load_rows(in_.q() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, q_.data());
    load_rows(in_.d_o() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, do_.data());
    const TileGradients g =
        grad_(b, n, i0, rows, row_keys_.data(), q_.data(), do_.data(), kv_, seen);
    const int64_t c0 = seen.begin, width = seen.end - c0;
    gemm(width, l_.H, rows, {g.dv_weight + c0, 1, kBlockK}, do_.data(), l_.H, 1.f, true,
         &dv_[c0 * l_.H], l_.H);
    gemm(width, l_.H, rows, {g.d_logit + c0, 1, kBlockK}, q_.data(), l_.H, 1.f, true,
         &dk_[c0 * l_.H], l_.H);
    if (in_.dkdv_dbias == nullptr) return;
    for (int64_t r = 0; r < rows; ++r) {
      float* dbias = in_.dkdv_dbias + in_.mods.bias_row(b, n, i0 + r) + kv_.j0;
      const float* ds = g.d_score + r * kBlockK;
      for (int64_t c = c0; c < seen.end; ++c) dbias[c] += ds[c];
    }
  }

  const BackwardInputs<Elem>& in_;
  const Layout& l_;
  TileGradient<Elem> grad_;
  KvTile kv_;
  std::vector<float> dk_, dv_, q_, do_;
  std::vector<KeyRange> row_keys_;
};

// One item per (b, head, Q block): dQ_i = scale * sum_j dlogit_ij K_j.
template <typename Elem>
class DqWorker {
 public:
  explicit DqWorker(const BackwardInputs<Elem>& in)
      : in_(in), l_(in.l), grad_(in), kv_(l_.H, true), q_(kBlockQ * l_.H), do_(kBlockQ * l_.H),
        dq_(kBlockQ * l_.H), row_keys_(kBlockQ) {}

  void operator()(int64_t item) {
    const auto [b, n, q_block] = split_item(item, l_.N, l_.num_q_blocks());
    const int64_t i0 = q_block * kBlockQ;
    const int64_t rows = std::min(kBlockQ, l_.T - i0);
    const int64_t kv_head = n / l_.group;

    for (int64_t r = 0; r < rows; ++r) row_keys_[r] = in_.ranges.row(b, i0 + r);
    std::fill(dq_.begin(), dq_.end(), 0.f);
    const BlockSpan span = blocks_of(in_.ranges.rows(b, i0, i0 + rows), kBlockK);
    if (span.first < span.last) {
      load_rows(in_.q() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, q_.data());
      load_rows(in_.d_o() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, do_.data());
    }
    for (int64_t kb = span.first; kb < span.last; ++kb) {
      const int64_t j0 = kb * kBlockK;
      const int64_t cols = std::min(kBlockK, l_.S - j0);
      const KeyRange seen = seen_columns(row_keys_.data(), rows, j0, cols);
      if (seen.empty()) continue;
      kv_.load(in_.k(), in_.v(), l_, b, kv_head, j0, cols);
      const TileGradients g =
          grad_(b, n, i0, rows, row_keys_.data(), q_.data(), do_.data(), kv_, seen);
      const int64_t c0 = seen.begin;
      gemm(rows, l_.H, seen.end - c0, {g.d_logit + c0, kBlockK, 1}, &kv_.k[c0 * l_.H], l_.H,
           1.f, true, dq_.data(), l_.H);
    }

    Elem* dq = static_cast<Elem*>(in_.p.dq);
    for (int64_t r = 0; r < rows; ++r) {
      store_scaled_row(&dq_[r * l_.H], in_.p.scale, l_.H, dq + l_.q_index(b, i0 + r, n));
    }
  }

 private:
  const BackwardInputs<Elem>& in_;
  const Layout& l_;
  TileGradient<Elem> grad_;
  KvTile kv_;
  std::vector<float> q_, do_, dq_;
  std::vector<KeyRange> row_keys_;
};

// dbias split into tiles (bias batch, bias head, Q block, KV block); a
// broadcast axis has one bias batch (head), which stands for all of them.
struct BiasTiles {
  int64_t batches, heads, q_blocks, k_blocks;

  BiasTiles(const AttentionScores& s, const Layout& l)
      : batches(s.bias_stride_b != 0 ? l.B : 1), heads(s.bias_stride_n != 0 ? l.N : 1),
        q_blocks(l.num_q_blocks()), k_blocks(l.num_k_blocks()) {}

  int64_t count() const { return batches * heads * q_blocks * k_blocks; }
};

// One item per tile of a dbias that dK/dV items would share: it sums dS over
// the (b, n) that read the tile in a fixed order, then writes the tile, so
// each element has one writer and one summation order. It recomputes P and
// dP for that rather than have threads add into one element.
template <typename Elem>
class DbiasWorker {
 public:
  DbiasWorker(const BackwardInputs<Elem>& in, const BiasTiles& tiles)
      : in_(in), l_(in.l), tiles_(tiles), grad_(in), kv_(l_.H, false), q_(kBlockQ * l_.H),
        do_(kBlockQ * l_.H), tile_(kBlockQ * kBlockK), row_keys_(kBlockQ) {}

  void operator()(int64_t item) {
    const int64_t kb = item % tiles_.k_blocks;
    const int64_t qb = item / tiles_.k_blocks % tiles_.q_blocks;
    const int64_t bias_n = item / (tiles_.k_blocks * tiles_.q_blocks) % tiles_.heads;
    const int64_t bias_b = item / (tiles_.k_blocks * tiles_.q_blocks * tiles_.heads);
    const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, l_.T - i0);
    const int64_t j0 = kb * kBlockK, cols = std::min(kBlockK, l_.S - j0);

    std::fill(tile_.begin(), tile_.end(), 0.f);
    // On a broadcast axis (one bias batch or head) the loop visits every b
    // (n), else only the tile's own.
    for (int64_t b = bias_b; b < l_.B; b += tiles_.batches) {
      for (int64_t r = 0; r < rows; ++r) row_keys_[r] = in_.ranges.row(b, i0 + r);
      const KeyRange seen = seen_columns(row_keys_.data(), rows, j0, cols);
      if (seen.empty()) continue;
      for (int64_t n = bias_n; n < l_.N; n += tiles_.heads)
        accumulate(b, n, i0, rows, j0, cols, seen);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* sum = &tile_[r * kBlockK];
      std::copy(sum, sum + cols, in_.dbias + in_.mods.bias_row(bias_b, bias_n, i0 + r) + j0);
    }
  }

 private:
  void accumulate(int64_t b, int64_t n, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                  KeyRange seen) {
    load_rows(in_.q() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, q_.data());
    load_rows(in_.d_o() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, do_.data());
    kv_.load(in_.k(), in_.v(), l_, b, n / l_.group, j0, cols);
    const TileGradients g =
        grad_(b, n, i0, rows, row_keys_.data(), q_.data(), do_.data(), kv_, seen);
    for (int64_t r = 0; r < rows; ++r) {
      float* sum = &tile_[r * kBlockK];
      const float* ds = g.d_score + r * kBlockK;
      for (int64_t c = seen.begin; c < seen.end; ++c) sum[c] += ds[c];
    }
  }

  const BackwardInputs<Elem>& in_;
  const Layout& l_;
  const BiasTiles& tiles_;
  TileGradient<Elem> grad_;
  KvTile kv_;
  std::vector<float> q_, do_, tile_;
  std::vector<KeyRange> row_keys_;
};

template <typename Elem>
void backward(const AttentionBwdParams& p, const TaskRunner* runner) {
  const Layout l(p.shape);
  std::vector<float> local_delta;
  float* delta = p.delta;
  if (delta == nullptr) {
    local_delta.resize(static_cast<size_t>(l.B * l.N * l.T));
    delta = local_delta.data();
  }
  compute_delta<Elem>(p, l, delta, runner);

  // A 16-bit dbias (the bias's dtype, contract/attention.h) is summed in float32 scratch.
  const int64_t dbias_elems = (p.scores.bias_stride_b ? l.B : 1) *
                              (p.scores.bias_stride_n ? l.N : 1) * l.T * l.S;
  std::vector<float> dbias_scratch;
  float* dbias = nullptr;
  if (p.scores.bias != nullptr && p.dbias != nullptr) {
    if (!p.dbias_f32) dbias_scratch.resize(static_cast<size_t>(dbias_elems));
    dbias = p.dbias_f32 ? static_cast<float*>(p.dbias) : dbias_scratch.data();
  }
  const bool dkdv_dbias = dbias != nullptr && dbias_owned_by_dkdv(p.scores, l);
  const BackwardInputs<Elem> in{p, l, delta, MaskRanges(p.mask, l.T, l.S),
                                ScoreMods<Elem>(p.mask, p.scores, l),
                                dkdv_dbias ? dbias : nullptr, dbias};
  // Per item: two dots and two axpys over H for every (row, key) pair.
  const double dkdv_work = static_cast<double>(l.group) * l.T * std::min(kBlockK, l.S) * l.H * 8;
  for_each_item(runner, l.B * l.K * l.num_k_blocks(), dkdv_work, [&] { return DkDvWorker<Elem>(in); });
  const double dq_work = static_cast<double>(std::min(kBlockQ, l.T)) * l.S * l.H * 6;
  for_each_item(runner, l.B * l.N * l.num_q_blocks(), dq_work, [&] { return DqWorker<Elem>(in); });
  if (dbias != nullptr && !dkdv_dbias) {
    const BiasTiles tiles(p.scores, l);
    // Per item: two dots over H for every pair of the tile and (b, n) it sums.
    const double readers = static_cast<double>(l.B / tiles.batches) * (l.N / tiles.heads);
    const double work = readers * std::min(kBlockQ, l.T) * std::min(kBlockK, l.S) * l.H * 4;
    for_each_item(runner, tiles.count(), work, [&] { return DbiasWorker<Elem>(in, tiles); });
  }
  if (!dbias_scratch.empty())
    store_row(dbias_scratch.data(), dbias_elems, static_cast<Elem*>(p.dbias));
}

bool is_empty(const AttentionShape& s) {
  return s.batch <= 0 || s.seqlen_q <= 0 || s.num_heads <= 0 || s.num_kv_heads <= 0 ||
         s.head_dim <= 0;
}

}  // namespace

void attention_fwd_cpu(const AttentionFwdParams& p, const TaskRunner* runner) {
  if (is_empty(p.shape)) return;
  dispatch_cpu_dtype(p.dtype, [&](auto x) { forward<decltype(x)>(p, runner); });
}

void attention_bwd_cpu(const AttentionBwdParams& p, const TaskRunner* runner) {
  if (is_empty(p.shape)) return;
  dispatch_cpu_dtype(p.dtype, [&](auto x) { backward<decltype(x)>(p, runner); });
}

}  // namespace jaxcraft
