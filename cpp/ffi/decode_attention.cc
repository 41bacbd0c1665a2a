// FFI handlers for decode attention: buffers and attributes in, a
// DecodeParams out to the CPU kernel or the CUDA launcher. Shapes were
// validated in Python; these checks guard the ABI.
#include "common/ffi/buffers.h"
#include "common/ffi/task_runner.h"
#include "cpu/decode_attention.h"
#include "ffi/handlers.h"
#ifdef JAXCRAFT_WITH_CUDA
#include "common/ffi/cuda_check.h"
#include "kernels/decode/launch.h"
#endif

namespace jaxcraft {
namespace {

struct DecodeAttrs {
  float scale, soft_cap;
  int64_t window_left;
  bool paged;
};

ffi::ErrorOr<DecodeParams> decode_params(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                         ffi::Buffer<ffi::S32> lengths,
                                         ffi::Buffer<ffi::S32> block_tables,
                                         ffi::Result<ffi::AnyBuffer> o,
                                         ffi::Result<ffi::Buffer<ffi::F32>> partial_o,
                                         ffi::Result<ffi::Buffer<ffi::F32>> partial_lse,
                                         const DecodeAttrs& a) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return invalid("decode attention expects q [B,Tq,N,H] and 4-D k/v caches");
  for (int i = 0; i < 4; ++i)
    if (kd[i] != vd[i]) return invalid("decode attention: key and value caches differ in shape");
  const auto dtype = to_dtype(q.element_type());
  if (!dtype || q.element_type() != k.element_type() || q.element_type() != v.element_type())
    return invalid("decode attention: q, k, v must share a float32/bfloat16/float16 dtype");
  DecodeParams p;
  p.dtype = *dtype;
  p.batch = qd[0];
  p.seqlen_q = qd[1];
  p.num_heads = qd[2];
  p.head_dim = qd[3];
  p.num_kv_heads = kd[2];
  if (kd[3] != p.head_dim || p.num_kv_heads == 0 || p.num_heads % p.num_kv_heads != 0)
    return invalid("decode attention: q and cache shapes are inconsistent");
  if (lengths.element_count() != size_t(p.batch))
    return invalid("decode attention: need one kv length per sequence");
  p.paged = a.paged;
  p.page_size = kd[1];
  if (a.paged) {
    const auto td = block_tables.dimensions();
    if (td.size() != 2 || td[0] != p.batch)
      return invalid("decode attention: block_tables must be [B, max_pages]");
    p.num_pages = kd[0];
    p.max_pages = td[1];
    p.block_tables = static_cast<const int32_t*>(data_or_null(block_tables));
  } else {
    if (kd[0] != p.batch) return invalid("decode attention: contiguous caches must be [B,S,K,H]");
    p.num_pages = p.batch;
    p.max_pages = 1;
  }
  p.scale = a.scale;
  p.soft_cap = a.soft_cap;
  p.window_left = a.window_left;
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  p.kv_lengths = lengths.typed_data();
  p.o = o->untyped_data();
  const auto pd = partial_o->dimensions(), ld = partial_lse->dimensions();
  if (pd.size() != 5 || ld.size() != 4 || pd[0] != ld[0])
    return invalid("decode attention: split scratch must be [splits,B,Tq,N,H] and [splits,B,Tq,N]");
  p.max_splits = pd[0];
  p.partial_o = static_cast<float*>(data_or_null(*partial_o));
  p.partial_lse = static_cast<float*>(data_or_null(*partial_lse));
  return p;
}

template <typename Binding>
auto decode_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // q
      .template Arg<ffi::AnyBuffer>()          // key cache
      .template Arg<ffi::AnyBuffer>()          // value cache
      .template Arg<ffi::Buffer<ffi::S32>>()   // kv lengths
      .template Arg<ffi::Buffer<ffi::S32>>()   // block tables (empty: contiguous)
      .template Ret<ffi::AnyBuffer>()          // o
      .template Ret<ffi::Buffer<ffi::F32>>()   // scratch: split partial outputs
      .template Ret<ffi::Buffer<ffi::F32>>()   // scratch: split partial logsumexp
      .template Attr<float>("scale")
      .template Attr<float>("soft_cap")
      .template Attr<int64_t>("window_left")
      .template Attr<bool>("paged");
}

#define JAXCRAFT_DECODE_ARGS                                                                  \
  ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::S32> lengths,        \
      ffi::Buffer<ffi::S32> block_tables, ffi::Result<ffi::AnyBuffer> o,                      \
      ffi::Result<ffi::Buffer<ffi::F32>> partial_o,                                           \
      ffi::Result<ffi::Buffer<ffi::F32>> partial_lse, float scale, float soft_cap,            \
      int64_t window_left, bool paged
#define JAXCRAFT_DECODE_PARAMS                                                   \
  decode_params(q, k, v, lengths, block_tables, o, partial_o, partial_lse,       \
                DecodeAttrs{scale, soft_cap, window_left, paged})

ffi::Error decode_attention_cpu_impl(ffi::ThreadPool pool, JAXCRAFT_DECODE_ARGS) {
  auto p = JAXCRAFT_DECODE_PARAMS;
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  decode_attention_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

#ifdef JAXCRAFT_WITH_CUDA
ffi::Error decode_attention_cuda_impl(cudaStream_t stream, JAXCRAFT_DECODE_ARGS) {
  auto p = JAXCRAFT_DECODE_PARAMS;
  if (p.has_error()) return p.error();
  if (const char* why = decode_attention_cuda_unsupported(p.value()))
    return ffi::Error::InvalidArgument(std::string("jaxcraft: CUDA decode attention: ") + why);
  return cuda_error(launch_decode_attention(p.value(), stream), "decode attention launch");
}
#endif

}  // namespace
}  // namespace jaxcraft

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_decode_attention_fwd_cpu,
                              jaxcraft::decode_attention_cpu_impl,
                              jaxcraft::decode_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
#ifdef JAXCRAFT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_decode_attention_fwd_cuda, jaxcraft::decode_attention_cuda_impl,
    jaxcraft::decode_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
#endif
