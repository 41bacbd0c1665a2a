// Split-K decode attention on the host.
//
// A work item is (sequence b, KV head kh, split s). It streams the keys of its
// split once, kBlockK at a time, for all G * Tq query rows that share the KV
// head (the cache is read once per group, not once per query head), with a
// running max, sum and float32 accumulator per row (online softmax). With
// one split the item writes the output; with more, each item writes its
// normalized partial output and logsumexp, and a second pass combines the
// splits of every row by their logsumexp.
#include "cpu/decode_attention.h"

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

namespace jaxcraft {
namespace {

using namespace cpu;  // NOLINT: the shared row arithmetic and threading

// A kBlockK x H float tile of K and of V (32 KiB each at H = 128) stays in a
// core's L2 cache next to the G * Tq rows of Q and accumulators.
constexpr int64_t kBlockK = 64;

// Splits only serve to occupy every thread: a few items per thread even out
// ragged lengths, and a split shorter than this many keys costs more in its
// partial write and combine than it saves.
constexpr int64_t kItemsPerThread = 4;
constexpr int64_t kMinKeysPerSplit = 256;

// Keys of sequence b seen by query token t, and the keys any token of the
// sequence sees (the span the splits divide).
struct Visibility {
  const DecodeParams& p;

  int64_t length(int64_t b) const { return clamp_kv_length(p.kv_lengths[b], p.capacity()); }

  KeyRange row(int64_t len, int64_t t) const {
    const int64_t pos = len - p.seqlen_q + t;
    if (pos < 0) return {};
    const int64_t begin = p.window_left >= 0 ? std::max<int64_t>(0, pos - p.window_left) : 0;
    return {begin, std::min(pos + 1, len)};
  }

  KeyRange span(int64_t len) const {
    const int64_t begin =
        p.window_left >= 0 ? std::max<int64_t>(0, len - p.seqlen_q - p.window_left) : 0;
    return {begin, len};
  }
};

// Key j's row of KV head kh in the paged view (contract/decode.h), or null when the
// block table names a page outside the cache (then the key is masked).
template <typename Elem>
const Elem* key_row(const DecodeParams& p, const Elem* base, int64_t b, int64_t j, int64_t kh) {
  int64_t page = b, offset = j;
  if (p.paged) {
    page = p.block_tables[b * p.max_pages + j / p.page_size];
    offset = j % p.page_size;
    if (page < 0 || page >= p.num_pages) return nullptr;
  }
  return base + ((page * p.page_size + offset) * p.num_kv_heads + kh) * p.head_dim;
}

// Where the split partials of row (b, t, n) live: split-major, so a split's
// rows are contiguous.
struct Partials {
  const DecodeParams& p;
  float* o;
  float* lse;

  int64_t row(int64_t split, int64_t b, int64_t t, int64_t n) const {
    return ((split * p.batch + b) * p.seqlen_q + t) * p.num_heads + n;
  }
};

template <typename Elem>
class SplitWorker {
 public:
  SplitWorker(const DecodeParams& p, int64_t splits, const Partials& partials)
      : p_(p), vis_{p}, splits_(splits), partials_(partials), G_(p.group()), H_(p.head_dim),
        rows_(p.rows_per_kv_head()), q_(rows_ * H_), acc_(rows_ * H_), k_(kBlockK * H_),
        v_(kBlockK * H_), row_max_(rows_), row_sum_(rows_), scores_(rows_ * kBlockK),
        key_ok_(kBlockK) {}

  void operator()(int64_t item) {
    const int64_t b = item / (p_.num_kv_heads * splits_);
    const int64_t kh = (item / splits_) % p_.num_kv_heads;
    const int64_t split = item % splits_;
    const int64_t len = vis_.length(b);
    const KeyRange span = vis_.span(len);
    const int64_t chunk = ceil_div(std::max<int64_t>(span.end - span.begin, 0), splits_);
    const KeyRange keys{span.begin + split * chunk,
                        std::min(span.end, span.begin + (split + 1) * chunk)};

    std::fill(row_max_.begin(), row_max_.end(), kNegInf);
    std::fill(row_sum_.begin(), row_sum_.end(), 0.f);
    std::fill(acc_.begin(), acc_.end(), 0.f);
    if (!keys.empty()) {
      for (int64_t r = 0; r < rows_; ++r) load_row(q_ptr(b, r / G_, kh * G_ + r % G_), H_, &q_[r * H_]);
    }
    const auto* k = static_cast<const Elem*>(p_.k);
    const auto* v = static_cast<const Elem*>(p_.v);
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
      const int64_t cols = std::min(kBlockK, keys.end - j0);
      for (int64_t c = 0; c < cols; ++c) {
        const Elem* k_row = key_row(p_, k, b, j0 + c, kh);
        key_ok_[c] = k_row != nullptr;
        if (!key_ok_[c]) {  // zeros: P V adds its zero weight times this row
          std::fill_n(&v_[c * H_], H_, 0.f);
          continue;
        }
        load_row(k_row, H_, &k_[c * H_]);
        load_row(key_row(p_, v, b, j0 + c, kh), H_, &v_[c * H_]);
      }
      update_block(len, j0, cols);
    }
    write(b, kh, split);
  }

 private:
  const Elem* q_ptr(int64_t b, int64_t t, int64_t n) const {
    return static_cast<const Elem*>(p_.q) + ((b * p_.seqlen_q + t) * p_.num_heads + n) * H_;
  }

  float soft_capped(float x) const {
    return p_.soft_cap > 0.f ? p_.soft_cap * std::tanh(x / p_.soft_cap) : x;
  }

