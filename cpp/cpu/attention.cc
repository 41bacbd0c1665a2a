// Blocked flash attention on the host.
//
// Forward: each work item is one (batch, head, Q block). It streams the KV
// blocks that the block's rows can see, keeping a running row max, row sum
// and output accumulator in fp32 (online softmax), so no T x S buffer exists.
//
// Backward: P is recomputed from Q, K and the forward lse. dK/dV and dQ are
// computed by two separate passes so that every output element has exactly
// one writer (no atomics, bitwise reproducible):
//   * dK/dV: one item per (batch, KV head, KV block), looping over the query
//     heads of its group and over the Q blocks that see the KV block;
//   * dQ: one item per (batch, head, Q block), looping over its KV blocks.
#include "cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "common/host_float.h"
#include "cpu/blocked.h"

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
  for (int64_t r = 0; r < rows; ++r) {
    const Elem* in = src + r * stride;
    float* out = dst + r * head_dim;
    for (int64_t h = 0; h < head_dim; ++h) out[h] = to_float(in[h]);
  }
}

template <typename Elem>
void store_row(const float* src, float multiplier, int64_t head_dim, Elem* dst) {
  for (int64_t h = 0; h < head_dim; ++h) dst[h] = from_float<Elem>(src[h] * multiplier);
}

// Element strides of the contiguous layouts in params.h.
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

// ---------------------------------------------------------------------------
// Masking. Every bound in AttentionMask is a lower or an upper limit on the
// key index, so the keys a row sees are one half-open interval [begin, end).

