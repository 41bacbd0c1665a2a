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

struct MaskAttrs {
  bool causal;
  int64_t offset, window_left, window_right;
};

struct ScoreAttrs {
  float softcap, dropout_rate;
  bool dropout_broadcast;
};

// The optional operands after the lengths, each a zero-sized buffer when
// absent: bias and mask [1|B, 1|N, T, S]; segment ids [B, T] / [B, S] and
// their tile ranges; the dropout key (uint32 [2]).
struct Extras {
  ffi::AnyBuffer bias;
  ffi::Buffer<ffi::PRED> mask;
  ffi::Buffer<ffi::S32> q_segment_ids, kv_segment_ids, segment_key_range, segment_query_range;
  ffi::Buffer<ffi::U32> dropout_key;
};

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

ffi::Error fill_extras(const Extras& x, const AttentionShape& s, DType dtype, AttentionMask* m,
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
                       const ffi::AnyBuffer& v, ffi::Buffer<ffi::S32> q_lengths,
                       ffi::Buffer<ffi::S32> kv_lengths, const Extras& extras, float scale,
                       const MaskAttrs& mask, const ScoreAttrs& scores) {
  auto shape = shape_of(q, k, v);
  if (shape.has_error()) return shape.error();
  const auto dtype = to_dtype(q.element_type());
  if (!dtype) return ffi::Error::InvalidArgument("jaxcraft: attention: q must be float32, bfloat16 or float16");
  p.shape = shape.value();
  p.mask.causal = mask.causal;
  p.mask.offset = mask.offset;
  p.mask.window_left = mask.window_left;
  p.mask.window_right = mask.window_right;
  p.mask.q_lengths = static_cast<const int32_t*>(data_or_null(q_lengths));
  p.mask.kv_lengths = static_cast<const int32_t*>(data_or_null(kv_lengths));
  p.scores.softcap = scores.softcap;
  p.scores.dropout_rate = scores.dropout_rate;
  p.scores.dropout_broadcast = scores.dropout_broadcast;
  if (auto e = fill_extras(extras, p.shape, *dtype, &p.mask, &p.scores); e.failure()) return e;
  p.dtype = *dtype;
  p.scale = scale;
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  return ffi::Error::Success();
}

