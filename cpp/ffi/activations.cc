// FFI handlers for gelu / bias_gelu / swiglu / geglu: buffers and attributes
// in, an ActivationFwdParams / ActivationBwdParams out to the CPU loop or the
// CUDA launcher.
#include "common/ffi/buffers.h"
#include "common/ffi/task_runner.h"
#include "cpu/activations.h"
#include "ffi/handlers.h"
#ifdef JAXCRAFT_WITH_CUDA
#include "common/ffi/cuda_check.h"
#include "kernels/activations/launch.h"
#endif

namespace jaxcraft {
namespace {

ffi::ErrorOr<Activation> to_activation(int32_t code) {
  switch (code) {
    case int32_t(Activation::kGeluTanh): return Activation::kGeluTanh;
    case int32_t(Activation::kGeluErf): return Activation::kGeluErf;
    case int32_t(Activation::kSilu): return Activation::kSilu;
    default: return invalid("activation: unknown activation code " + std::to_string(code));
  }
}

// x: [rows, cols] (ungated) or [rows, 2 cols] (gated); out: [rows, cols].
ffi::Error check_shapes(ffi::AnyBuffer x, ffi::AnyBuffer out, bool gated, const char* out_name) {
  const auto xd = x.dimensions(), od = out.dimensions();
  if (xd.size() != 2 || od.size() != 2) return ffi::Error::InvalidArgument("jaxcraft: activation expects 2-D rows");
  if (xd[0] != od[0] || xd[1] != (gated ? 2 : 1) * od[1])
    return ffi::Error::InvalidArgument(std::string("jaxcraft: activation: x and ") + out_name +
                                       (gated ? " must be [rows, 2 cols] and [rows, cols]"
                                              : " must have the same shape"));
  if (x.element_type() != out.element_type())
    return ffi::Error::InvalidArgument(std::string("jaxcraft: activation: x and ") + out_name +
                                       " must share a dtype");
  return ffi::Error::Success();
}

ffi::ErrorOr<ActivationFwdParams> fwd_params(ffi::AnyBuffer x, ffi::Buffer<ffi::F32> bias,
                                             ffi::Result<ffi::AnyBuffer> y, int32_t activation,
                                             bool gated) {
  const auto dtype = to_dtype(x.element_type());
  if (!dtype) return invalid("activation: x must be float32, bfloat16 or float16");
  if (auto err = check_shapes(x, *y, gated, "y"); err.failure()) return ffi::Unexpected<ffi::Error>(err);
  const auto act = to_activation(activation);
  if (act.has_error()) return ffi::Unexpected<ffi::Error>(act.error());
  ActivationFwdParams p;
  p.dtype = *dtype;
  p.activation = act.value();
  p.gated = gated;
  p.rows = y->dimensions()[0];
  p.cols = y->dimensions()[1];
  p.x = x.untyped_data();
  p.bias = static_cast<const float*>(data_or_null(bias));
  p.y = y->untyped_data();
  if (p.bias && (gated || bias.element_count() != size_t(p.cols)))
    return invalid("activation: bias must have cols elements (and no gating)");
  return p;
}

ffi::ErrorOr<ActivationBwdParams> bwd_params(ffi::AnyBuffer dy, ffi::AnyBuffer x,
                                             ffi::Buffer<ffi::F32> bias,
                                             ffi::Result<ffi::AnyBuffer> dx,
                                             ffi::Result<ffi::Buffer<ffi::F32>> dbias_partial,
                                             int32_t activation, bool gated) {
  const auto dtype = to_dtype(dy.element_type());
  if (!dtype) return invalid("activation backward: dy must be float32, bfloat16 or float16");
  if (auto err = check_shapes(x, dy, gated, "dy"); err.failure()) return ffi::Unexpected<ffi::Error>(err);
  if (dx->element_type() != x.element_type() || dx->element_count() != x.element_count())
    return invalid("activation backward: dx must have the shape and dtype of x");
  const auto act = to_activation(activation);
  if (act.has_error()) return ffi::Unexpected<ffi::Error>(act.error());
  ActivationBwdParams p;
  p.dtype = *dtype;
  p.activation = act.value();
  p.gated = gated;
  p.rows = dy.dimensions()[0];
  p.cols = dy.dimensions()[1];
  p.dy = dy.untyped_data();
  p.x = x.untyped_data();
  p.bias = static_cast<const float*>(data_or_null(bias));
  p.dx = dx->untyped_data();
  p.dbias_partial = static_cast<float*>(data_or_null(*dbias_partial));
  if (p.bias && (gated || bias.element_count() != size_t(p.cols)))
    return invalid("activation backward: bias must have cols elements (and no gating)");
  if (p.dbias_partial) {
    const auto part = dbias_partial->dimensions();
    if (gated || part.size() != 2 || part[1] != p.cols || part[0] < 1)
      return invalid("activation backward: dbias partials must be [num_partials >= 1, cols]");
    p.num_partials = part[0];
  }
  return p;
}

// The argument list shared by the CPU and CUDA handlers; `b` carries what
// comes first (the thread pool on CPU, the stream on CUDA).
template <typename Binding>
auto fwd_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // x
      .template Arg<ffi::Buffer<ffi::F32>>()   // bias (empty: none)
      .template Ret<ffi::AnyBuffer>()          // y
      .template Attr<int32_t>("activation")    // Activation code (contract/activations.h)
      .template Attr<bool>("gated");
}

template <typename Binding>
auto bwd_binding(Binding b) {
  return std::move(b)
      .template Arg<ffi::AnyBuffer>()          // dy
      .template Arg<ffi::AnyBuffer>()          // x
      .template Arg<ffi::Buffer<ffi::F32>>()   // bias (empty: none)
      .template Ret<ffi::AnyBuffer>()          // dx
      .template Ret<ffi::Buffer<ffi::F32>>()   // dbias partial sums (empty: not wanted)
      .template Attr<int32_t>("activation")
      .template Attr<bool>("gated");
}

ffi::Error fwd_cpu_impl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> bias,
                        ffi::Result<ffi::AnyBuffer> y, int32_t activation, bool gated) {
  auto p = fwd_params(x, bias, y, activation, gated);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  activation_fwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

ffi::Error bwd_cpu_impl(ffi::ThreadPool pool, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                        ffi::Buffer<ffi::F32> bias, ffi::Result<ffi::AnyBuffer> dx,
                        ffi::Result<ffi::Buffer<ffi::F32>> dbias_partial, int32_t activation,
                        bool gated) {
  auto p = bwd_params(dy, x, bias, dx, dbias_partial, activation, gated);
  if (p.has_error()) return p.error();
  FfiTaskRunner runner(pool);
  activation_bwd_cpu(p.value(), &runner);
  return ffi::Error::Success();
}

#ifdef JAXCRAFT_WITH_CUDA
ffi::Error fwd_cuda_impl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> bias,
                         ffi::Result<ffi::AnyBuffer> y, int32_t activation, bool gated) {
  auto p = fwd_params(x, bias, y, activation, gated);
  if (p.has_error()) return p.error();
  return cuda_error(launch_activation_fwd(p.value(), stream), "activation forward launch");
}

ffi::Error bwd_cuda_impl(cudaStream_t stream, ffi::AnyBuffer dy, ffi::AnyBuffer x,
                         ffi::Buffer<ffi::F32> bias, ffi::Result<ffi::AnyBuffer> dx,
                         ffi::Result<ffi::Buffer<ffi::F32>> dbias_partial, int32_t activation,
                         bool gated) {
  auto p = bwd_params(dy, x, bias, dx, dbias_partial, activation, gated);
  if (p.has_error()) return p.error();
  return cuda_error(launch_activation_bwd(p.value(), stream), "activation backward launch");
}
#endif

}  // namespace
}  // namespace jaxcraft

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_activation_fwd_cpu, jaxcraft::fwd_cpu_impl,
                              jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxcraft_activation_bwd_cpu, jaxcraft::bwd_cpu_impl,
                              jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::ThreadPool>()));
#ifdef JAXCRAFT_WITH_CUDA
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_activation_fwd_cuda, jaxcraft::fwd_cuda_impl,
    jaxcraft::fwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    jaxcraft_activation_bwd_cuda, jaxcraft::bwd_cuda_impl,
    jaxcraft::bwd_binding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
    {ffi::Traits::kCmdBufferCompatible});
#endif