KeyRange intersect(KeyRange a, KeyRange b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

class MaskRanges {
 public:
  MaskRanges(const AttentionMask& mask, int64_t seqlen_k) : mask_(mask), seqlen_k_(seqlen_k) {}

  KeyRange row(int64_t b, int64_t i) const {
    if (mask_.q_lengths != nullptr && i >= mask_.q_lengths[b]) return {};
    int64_t end = seqlen_k_;
    if (mask_.kv_lengths != nullptr) end = std::min<int64_t>(end, mask_.kv_lengths[b]);
    const int64_t diagonal = i + mask_.offset;
    if (mask_.causal) end = std::min(end, diagonal + 1);
    if (mask_.window_right >= 0) end = std::min(end, diagonal + mask_.window_right + 1);
    int64_t begin = 0;
    if (mask_.window_left >= 0) begin = std::max(begin, diagonal - mask_.window_left);
    return {begin, end};
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

 private:
  AttentionMask mask_;
  int64_t seqlen_k_;
};

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
// Forward.

template <typename Elem>
class ForwardWorker {
 public:
  ForwardWorker(const AttentionFwdParams& p, const Layout& l)
      : p_(p), l_(l), ranges_(p.mask, l.S),
        q_(kBlockQ * l.H), k_(kBlockK * l.H), v_(kBlockK * l.H), acc_(kBlockQ * l.H),
        row_max_(kBlockQ), row_sum_(kBlockQ), logits_(kBlockK), row_keys_(kBlockQ) {}

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
      load_rows(k_ptr() + l_.k_index(b, j0, kv_head), l_.k_row_stride(), cols, l_.H, k_.data());
      load_rows(v_ptr() + l_.k_index(b, j0, kv_head), l_.k_row_stride(), cols, l_.H, v_.data());
      for (int64_t r = 0; r < rows; ++r) {
        const KeyRange keys = intersect(row_keys_[r], {j0, j0 + cols});
        if (!keys.empty()) update_row(r, keys.begin - j0, keys.end - j0);
      }
    }
    write_rows(b, n, i0, rows);
  }

 private:
  const Elem* q_ptr() const { return static_cast<const Elem*>(p_.q); }
  const Elem* k_ptr() const { return static_cast<const Elem*>(p_.k); }
  const Elem* v_ptr() const { return static_cast<const Elem*>(p_.v); }

  // Online softmax step for tile row r against the visible tile columns
  // [c0, c1): rescale the running sum and accumulator to the new row max,
  // then add this block's exp(logit - max) weights.
  void update_row(int64_t r, int64_t c0, int64_t c1) {
    const float* q = &q_[r * l_.H];
    float block_max = kNegInf;
    for (int64_t c = c0; c < c1; ++c) {
      logits_[c] = p_.scale * dot(q, &k_[c * l_.H], l_.H);
      block_max = std::max(block_max, logits_[c]);
    }
    const float new_max = std::max(row_max_[r], block_max);
    if (new_max == kNegInf) return;  // only -inf logits so far: nothing to add
    const float correction = std::exp(row_max_[r] - new_max);
    float* acc = &acc_[r * l_.H];
    scale_row(correction, acc, l_.H);
    float block_sum = 0.f;
    for (int64_t c = c0; c < c1; ++c) {
      const float weight = std::exp(logits_[c] - new_max);
      block_sum += weight;
      axpy(weight, &v_[c * l_.H], acc, l_.H);
    }
    row_sum_[r] = row_sum_[r] * correction + block_sum;
    row_max_[r] = new_max;
  }

  // Rows that saw no key get O = 0 and lse = -inf rather than 0 / 0.
  void write_rows(int64_t b, int64_t n, int64_t i0, int64_t rows) {
    Elem* o = static_cast<Elem*>(p_.o);
    for (int64_t r = 0; r < rows; ++r) {
      const bool has_keys = row_sum_[r] > 0.f;
      const float inv_sum = has_keys ? 1.f / row_sum_[r] : 0.f;
      store_row(&acc_[r * l_.H], inv_sum, l_.H, o + l_.q_index(b, i0 + r, n));
      if (p_.lse != nullptr) {
        p_.lse[l_.lse_index(b, n, i0 + r)] =
            has_keys ? row_max_[r] + std::log(row_sum_[r]) : kNegInf;
      }
    }
  }

  const AttentionFwdParams& p_;
  const Layout& l_;
  MaskRanges ranges_;
  std::vector<float> q_, k_, v_, acc_;
  std::vector<float> row_max_, row_sum_, logits_;
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

// State shared by the two backward passes: inputs, layout and masks.
template <typename Elem>
struct BackwardInputs {
  const AttentionBwdParams& p;
  const Layout& l;
  const float* delta;
  MaskRanges ranges;

  const Elem* q() const { return static_cast<const Elem*>(p.q); }
  const Elem* k() const { return static_cast<const Elem*>(p.k); }
  const Elem* v() const { return static_cast<const Elem*>(p.v); }
  const Elem* d_o() const { return static_cast<const Elem*>(p.d_o); }

  // P[i, j] recomputed from the logit and the forward lse.
  float prob(const float* q_row, const float* k_row, float lse) const {
    return std::exp(p.scale * dot(q_row, k_row, l.H) - lse);
  }
};

// One item per (b, KV head, KV block): dV_j = sum_i P_ij dO_i and
// dK_j = scale * sum_i dS_ij Q_i with dS = P * (dO.V_j - delta), summed over
// the group's query heads and all Q blocks that see the KV block.
template <typename Elem>
class DkDvWorker {
 public:
  explicit DkDvWorker(const BackwardInputs<Elem>& in)
      : in_(in), l_(in.l), k_(kBlockK * l_.H), v_(kBlockK * l_.H), dk_(kBlockK * l_.H),
        dv_(kBlockK * l_.H), q_(kBlockQ * l_.H), do_(kBlockQ * l_.H) {}

  void operator()(int64_t item) {
    const auto [b, kv_head, kb] = split_item(item, l_.K, l_.num_k_blocks());
    const int64_t j0 = kb * kBlockK;
    const int64_t cols = std::min(kBlockK, l_.S - j0);

    load_rows(in_.k() + l_.k_index(b, j0, kv_head), l_.k_row_stride(), cols, l_.H, k_.data());
    load_rows(in_.v() + l_.k_index(b, j0, kv_head), l_.k_row_stride(), cols, l_.H, v_.data());
    std::fill(dk_.begin(), dk_.end(), 0.f);
    std::fill(dv_.begin(), dv_.end(), 0.f);

    for (int64_t qb = 0; qb < l_.num_q_blocks(); ++qb) {
      const int64_t i0 = qb * kBlockQ;
      const int64_t rows = std::min(kBlockQ, l_.T - i0);
      if (intersect(in_.ranges.rows(b, i0, i0 + rows), {j0, j0 + cols}).empty()) continue;
      for (int64_t g = 0; g < l_.group; ++g) {
        accumulate_q_block(b, kv_head * l_.group + g, i0, rows, j0, cols);
      }
    }

    Elem* dk = static_cast<Elem*>(in_.p.dk);
    Elem* dv = static_cast<Elem*>(in_.p.dv);
    for (int64_t c = 0; c < cols; ++c) {
      store_row(&dk_[c * l_.H], in_.p.scale, l_.H, dk + l_.k_index(b, j0 + c, kv_head));
      store_row(&dv_[c * l_.H], 1.f, l_.H, dv + l_.k_index(b, j0 + c, kv_head));
    }
  }

 private:
  void accumulate_q_block(int64_t b, int64_t n, int64_t i0, int64_t rows, int64_t j0,
                          int64_t cols) {
    load_rows(in_.q() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, q_.data());
    load_rows(in_.d_o() + l_.q_index(b, i0, n), l_.q_row_stride(), rows, l_.H, do_.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      const KeyRange keys = intersect(in_.ranges.row(b, i), {j0, j0 + cols});
      const float lse = in_.p.lse[l_.lse_index(b, n, i)];
      if (keys.empty() || lse == kNegInf) continue;
      const float delta = in_.delta[l_.lse_index(b, n, i)];
      const float* q = &q_[r * l_.H];
      const float* d_o = &do_[r * l_.H];
      for (int64_t c = keys.begin - j0; c < keys.end - j0; ++c) {
        const float prob = in_.prob(q, &k_[c * l_.H], lse);
        const float d_logit = prob * (dot(d_o, &v_[c * l_.H], l_.H) - delta);
        axpy(prob, d_o, &dv_[c * l_.H], l_.H);
        axpy(d_logit, q, &dk_[c * l_.H], l_.H);
      }
    }
  }

  const BackwardInputs<Elem>& in_;
  const Layout& l_;
  std::vector<float> k_, v_, dk_, dv_, q_, do_;
};

// One item per (b, head, Q block): dQ_i = scale * sum_j dS_ij K_j.
template <typename Elem>
class DqWorker {
 public:
  explicit DqWorker(const BackwardInputs<Elem>& in)
      : in_(in), l_(in.l), q_(kBlockQ * l_.H), do_(kBlockQ * l_.H), dq_(kBlockQ * l_.H),
        k_(kBlockK * l_.H), v_(kBlockK * l_.H), row_keys_(kBlockQ) {}

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
      load_rows(in_.k() + l_.k_index(b, j0, kv_head), l_.k_row_stride(), cols, l_.H, k_.data());
      load_rows(in_.v() + l_.k_index(b, j0, kv_head), l_.k_row_stride(), cols, l_.H, v_.data());
      for (int64_t r = 0; r < rows; ++r) accumulate_row(b, n, i0 + r, r, j0, cols);
    }

    Elem* dq = static_cast<Elem*>(in_.p.dq);
    for (int64_t r = 0; r < rows; ++r) {
      store_row(&dq_[r * l_.H], in_.p.scale, l_.H, dq + l_.q_index(b, i0 + r, n));
    }
  }

 private:
  void accumulate_row(int64_t b, int64_t n, int64_t i, int64_t r, int64_t j0, int64_t cols) {
    const KeyRange keys = intersect(row_keys_[r], {j0, j0 + cols});
    const float lse = in_.p.lse[l_.lse_index(b, n, i)];
    if (keys.empty() || lse == kNegInf) return;
    const float delta = in_.delta[l_.lse_index(b, n, i)];
    const float* q = &q_[r * l_.H];
    const float* d_o = &do_[r * l_.H];
    float* dq = &dq_[r * l_.H];
    for (int64_t c = keys.begin - j0; c < keys.end - j0; ++c) {
      const float prob = in_.prob(q, &k_[c * l_.H], lse);
      const float d_logit = prob * (dot(d_o, &v_[c * l_.H], l_.H) - delta);
      axpy(d_logit, &k_[c * l_.H], dq, l_.H);
    }
  }

  const BackwardInputs<Elem>& in_;
  const Layout& l_;
  std::vector<float> q_, do_, dq_, k_, v_;
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

  const BackwardInputs<Elem> in{p, l, delta, MaskRanges(p.mask, l.S)};
  // Per item: two dots and two axpys over H for every (row, key) pair.
  const double dkdv_work = static_cast<double>(l.group) * l.T * std::min(kBlockK, l.S) * l.H * 8;
  for_each_item(runner, l.B * l.K * l.num_k_blocks(), dkdv_work, [&] { return DkDvWorker<Elem>(in); });
  const double dq_work = static_cast<double>(std::min(kBlockQ, l.T)) * l.S * l.H * 6;
  for_each_item(runner, l.B * l.N * l.num_q_blocks(), dq_work, [&] { return DqWorker<Elem>(in); });
}

bool is_empty(const AttentionShape& s) {
  return s.batch <= 0 || s.seqlen_q <= 0 || s.num_heads <= 0 || s.num_kv_heads <= 0 ||
         s.head_dim <= 0;
}

}  // namespace

void attention_fwd_cpu(const AttentionFwdParams& p, const TaskRunner* runner) {
  if (is_empty(p.shape)) return;
  switch (p.dtype) {
    case DType::kF32: forward<float>(p, runner); break;
    case DType::kBF16: forward<bf16_t>(p, runner); break;
    case DType::kF16: forward<f16_t>(p, runner); break;
  }
}

void attention_bwd_cpu(const AttentionBwdParams& p, const TaskRunner* runner) {
  if (is_empty(p.shape)) return;
  switch (p.dtype) {
    case DType::kF32: backward<float>(p, runner); break;
    case DType::kBF16: backward<bf16_t>(p, runner); break;
    case DType::kF16: backward<f16_t>(p, runner); break;
  }
}

}  // namespace jaxcraft