  // Keys [j0, j0 + cols) against every row: each row's logits and online
  // softmax step on the keys it sees (the others, and masked keys, get
  // weight 0), then O += P V as one tile product.
  void update_block(int64_t len, int64_t j0, int64_t cols) {
    for (int64_t r = 0; r < rows_; ++r) {
      float* x = &scores_[r * kBlockK];
      const KeyRange seen = vis_.row(len, r / G_);
      int64_t c0 = std::clamp(seen.begin - j0, int64_t{0}, cols);
      int64_t c1 = std::clamp(seen.end - j0, c0, cols);
      dot_rows(&q_[r * H_], k_.data(), H_, c0, c1, p_.scale, x);
      for (int64_t c = c0; c < c1; ++c) x[c] = key_ok_[c] ? soft_capped(x[c]) : kNegInf;
      if (c0 == c1 || !online_softmax_step(row_max_[r], row_sum_[r], &acc_[r * H_], H_, x, c0, c1))
        c0 = c1 = 0;  // no visible key yet: a zero row
      std::fill(x, x + c0, 0.f);
      std::fill(x + c1, x + cols, 0.f);
    }
    gemm(rows_, H_, cols, {scores_.data(), kBlockK, 1}, v_.data(), H_, 1.f, true, acc_.data(), H_);
  }

  // Rows that saw no key: o = 0 (and lse = -inf for a partial).
  void write(int64_t b, int64_t kh, int64_t split) {
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t t = r / G_, n = kh * G_ + r % G_;
      const bool has_keys = row_sum_[r] != 0.f;  // NaN (a NaN input) propagates
      const float inv_sum = has_keys ? 1.f / row_sum_[r] : 0.f;
      const float* acc = &acc_[r * H_];
      if (splits_ == 1) {
        Elem* o = static_cast<Elem*>(p_.o) + ((b * p_.seqlen_q + t) * p_.num_heads + n) * H_;
        store_scaled_row(acc, inv_sum, H_, o);
        continue;
      }
      const int64_t row = partials_.row(split, b, t, n);
      partials_.lse[row] = has_keys ? row_max_[r] + std::log(row_sum_[r]) : kNegInf;
      float* o = partials_.o + row * H_;
      store_scaled_row(acc, inv_sum, H_, o);
    }
  }

  const DecodeParams& p_;
  Visibility vis_;
  int64_t splits_;
  Partials partials_;
  int64_t G_, H_, rows_;
  std::vector<float> q_, acc_, k_, v_;
  std::vector<float> row_max_, row_sum_, scores_;
  std::vector<char> key_ok_;
};

// o[b, t, n] = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M), M = max_s lse_s;
// splits with lse = -inf (no visible key) are skipped, never multiplied.
template <typename Elem>
void combine(const DecodeParams& p, int64_t splits, const Partials& partials,
             const TaskRunner* runner) {
  const int64_t H = p.head_dim;
  const int64_t rows = p.batch * p.seqlen_q * p.num_heads;
  for_each_item(runner, rows, static_cast<double>(splits * H), [&] {
    return [&, acc = std::vector<float>(H)](int64_t row) mutable {
      float lse_max = kNegInf;  // NaN once any split's is (a NaN input): it then reaches o
      for (int64_t s = 0; s < splits; ++s) {
        const float lse = partials.lse[s * rows + row];
        if (lse != lse || lse > lse_max) lse_max = lse;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      float total = 0.f;
      for (int64_t s = 0; s < splits && lse_max != kNegInf; ++s) {
        const float lse = partials.lse[s * rows + row];
        if (lse == kNegInf) continue;
        const float weight = std::exp(lse - lse_max);
        total += weight;
        const float* o = partials.o + (s * rows + row) * H;
        for (int64_t h = 0; h < H; ++h) acc[h] += weight * o[h];
      }
      const float inv = total != 0.f ? 1.f / total : 0.f;
      Elem* out = static_cast<Elem*>(p.o) + row * H;
      store_scaled_row(acc.data(), inv, H, out);
    };
  });
}

// Splits per (b, kh): enough items for every thread, none shorter than
// kMinKeysPerSplit keys of the longest span a sequence can have.
int64_t num_splits(const DecodeParams& p, const TaskRunner* runner) {
  const int64_t base = p.batch * p.num_kv_heads;
  int64_t span = p.capacity();
  if (p.window_left >= 0) span = std::min(span, p.seqlen_q + p.window_left);
  const int64_t wanted = ceil_div(kItemsPerThread * num_workers(runner), std::max<int64_t>(base, 1));
  return std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, span / kMinKeysPerSplit));
}

template <typename Elem>
void run(const DecodeParams& p, const TaskRunner* runner) {
  const int64_t splits = num_splits(p, runner);
  const int64_t rows = p.batch * p.seqlen_q * p.num_heads;
  std::vector<float> part_o, part_lse;
  if (splits > 1) {
    part_o.resize(splits * rows * p.head_dim);
    part_lse.resize(splits * rows);
  }
  const Partials partials{p, part_o.data(), part_lse.data()};
  const int64_t span = std::min(p.capacity(), p.window_left >= 0 ? p.seqlen_q + p.window_left
                                                                  : p.capacity());
  const double work = static_cast<double>(p.rows_per_kv_head()) * p.head_dim * 2 *
                      ceil_div(std::max<int64_t>(span, 1), splits);
  for_each_item(runner, p.batch * p.num_kv_heads * splits, work,
                [&] { return SplitWorker<Elem>(p, splits, partials); });
  if (splits > 1) combine<Elem>(p, splits, partials, runner);
}

}  // namespace

void decode_attention_cpu(const DecodeParams& p, const TaskRunner* runner) {
  if (p.batch * p.seqlen_q * p.num_heads * p.head_dim == 0) return;
  dispatch_cpu_dtype(p.dtype, [&](auto x) { return run<decltype(x)>(p, runner); });
}

}  // namespace jaxcraft