ffi::ErrorOr<AttentionFwdParams> fwd_params(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                            ffi::Buffer<ffi::S32> q_lengths,
                                            ffi::Buffer<ffi::S32> kv_lengths, const Extras& extras,
                                            ffi::Result<ffi::AnyBuffer> o,
                                            ffi::Result<ffi::Buffer<ffi::F32>> lse,
                                            ffi::Result<ffi::Buffer<ffi::U32>> tile_counter,
                                            float scale, const MaskAttrs& mask,
                                            const ScoreAttrs& scores) {
  AttentionFwdParams p;
  if (auto e = fill_common(p, q, k, v, q_lengths, kv_lengths, extras, scale, mask, scores);
      e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  p.o = o->untyped_data();
  p.lse = lse->typed_data();
  p.tile_counter = tile_counter->element_count() > 0 ? tile_counter->typed_data() : nullptr;
  return p;
}

ffi::ErrorOr<AttentionBwdParams> bwd_params(
    ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o,
    ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer d_o, ffi::Buffer<ffi::S32> q_lengths,
    ffi::Buffer<ffi::S32> kv_lengths, const Extras& extras, ffi::Result<ffi::AnyBuffer> dq,
    ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
    ffi::Result<ffi::Buffer<ffi::F32>> delta, ffi::Result<ffi::Buffer<ffi::F32>> dq_accum,
    ffi::Result<ffi::AnyBuffer> dbias, float scale, const MaskAttrs& mask,
    const ScoreAttrs& scores, bool deterministic) {
  AttentionBwdParams p;
  if (auto e = fill_common(p, q, k, v, q_lengths, kv_lengths, extras, scale, mask, scores);
      e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  p.deterministic = deterministic;
  p.o = o.untyped_data();
  p.lse = lse.typed_data();
  p.d_o = d_o.untyped_data();
  p.dq = dq->untyped_data();
  p.dk = dk->untyped_data();
  p.dv = dv->untyped_data();
  p.delta = delta->typed_data();
  p.dq_accum = static_cast<float*>(data_or_null(*dq_accum));
  if (!deterministic && !p.dq_accum && p.shape.seqlen_q > 0)
    return invalid("attention backward: the atomic dQ path needs the dq_accum scratch");
  if (p.scores.bias) {
    if (dbias->element_count() != extras.bias.element_count())
      return invalid("attention backward: dbias must have the bias's shape");
    // float32, or the bias's own dtype where each element has one writer.
    p.dbias_f32 = dbias->element_type() == ffi::F32;
    if (!p.dbias_f32 &&
        (dbias->element_type() != extras.bias.element_type() || dbias_shared(p.scores, p.shape)))
      return invalid("attention backward: dbias must be float32, or the bias's dtype when the "
                     "bias broadcasts over no batch or head axis");
    p.dbias = dbias->untyped_data();
  }
  return p;
}

// Argument lists shared by the CPU and CUDA handlers; `b` carries what comes
// first (the thread pool on CPU, the stream on CUDA).
template <typename Binding>
auto with_extras(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()           // bias
      .template Arg<ffi::Buffer<ffi::PRED>>()   // mask
      .template Arg<ffi::Buffer<ffi::S32>>()    // q segment ids
      .template Arg<ffi::Buffer<ffi::S32>>()    // kv segment ids
      .template Arg<ffi::Buffer<ffi::S32>>()    // segment key ranges
      .template Arg<ffi::Buffer<ffi::S32>>()    // segment query ranges
      .template Arg<ffi::Buffer<ffi::U32>>();   // dropout key
}

template <typename Binding>
auto with_attrs(Binding b) {
  return std::move(b)
      .template Attr<float>("scale")
      .template Attr<bool>("causal")
      .template Attr<int64_t>("offset")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right")
      .template Attr<float>("softcap")
      .template Attr<float>("dropout_rate")
      .template Attr<bool>("dropout_broadcast");
}

template <typename Binding>
auto fwd_binding(Binding b) {
  return with_attrs(with_extras(std::move(b)
                                    .template Arg<ffi::AnyBuffer>()           // q
                                    .template Arg<ffi::AnyBuffer>()           // k
                                    .template Arg<ffi::AnyBuffer>()           // v
                                    .template Arg<ffi::Buffer<ffi::S32>>()    // q lengths
                                    .template Arg<ffi::Buffer<ffi::S32>>())   // kv lengths
                        .template Ret<ffi::AnyBuffer>()                        // o
                        .template Ret<ffi::Buffer<ffi::F32>>()                 // lse
                        .template Ret<ffi::Buffer<ffi::U32>>());               // scratch: tile counter
}

template <typename Binding>
auto bwd_binding(Binding b) {
  return with_attrs(with_extras(std::move(b)
                                    .template Arg<ffi::AnyBuffer>()           // q
                                    .template Arg<ffi::AnyBuffer>()           // k
                                    .template Arg<ffi::AnyBuffer>()           // v
                                    .template Arg<ffi::AnyBuffer>()           // o
                                    .template Arg<ffi::Buffer<ffi::F32>>()    // lse
                                    .template Arg<ffi::AnyBuffer>()           // dO
                                    .template Arg<ffi::Buffer<ffi::S32>>()    // q lengths
                                    .template Arg<ffi::Buffer<ffi::S32>>())   // kv lengths
                        .template Ret<ffi::AnyBuffer>()                        // dq
                        .template Ret<ffi::AnyBuffer>()                        // dk
                        .template Ret<ffi::AnyBuffer>()                        // dv
                        .template Ret<ffi::Buffer<ffi::F32>>()                 // scratch: delta
                        .template Ret<ffi::Buffer<ffi::F32>>()                 // scratch: dq_accum
                        .template Ret<ffi::AnyBuffer>())                       // dbias
      .template Attr<bool>("deterministic");
}

#define JAXCRAFT_EXTRA_ARGS                                                                     \
  ffi::AnyBuffer bias, ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::S32> q_segment_ids,       \
      ffi::Buffer<ffi::S32> kv_segment_ids, ffi::Buffer<ffi::S32> segment_key_range,           \
      ffi::Buffer<ffi::S32> segment_query_range, ffi::Buffer<ffi::U32> dropout_key
#define JAXCRAFT_ATTRS                                                                          \
  float scale, bool causal, int64_t offset, int64_t window_left, int64_t window_right,         \
      float softcap, float dropout_rate, bool dropout_broadcast
#define JAXCRAFT_FWD_ARGS                                                                    \
  ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::S32> q_lengths,     \
      ffi::Buffer<ffi::S32> kv_lengths, JAXCRAFT_EXTRA_ARGS, ffi::Result<ffi::AnyBuffer> o,  \
      ffi::Result<ffi::Buffer<ffi::F32>> lse, ffi::Result<ffi::Buffer<ffi::U32>> tile_counter, \
      JAXCRAFT_ATTRS
#define JAXCRAFT_BWD_ARGS                                                                    \
  ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o,                    \
      ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer d_o, ffi::Buffer<ffi::S32> q_lengths,        \
      ffi::Buffer<ffi::S32> kv_lengths, JAXCRAFT_EXTRA_ARGS, ffi::Result<ffi::AnyBuffer> dq, \
      ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,                        \
      ffi::Result<ffi::Buffer<ffi::F32>> delta, ffi::Result<ffi::Buffer<ffi::F32>> dq_accum, \
      ffi::Result<ffi::AnyBuffer> dbias, JAXCRAFT_ATTRS, bool deterministic
#define JAXCRAFT_EXTRAS                                                                   \
  Extras{bias, mask, q_segment_ids, kv_segment_ids, segment_key_range, segment_query_range, \
         dropout_key}
#define JAXCRAFT_MASK_AND_SCORES                      \
  MaskAttrs{causal, offset, window_left, window_right}, \
      ScoreAttrs{softcap, dropout_rate, dropout_broadcast}
#define JAXCRAFT_FWD_PARAMS \
  fwd_params(q, k, v, q_lengths, kv_lengths, JAXCRAFT_EXTRAS, o, lse, tile_counter, scale, \
             JAXCRAFT_MASK_AND_SCORES)
#define JAXCRAFT_BWD_PARAMS                                                                  \
  bwd_params(q, k, v, o, lse, d_o, q_lengths, kv_lengths, JAXCRAFT_EXTRAS, dq, dk, dv, delta, \
             dq_accum, dbias, scale, JAXCRAFT_MASK_AND_SCORES, deterministic)

ffi::Error attention_fwd_cpu_impl(ffi::ThreadPool pool, JAXCRAFT_FWD_ARGS) {
  auto p = JAXCRAFT_FWD_PARAMS;
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  attention_fwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

ffi::Error attention_bwd_cpu_impl(ffi::ThreadPool pool, JAXCRAFT_BWD_ARGS) {
  auto p = JAXCRAFT_BWD_PARAMS;
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

ffi::Error attention_fwd_cuda_impl(cudaStream_t stream, JAXCRAFT_FWD_ARGS) {
  auto p = JAXCRAFT_FWD_PARAMS;
  if (p.has_error()) return p.error();
  if (auto e = unsupported_on_cuda(p.value().shape, p.value().dtype); e.failure()) return e;
  return cuda_error(launch_attention_fwd(p.value(), stream), "attention forward launch");
}

ffi::Error attention_bwd_cuda_impl(cudaStream_t stream, JAXCRAFT_BWD_ARGS) {
  auto p = JAXCRAFT_BWD_PARAMS;
  if (p.has_error()) return p.error();
  if (auto e = unsupported_on_cuda(p.value().shape, p.value().dtype); e.failure()) return e;
  return cuda_error(launch_attention_bwd(p.value(), stream), "attention backward launch");
}
#endif

}  // namespace
}  // namespace jaxcraft

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_attention_fwd_v3_cpu, jaxcraft::attention_fwd_cpu_impl,
                              jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_attention_bwd_v2_cpu, jaxcraft::attention_bwd_cpu_impl,
                              jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
#ifdef JAXCRAFT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_attention_fwd_v3_cuda, jaxcraft::attention_fwd_cuda_impl,
    jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_attention_bwd_v2_cuda, jaxcraft::attention_bwd_cuda_impl,
    jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
#endif
