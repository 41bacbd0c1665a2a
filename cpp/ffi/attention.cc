// FFI handlers for flash attention: buffers and attributes in, an
// AttentionFwdParams / AttentionBwdParams out to the CPU kernel or the CUDA
// launcher. Shapes were validated in Python; these checks guard the ABI.
#include "common/ffi/buffers.h"
#include "common/ffi/task_runner.h"
#include "cpu/attention.h"
#include "ffi/handlers.h"
#ifdef JAXCRAFT_WITH_CUDA
#include "common/ffi/cuda_check.h"
#include "kernels/attention/launch.h"
#endif

namespace jaxcraft {
namespace {

// Operand positions, in the order jaxcraft/ops/attention.py passes them
// (`_KERNEL_OPTIONAL` there for the optional ones): the forward's q, k, v, the
// backward's q, k, v, o, lse, dO, then in both the optional operands, each a
// zero-sized buffer when absent: the lengths [B]; bias and mask [1|B, 1|N, T,
// S]; segment ids [B, T] / [B, S] and their tile ranges; the dropout key
// (uint32 [2]).
enum FwdOperand : size_t { kFwdQ, kFwdK, kFwdV, kFwdOptional };
enum BwdOperand : size_t { kBwdQ, kBwdK, kBwdV, kBwdO, kBwdLse, kBwdDo, kBwdOptional };
enum OptionalOperand : size_t {
  kQLengths, kKvLengths, kBias, kMask, kQSegmentIds, kKvSegmentIds, kSegmentKeyRange,
  kSegmentQueryRange, kDropoutKey, kNumOptional
};
enum FwdResult : size_t { kFwdOut, kFwdLse, kFwdTileCounter, kNumFwdResults };
enum BwdResult : size_t { kBwdDq, kBwdDk, kBwdDv, kBwdDelta, kBwdDqAccum, kBwdDbias, kNumBwdResults };

// The attributes (ffi_attrs in jaxcraft/ops/attention.py), decoded by name.
struct AttentionAttrs {
  float scale;
  bool causal;
  int64_t offset, window_left, window_right;
  float softcap, dropout_rate;
  bool dropout_broadcast;
};

struct AttentionBwdAttrs {
  AttentionAttrs common;
  bool deterministic;
};

// Reads operands by position; the first one that fails to decode (a wrong
// dtype, or one missing) is kept for error().
class OperandReader {
 public:
  OperandReader(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets)
      : args_(args), rets_(rets) {}
  template <typename T>
  std::optional<T> arg(size_t i) { return keep(args_.get<T>(i)); }
  // A result's buffer (a view: writing through a copy writes the result).
  template <typename T>
  std::optional<T> ret(size_t i) {
    auto result = keep(rets_.get<T>(i));
    if (!result) return std::nullopt;
    return **result;
  }
  ffi::Error error() const { return error_ ? *error_ : ffi::Error::Success(); }

