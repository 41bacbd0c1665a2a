// FFI handlers for flash attention: buffers and attributes in, an
// AttentionFwdParams / AttentionBwdParams out to the CPU kernel or the CUDA
// launcher. Shapes were validated in Python; these checks guard the ABI.
#include "common/ffi_buffers.h"
#include "common/ffi_task_runner.h"
#include "cpu/attention.h"
#include "ffi/handlers.h"
#ifdef JAXCRAFT_WITH_CUDA
#include "common/cuda_check.h"
#include "kernels/attention/launch.h"
#endif

namespace jaxcraft {
namespace {

struct MaskAttrs {
  bool causal;
  int64_t offset, window_left, window_right;
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

AttentionMask mask_of(const MaskAttrs& a, ffi::Buffer<ffi::S32> q_lengths,
                      ffi::Buffer<ffi::S32> kv_lengths) {
  AttentionMask m;
  m.causal = a.causal;
  m.offset = a.offset;
  m.window_left = a.window_left;
  m.window_right = a.window_right;
  m.q_lengths = static_cast<const int32_t*>(data_or_null(q_lengths));
  m.kv_lengths = static_cast<const int32_t*>(data_or_null(kv_lengths));
  return m;
}

// The fields the forward and backward share: shape, mask, dtype, q/k/v.
template <typename Params>
ffi::Error fill_common(Params& p, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                       const ffi::AnyBuffer& v, ffi::Buffer<ffi::S32> q_lengths,
                       ffi::Buffer<ffi::S32> kv_lengths, float scale, const MaskAttrs& mask) {
  auto shape = shape_of(q, k, v);
  if (shape.has_error()) return shape.error();
  const auto dtype = to_dtype(q.element_type());
  if (!dtype) return ffi::Error::InvalidArgument("jaxcraft: attention: q must be float32, bfloat16 or float16");
  p.shape = shape.value();
  p.mask = mask_of(mask, q_lengths, kv_lengths);
  p.dtype = *dtype;
  p.scale = scale;
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  return ffi::Error::Success();
}

ffi::ErrorOr<AttentionFwdParams> fwd_params(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                            ffi::Buffer<ffi::S32> q_lengths,
                                            ffi::Buffer<ffi::S32> kv_lengths,
                                            ffi::Result<ffi::AnyBuffer> o,
                                            ffi::Result<ffi::Buffer<ffi::F32>> lse, float scale,
                                            const MaskAttrs& mask) {
  AttentionFwdParams p;
  if (auto e = fill_common(p, q, k, v, q_lengths, kv_lengths, scale, mask); e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  p.o = o->untyped_data();
  p.lse = lse->typed_data();
  return p;
}

ffi::ErrorOr<AttentionBwdParams> bwd_params(
    ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o,
    ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer d_o, ffi::Buffer<ffi::S32> q_lengths,
    ffi::Buffer<ffi::S32> kv_lengths, ffi::Result<ffi::AnyBuffer> dq,
    ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
    ffi::Result<ffi::Buffer<ffi::F32>> delta, ffi::Result<ffi::Buffer<ffi::F32>> dq_accum,
    float scale, const MaskAttrs& mask, bool deterministic) {
  AttentionBwdParams p;
  if (auto e = fill_common(p, q, k, v, q_lengths, kv_lengths, scale, mask); e.failure())
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
  return p;
}

// Argument lists shared by the CPU and CUDA handlers; `b` carries what comes
// first (the thread pool on CPU, the stream on CUDA).
template <typename Binding>
auto with_mask_attrs(Binding b) {
  return std::move(b)
      .template Attr<float>("scale")
      .template Attr<bool>("causal")
      .template Attr<int64_t>("offset")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right");
}

template <typename Binding>
auto fwd_binding(Binding b) {
  return with_mask_attrs(std::move(b)
                             .template Arg<ffi::AnyBuffer>()         // q
                             .template Arg<ffi::AnyBuffer>()         // k
                             .template Arg<ffi::AnyBuffer>()         // v
                             .template Arg<ffi::Buffer<ffi::S32>>()  // q lengths (empty: none)
                             .template Arg<ffi::Buffer<ffi::S32>>()  // kv lengths (empty: none)
                             .template Ret<ffi::AnyBuffer>()         // o
                             .template Ret<ffi::Buffer<ffi::F32>>());  // lse
}

template <typename Binding>
auto bwd_binding(Binding b) {
  return with_mask_attrs(std::move(b)
                             .template Arg<ffi::AnyBuffer>()         // q
                             .template Arg<ffi::AnyBuffer>()         // k
                             .template Arg<ffi::AnyBuffer>()         // v
                             .template Arg<ffi::AnyBuffer>()         // o
                             .template Arg<ffi::Buffer<ffi::F32>>()  // lse
                             .template Arg<ffi::AnyBuffer>()         // dO
                             .template Arg<ffi::Buffer<ffi::S32>>()  // q lengths
                             .template Arg<ffi::Buffer<ffi::S32>>()  // kv lengths
                             .template Ret<ffi::AnyBuffer>()         // dq
                             .template Ret<ffi::AnyBuffer>()         // dk
                             .template Ret<ffi::AnyBuffer>()         // dv
                             .template Ret<ffi::Buffer<ffi::F32>>()  // scratch: delta
                             .template Ret<ffi::Buffer<ffi::F32>>())  // scratch: dq_accum
      .template Attr<bool>("deterministic");
}

#define JAXCRAFT_FWD_ARGS                                                                    \
  ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::S32> q_lengths,     \
      ffi::Buffer<ffi::S32> kv_lengths, ffi::Result<ffi::AnyBuffer> o,                       \
      ffi::Result<ffi::Buffer<ffi::F32>> lse, float scale, bool causal, int64_t offset,      \
      int64_t window_left, int64_t window_right
#define JAXCRAFT_BWD_ARGS                                                                    \
  ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o,                    \
      ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer d_o, ffi::Buffer<ffi::S32> q_lengths,        \
      ffi::Buffer<ffi::S32> kv_lengths, ffi::Result<ffi::AnyBuffer> dq,                      \
      ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,                        \
      ffi::Result<ffi::Buffer<ffi::F32>> delta, ffi::Result<ffi::Buffer<ffi::F32>> dq_accum, \
      float scale, bool causal, int64_t offset, int64_t window_left, int64_t window_right,   \
      bool deterministic
#define JAXCRAFT_FWD_PARAMS                                            \
  fwd_params(q, k, v, q_lengths, kv_lengths, o, lse, scale,            \
             MaskAttrs{causal, offset, window_left, window_right})
#define JAXCRAFT_BWD_PARAMS                                                                  \
  bwd_params(q, k, v, o, lse, d_o, q_lengths, kv_lengths, dq, dk, dv, delta, dq_accum, scale, \
             MaskAttrs{causal, offset, window_left, window_right}, deterministic)

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_attention_fwd_cpu, jaxcraft::attention_fwd_cpu_impl,
                              jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_attention_bwd_cpu, jaxcraft::attention_bwd_cpu_impl,
                              jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
#ifdef JAXCRAFT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_attention_fwd_cuda, jaxcraft::attention_fwd_cuda_impl,
    jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_attention_bwd_cuda, jaxcraft::attention_bwd_cuda_impl,
    jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
#endif