 private:
  template <typename T>
  std::optional<T> keep(ffi::ErrorOr<T> r) {
    if (r.has_value()) return std::move(r.value());
    if (!error_) error_ = r.error();
    return std::nullopt;
  }
  const ffi::RemainingArgs& args_;
  const ffi::RemainingRets& rets_;
  std::optional<ffi::Error> error_;
};

struct Optional {
  ffi::Buffer<ffi::S32> q_lengths, kv_lengths;
  ffi::AnyBuffer bias;
  ffi::Buffer<ffi::PRED> mask;
  ffi::Buffer<ffi::S32> q_segment_ids, kv_segment_ids, segment_key_range, segment_query_range;
  ffi::Buffer<ffi::U32> dropout_key;
};

// The optional operands from position `first` on.
std::optional<Optional> read_optional(OperandReader& r, size_t first) {
  auto s32 = [&](size_t i) { return r.arg<ffi::Buffer<ffi::S32>>(first + i); };
  auto q_lengths = s32(kQLengths), kv_lengths = s32(kKvLengths);
  auto bias = r.arg<ffi::AnyBuffer>(first + kBias);
  auto mask = r.arg<ffi::Buffer<ffi::PRED>>(first + kMask);
  auto q_seg = s32(kQSegmentIds), kv_seg = s32(kKvSegmentIds);
  auto key_range = s32(kSegmentKeyRange), query_range = s32(kSegmentQueryRange);
  auto dropout_key = r.arg<ffi::Buffer<ffi::U32>>(first + kDropoutKey);
  if (!(q_lengths && kv_lengths && bias && mask && q_seg && kv_seg && key_range && query_range &&
        dropout_key))
    return std::nullopt;
  return Optional{*q_lengths, *kv_lengths, *bias,       *mask,       *q_seg,
                  *kv_seg,    *key_range,  *query_range, *dropout_key};
}

ffi::ErrorOr<AttentionShape> shape_of(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                      const ffi::AnyBuffer& v) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return invalid("attention expects q [B,T,N,H], k and v [B,S,K,H]");
  AttentionShape s;
  s.batch = qd[0];
  s.seqlen_q = qd[1];
  s.num_heads = qd[2];
  s.head_dim = qd[3];
  s.seqlen_k = kd[1];
  s.num_kv_heads = kd[2];
  for (int i = 0; i < 4; ++i)
    if (kd[i] != vd[i]) return invalid("attention: k and v shapes differ");
  if (kd[0] != s.batch || kd[3] != s.head_dim || s.num_kv_heads == 0 ||
      s.num_heads % s.num_kv_heads != 0)
    return invalid("attention: q, k, v shapes are inconsistent");
  if (q.element_type() != k.element_type() || q.element_type() != v.element_type())
    return invalid("attention: q, k, v dtypes differ");
  return s;
}

// Element strides of a [1|B, 1|N, T, S] bias or mask (0 on a broadcast axis);
// false when its shape is not one of those.
template <typename Buffer>
bool broadcast_strides(const Buffer& x, const AttentionShape& s, int64_t* stride_b,
                       int64_t* stride_n) {
  const auto d = x.dimensions();
  if (d.size() != 4 || d[2] != s.seqlen_q || d[3] != s.seqlen_k) return false;
  if ((d[0] != 1 && d[0] != s.batch) || (d[1] != 1 && d[1] != s.num_heads)) return false;
  *stride_n = d[1] == 1 ? 0 : s.seqlen_q * s.seqlen_k;
  *stride_b = d[0] == 1 ? 0 : d[1] * s.seqlen_q * s.seqlen_k;
  return true;
}

ffi::Error fill_optional(const Optional& x, const AttentionShape& s, DType dtype, AttentionMask* m,
                         AttentionScores* sc) {
  auto bad = [](const char* what) {
    return ffi::Error::InvalidArgument(std::string("jaxcraft: attention: ") + what);
  };
  if (x.bias.element_count() > 0) {
    const auto bias_dtype = to_dtype(x.bias.element_type());
    if (!bias_dtype || (*bias_dtype != dtype && *bias_dtype != DType::kF32))
      return bad("bias must have the inputs' dtype or float32");
    if (!broadcast_strides(x.bias, s, &sc->bias_stride_b, &sc->bias_stride_n))
      return bad("bias must be [1|B, 1|N, T, S]");
    sc->bias = x.bias.untyped_data();
    sc->bias_f32 = *bias_dtype == DType::kF32;
  }
  if (x.mask.element_count() > 0) {
    if (!broadcast_strides(x.mask, s, &m->mask_stride_b, &m->mask_stride_n))
      return bad("mask must be [1|B, 1|N, T, S]");
    m->mask = static_cast<const uint8_t*>(x.mask.untyped_data());
  }
  const bool has_segments = x.q_segment_ids.element_count() > 0 || x.kv_segment_ids.element_count() > 0;
  if (has_segments) {
    const int64_t row_blocks = (s.seqlen_q + kSegmentBlock - 1) / kSegmentBlock;
    const int64_t key_blocks = (s.seqlen_k + kSegmentBlock - 1) / kSegmentBlock;
    if (x.q_segment_ids.element_count() != s.batch * s.seqlen_q ||
        x.kv_segment_ids.element_count() != s.batch * s.seqlen_k ||
        x.segment_key_range.element_count() != s.batch * row_blocks * 2 ||
        x.segment_query_range.element_count() != s.batch * key_blocks * 2)
      return bad("segment ids must be [B, T] and [B, S] with their tile ranges");
    m->q_segment_ids = x.q_segment_ids.typed_data();
    m->kv_segment_ids = x.kv_segment_ids.typed_data();
    m->segment_key_range = x.segment_key_range.typed_data();
    m->segment_query_range = x.segment_query_range.typed_data();
  }
  sc->softcap = sc->softcap > 0.f ? sc->softcap : 0.f;
  if (x.dropout_key.element_count() > 0) {
    if (x.dropout_key.element_count() != 2) return bad("the dropout key must be uint32[2]");
    if (!(sc->dropout_rate >= 0.f && sc->dropout_rate < 1.f))
      return bad("dropout_rate must be in [0, 1)");
    sc->dropout_key = x.dropout_key.typed_data();
  } else {
    sc->dropout_rate = 0.f;
  }
  return ffi::Error::Success();
}

// The fields the forward and backward share: shape, mask, scores, dtype, q/k/v.
template <typename Params>
ffi::Error fill_common(Params& p, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                       const ffi::AnyBuffer& v, const Optional& optional, const AttentionAttrs& a) {
  auto shape = shape_of(q, k, v);
  if (shape.has_error()) return shape.error();
  const auto dtype = to_dtype(q.element_type());
  if (!dtype) return ffi::Error::InvalidArgument("jaxcraft: attention: q must be float32, bfloat16 or float16");
  p.shape = shape.value();
  p.mask.causal = a.causal;
  p.mask.offset = a.offset;
  p.mask.window_left = a.window_left;
  p.mask.window_right = a.window_right;
  p.mask.q_lengths = static_cast<const int32_t*>(data_or_null(optional.q_lengths));
  p.mask.kv_lengths = static_cast<const int32_t*>(data_or_null(optional.kv_lengths));
  p.scores.softcap = a.softcap;
  p.scores.dropout_rate = a.dropout_rate;
  p.scores.dropout_broadcast = a.dropout_broadcast;
  if (auto e = fill_optional(optional, p.shape, *dtype, &p.mask, &p.scores); e.failure()) return e;
  p.dtype = *dtype;
  p.scale = a.scale;
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  return ffi::Error::Success();
}

ffi::ErrorOr<AttentionFwdParams> fwd_params(const ffi::RemainingArgs& args,
                                            const ffi::RemainingRets& rets,
                                            const AttentionAttrs& attrs) {
  if (args.size() != kFwdOptional + kNumOptional || rets.size() != kNumFwdResults)
    return invalid("attention forward: wrong number of operands or results");
  OperandReader r(args, rets);
  const auto q = r.arg<ffi::AnyBuffer>(kFwdQ), k = r.arg<ffi::AnyBuffer>(kFwdK),
             v = r.arg<ffi::AnyBuffer>(kFwdV);
  const auto optional = read_optional(r, kFwdOptional);
  const auto o = r.ret<ffi::AnyBuffer>(kFwdOut);
  const auto lse = r.ret<ffi::Buffer<ffi::F32>>(kFwdLse);
  const auto tile_counter = r.ret<ffi::Buffer<ffi::U32>>(kFwdTileCounter);
  if (auto e = r.error(); e.failure()) return ffi::Unexpected<ffi::Error>(std::move(e));
  AttentionFwdParams p;
  if (auto e = fill_common(p, *q, *k, *v, *optional, attrs); e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  p.o = o->untyped_data();
  p.lse = lse->typed_data();
  p.tile_counter = tile_counter->element_count() > 0 ? tile_counter->typed_data() : nullptr;
  return p;
}

ffi::ErrorOr<AttentionBwdParams> bwd_params(const ffi::RemainingArgs& args,
                                            const ffi::RemainingRets& rets,
                                            const AttentionBwdAttrs& attrs) {
  if (args.size() != kBwdOptional + kNumOptional || rets.size() != kNumBwdResults)
    return invalid("attention backward: wrong number of operands or results");
  OperandReader r(args, rets);
  const auto q = r.arg<ffi::AnyBuffer>(kBwdQ), k = r.arg<ffi::AnyBuffer>(kBwdK),
             v = r.arg<ffi::AnyBuffer>(kBwdV), o = r.arg<ffi::AnyBuffer>(kBwdO),
             d_o = r.arg<ffi::AnyBuffer>(kBwdDo);
  const auto lse = r.arg<ffi::Buffer<ffi::F32>>(kBwdLse);
  const auto optional = read_optional(r, kBwdOptional);
  const auto dq = r.ret<ffi::AnyBuffer>(kBwdDq), dk = r.ret<ffi::AnyBuffer>(kBwdDk),
             dv = r.ret<ffi::AnyBuffer>(kBwdDv), dbias = r.ret<ffi::AnyBuffer>(kBwdDbias);
  const auto delta = r.ret<ffi::Buffer<ffi::F32>>(kBwdDelta),
             dq_accum = r.ret<ffi::Buffer<ffi::F32>>(kBwdDqAccum);
  if (auto e = r.error(); e.failure()) return ffi::Unexpected<ffi::Error>(std::move(e));
  AttentionBwdParams p;
  if (auto e = fill_common(p, *q, *k, *v, *optional, attrs.common); e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  p.deterministic = attrs.deterministic;
  p.o = o->untyped_data();
  p.lse = lse->typed_data();
  p.d_o = d_o->untyped_data();
  p.dq = dq->untyped_data();
  p.dk = dk->untyped_data();
  p.dv = dv->untyped_data();
  p.delta = delta->typed_data();
  p.dq_accum = static_cast<float*>(data_or_null(*dq_accum));
  if (!p.deterministic && !p.dq_accum && p.shape.seqlen_q > 0)
    return invalid("attention backward: the atomic dQ path needs the dq_accum scratch");
  if (p.scores.bias) {
    const ffi::AnyBuffer& bias = optional->bias;
    if (dbias->element_count() != bias.element_count())
      return invalid("attention backward: dbias must have the bias's shape");
    // float32, or the bias's own dtype where each element has one writer.
    p.dbias_f32 = dbias->element_type() == ffi::F32;
    if (!p.dbias_f32 &&
        (dbias->element_type() != bias.element_type() || dbias_shared(p.scores, p.shape)))
      return invalid("attention backward: dbias must be float32, or the bias's dtype when the "
                     "bias broadcasts over no batch or head axis");
    p.dbias = dbias->untyped_data();
  }
  return p;
}

// The handlers' signature beyond the context (the thread pool on CPU, the
// stream on CUDA): every operand and result by position, the attributes by name.
template <typename Attrs, typename Binding>
auto operands_and_attrs(Binding b) {
  return std::move(b).RemainingArgs().RemainingRets().template Attrs<Attrs>();
}

ffi::Error attention_fwd_cpu_impl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                                  ffi::RemainingRets rets, AttentionAttrs attrs) {
  auto p = fwd_params(args, rets, attrs);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  attention_fwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

ffi::Error attention_bwd_cpu_impl(ffi::ThreadPool pool, ffi::RemainingArgs args,
                                  ffi::RemainingRets rets, AttentionBwdAttrs attrs) {
  auto p = bwd_params(args, rets, attrs);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  attention_bwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

#ifdef JAXCRAFT_WITH_CUDA
ffi::Error unsupported_on_cuda(const AttentionShape& s, DType dtype) {
  if (const char* why = attention_cuda_unsupported(s, dtype))
    return ffi::Error::InvalidArgument(std::string("jaxcraft: CUDA attention: ") + why);
  return ffi::Error::Success();
}

ffi::Error attention_fwd_cuda_impl(cudaStream_t stream, ffi::RemainingArgs args,
                                   ffi::RemainingRets rets, AttentionAttrs attrs) {
  auto p = fwd_params(args, rets, attrs);
  if (p.has_error()) return p.error();
  if (auto e = unsupported_on_cuda(p.value().shape, p.value().dtype); e.failure()) return e;
  return cuda_error(launch_attention_fwd(p.value(), stream), "attention forward launch");
}

ffi::Error attention_bwd_cuda_impl(cudaStream_t stream, ffi::RemainingArgs args,
                                   ffi::RemainingRets rets, AttentionBwdAttrs attrs) {
  auto p = bwd_params(args, rets, attrs);
  if (p.has_error()) return p.error();
  if (auto e = unsupported_on_cuda(p.value().shape, p.value().dtype); e.failure()) return e;
  return cuda_error(launch_attention_bwd(p.value(), stream), "attention backward launch");
}
#endif

}  // namespace
}  // namespace jaxcraft

namespace ffi = xla::ffi;

#define JAXCRAFT_ATTENTION_ATTRS                                                           \
  ffi::StructMember<float>("scale"), ffi::StructMember<bool>("causal"),                    \
      ffi::StructMember<int64_t>("offset"), ffi::StructMember<int64_t>("window_left"),     \
      ffi::StructMember<int64_t>("window_right"), ffi::StructMember<float>("softcap"),     \
      ffi::StructMember<float>("dropout_rate"), ffi::StructMember<bool>("dropout_broadcast")
XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(jaxcraft::AttentionAttrs, JAXCRAFT_ATTENTION_ATTRS);
XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(jaxcraft::AttentionBwdAttrs, JAXCRAFT_ATTENTION_ATTRS,
                                      ffi::StructMember<bool>("deterministic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_attention_fwd_v3_cpu, jaxcraft::attention_fwd_cpu_impl,
    jaxcraft::operands_and_attrs<jaxcraft::AttentionAttrs>(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_attention_bwd_v2_cpu, jaxcraft::attention_bwd_cpu_impl,
    jaxcraft::operands_and_attrs<jaxcraft::AttentionBwdAttrs>(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
#ifdef JAXCRAFT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_attention_fwd_v3_cuda, jaxcraft::attention_fwd_cuda_impl,
    jaxcraft::operands_and_attrs<jaxcraft::AttentionAttrs>(
        ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_attention_bwd_v2_cuda, jaxcraft::attention_bwd_cuda_impl,
    jaxcraft::operands_and_attrs<jaxcraft::AttentionBwdAttrs>(
        ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
#endif
